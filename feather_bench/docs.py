"""``python -m feather_bench.docs``: the generated parts of the docs, from the code and the JSON.

- README.md's options table and each option's help below it, from
  :class:`feather_sglang.config.FeatherConfig` (between the ``<!-- options -->`` markers);
- docs/results.md, from every result JSON under ``results/`` (each records its command,
  machine, versions, date and commit).

``--check`` changes nothing and exits 1 if either is out of date (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from feather_bench.tools.machine import cpu_label, short_commit
from feather_bench.tools.markdown import command_block, command_item, option_groups, wrap

REPO = Path()  # the repository's root: run from there
BEGIN, END = "<!-- options -->", "<!-- /options -->"


def options_markdown() -> str:
    """A short table (option, ``Engine`` keyword, default), then each option's help."""
    from feather_sglang.config import FeatherConfig

    defaults = FeatherConfig()
    options = FeatherConfig.options()
    lines = ["| option | `Engine` keyword | default |", "|---|---|---|"]
    for flag, field in options:
        lines.append(f"| `{flag}` | `feather_{field.name}` | `{getattr(defaults, field.name)}` |")
    lines.append("")
    for flag, field in options:
        lines.append(wrap(f"- `{flag}`: {field.metadata['help']}", indent="  "))
    return "\n".join(lines)


def readme_with_options(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{options_markdown()}\n{END}{tail}"


def _ab_section(paths: list[Path]) -> list[str]:
    lines = [
        "## feather-ab: every policy x attention backend on one workload",
        "",
        wrap(
            "Each row one `feather-ab` run (medians where `--repeats` > 1), one table per machine, "
            "the commands numbered below the tables; speed-up = the best feather configuration's "
            "output tok/s over the best baseline's (SGLang's policies on torch_native); policy = "
            "feather over the best stock policy on the same backend."
        ),
    ]
    by_machine: dict[str, list[str]] = {}
    commands = []
    for p in paths:
        d = json.loads(p.read_text())
        s = d.get("summary", {})
        if s.get("speedup_vs_best_baseline") is None:
            continue
        same = (
            "identical"
            if d.get("greedy_outputs_identical")
            else f"{len(d.get('greedy_mismatches') or [])} differ"
        )
        policy = s.get("policy_speedup_same_backend")
        policy = (
            "-"
            if policy is None
            else f"{policy:.2f}x vs {s.get('policy_speedup_same_backend_vs', '?')}"
        )
        commands.append(d.get("command", "?"))
        by_machine.setdefault(cpu_label(d["machine"]), []).append(
            f"| `{p.relative_to(REPO)}` | [{len(commands)}] | {str(d.get('date', '?'))[:10]} | "
            f"{s['speedup_vs_best_baseline']:.2f}x ({s.get('best_feather')} vs "
            f"{s.get('best_baseline')}) | {policy} | {same} |"
        )
    for machine, rows in by_machine.items():
        lines += [
            "",
            f"On {machine}:",
            "",
            "| file | command | date | best feather vs best baseline | policy alone | "
            "greedy outputs |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    lines += ["", "Commands:", ""]
    lines += [command_item(f"{i}.", c) for i, c in enumerate(commands, 1)]
    return lines


def _scale_section(path: Path) -> list[str]:
    d = json.loads(path.read_text())
    prov, m = d["provenance"], d["provenance"]["machine"]
    lines = [
        "## Scheduling cost at scale: `feather-bench-scale`",
        "",
        *command_block(prov["command"]),
        "",
        wrap(
            f"{cpu_label(m)}, {prov['date'][:10]}, commit "
            f"`{short_commit(prov.get('git'))}`; batch {d['settings']['batch']}. "
            "The times are feather's own part of each pass, then the whole `calc_priority` call, "
            "which adds SGLang's own per-pass work, the same under fcfs: every 32nd pass "
            "refreshes the LRU recency of the first 128 waiting prefixes."
        ),
        "",
        "| waiting | scenario | prompt tokens | feather p50 us | feather p99 us | pass p50 us | pass p99 us | "
        "O(W) reindexes | CHT bytes per prompt token | feather's bytes per prompt token |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in d["rows"]:
        lines.append(
            f"| {r['waiting']:,} | {r['scenario']} | {r['prompt_tokens']:,} | {r['feather_p50_us']:,.1f} | "
            f"{r['feather_p99_us']:,.1f} | {r['p50_us']:,.1f} | {r['p99_us']:,.1f} | {r['reindexes']} | "
            f"{r['cht_bytes_per_prompt_token']:.2f} | {r.get('feather_bytes_per_prompt_token', '-')} |"
        )
    return lines


def _split_server_args(args: list[str]) -> tuple[str, str]:
    """A row's server arguments: (the others, the ``--feather-*`` flags), each flag with its
    values."""
    groups = option_groups(" ".join(args))
    return (
        " ".join(g for g in groups if not g.startswith("--feather-")),
        " ".join(g for g in groups if g.startswith("--feather-")),
    )


def _changed_flags(result: dict) -> str:
    """The bench_serving flags a run gave beyond or instead of its workload's, as a suffix."""
    from feather_bench.serving import WORKLOADS

    own = set(option_groups(" ".join(WORKLOADS[result["workload"]][1])))
    changed = [f for f in option_groups(" ".join(result["bench_serving_args"])) if f not in own]
    return f"; with `{' '.join(changed)}`" if changed else ""


def _options_section(topic: Path) -> list[str]:
    """Values of feather's options: ``feather-bench-serving --feather-args`` runs, each into a
    folder of its own under ``topic``; per workload, medians over the folders."""
    results = [
        r for p in sorted(topic.rglob("*.json")) if isinstance(r := json.loads(p.read_text()), dict)
    ]
    lines = [f"## feather's options on a real server (`{topic.relative_to(REPO)}`)"]
    keys = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "prefill_tokens")
    for workload in sorted({r["workload"] for r in results}):
        ours = sorted((r for r in results if r["workload"] == workload), key=lambda r: r["date"])
        first, m = ours[0], ours[0]["machine"]
        groups: dict[tuple, list[dict]] = {}
        for r in ours:
            for row in r["rows"]:
                flags = _split_server_args(row["server_args"])[1]
                groups.setdefault((row["config"], flags), []).append(row)
        order = [_split_server_args(r["rows"][0]["server_args"])[1] for r in ours]
        turns = "taking turns" if all(a != b for a, b in zip(order, order[1:])) else "in sequence"
        table = [
            "| config | feather flags | output tok/s (runs) | vs defaults | TTFT p50 / p99 ms "
            "| p99 TTFT vs defaults | prefill tokens |",
            "|---|---|---|---|---|---|---|",
        ]
        base = {}
        for (config, flags), rows in sorted(groups.items()):  # the defaults ("") first
            runs = sorted(x for row in rows for x in row["output_throughput_runs"])
            med = {k: statistics.median(row[k] for row in rows) for k in keys}
            ref = base.setdefault(config, med) if not flags else base.get(config)
            ratio = (lambda k: f"{med[k] / ref[k]:.2f}x") if ref else (lambda k: "-")
            label = f"`{flags}`" if flags else "defaults"
            table.append(
                f"| {config} | {label} | {med['output_throughput']:.1f} "
                f"({', '.join(f'{x:.1f}' for x in runs)}) | {ratio('output_throughput')} | "
                f"{med['median_ttft_ms']:.0f} / {med['p99_ttft_ms']:.0f} | "
                f"{ratio('p99_ttft_ms')} | {med['prefill_tokens']:,.0f} |"
            )
        commits = sorted({short_commit(r["git"]) for r in ours})
        dates = sorted({r["date"][:10] for r in ours})
        server = _split_server_args(first["rows"][0]["server_args"])[0]
        lines += [
            "",
            f"### {workload}: {first['description']}{_changed_flags(first)}",
            "",
            *command_block(
                f"python -m sglang.bench_serving {' '.join(first['bench_serving_args'])} "
                f"--seed {first['seed']} --flush-cache --warmup-requests 1"
            ),
            "",
            wrap(
                f"Servers: `--schedule-policy {first['rows'][0]['policy']} {server}` and each "
                f"row's feather flags; {len(order)} servers, one after another, {turns}, each "
                f"running bench_serving {first['repeats']} time(s). {cpu_label(m)}, "
                f"{m['cores']} cores, sglang {m['versions']['sglang']}, {', '.join(dates)}, "
                f"commit {', '.join(f'`{c}`' for c in commits)}."
            ),
            "",
            *table,
        ]
    return lines


def _provenance(d: dict) -> tuple[list[str], str]:
    """The command that wrote ``d``, as a fenced block, and where and when it ran."""
    prov, m = d["provenance"], d["provenance"]["machine"]
    commit = short_commit(prov.get("git"))
    where = f"{cpu_label(m)}, {m.get('cores')} cores, {prov['date'][:10]}, commit `{commit}`"
    return command_block(prov["command"]), where


def _dp_section(path: Path) -> list[str]:
    return _workers_section(
        path, "## Data-parallel workers: `feather-bench-dp`", "--load-balance-method", "method"
    )


def _router_section(path: Path) -> list[str]:
    router = json.loads(path.read_text()).get("router", "sglang-router")
    return _workers_section(
        path,
        f"## Separate servers behind {router}: `feather-bench-router`",
        f"{router} --policy",
        "policy",
        "each worker's requests and prompt tokens computed from its own log",
    )


def _workers_section(
    path: Path,
    title: str,
    column: str,
    key: str,
    counted: str = "each worker's requests and prompt tokens computed from the server log",
) -> list[str]:
    d = json.loads(path.read_text())
    command, where = _provenance(d)
    client = " ".join(d["bench_serving_args"])
    lines = [
        title,
        "",
        *command,
        "",
        wrap(
            f"{where}. Medians of {d['settings']['repeats']} runs of the client below; "
            f"{counted}."
        ),
        "",
        *command_block(
            f"python -m sglang.bench_serving {client} --seed {d['settings']['seed']} --flush-cache"
        ),
        "",
        f"| {column} | output tok/s | vs round robin | median TTFT ms | median TPOT ms | "
        "requests per worker | spread | prompt tokens computed per worker |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in d["rows"]:
        ratio = "-" if r.get("vs_round_robin") is None else f"{r['vs_round_robin']:.2f}x"
        lines.append(
            f"| {r[key]} | {r['output_throughput']:.1f} | {ratio} | {r['median_ttft_ms']:,.0f} | "
            f"{r['median_tpot_ms']:,.0f} | {' / '.join(str(w['requests']) for w in r['workers'])} | "
            f"{r['request_spread']:.0%} | {' / '.join(format(w['new_tokens'], ',') for w in r['workers'])} |"
        )
    return lines


def _storm_section(path: Path) -> list[str]:
    d = json.loads(path.read_text())
    summary = d["summary"]
    command, where = _provenance(d)
    lines = [
        "## Abort storm on a live server: `feather-bench-abort-storm`",
        "",
        *command,
        "",
        wrap(
            f"{where}; {d['settings']['requests']:,} requests a cycle, "
            f"{d['settings']['disconnect']:.0%} of clients giving up, "
            f"{d['settings']['reuse']:.0%} reused rids, "
            f"--max-queued-requests {d['settings']['max_queued_requests']}."
        ),
        "",
        "| cycle | seconds | answered 200 | turned away (503) | gave up | other | "
        "feather tracks after (requests, CHT nodes) | scheduler RSS MB | outside large mappings MB |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in d["rows"]:
        o = r["outcomes"]
        other = sum(v for k, v in o.items() if k not in ("200", "503", "disconnected"))
        lines.append(
            f"| {r['cycle']} | {r['seconds']:.0f} | {o.get('200', 0)} | {o.get('503', 0)} | "
            f"{o.get('disconnected', 0)} | {other} | {tuple(r['idle_tracked'] or ())} | "
            f"{r['scheduler_rss_mb']:,.0f} | {_mb(r.get('scheduler_small_rss_mb'))} |"
        )
    lines += [
        "",
        wrap(
            f"Scheduler memory grew {summary['scheduler_rss_growth_mb']} MB from the first cycle "
            f"to the last ({summary['scheduler_rss_growth_from_start_mb']} MB from start-up)"
            + _small_growth(summary)
            + f"; failed checks: {', '.join(summary['failures']) or 'none'}."
        ),
    ]
    baseline = path.with_name(path.stem + "_fcfs.json")
    if baseline.exists():
        b = json.loads(baseline.read_text())
        rss = " / ".join(f"{r['scheduler_rss_mb']:,.0f}" for r in b["rows"])
        lines += [
            "",
            wrap(
                f"The same storm against a stock `--schedule-policy fcfs` server "
                f"(`{baseline.relative_to(REPO)}`, {_provenance(b)[1]}): scheduler memory grew "
                f"{b['summary']['scheduler_rss_growth_mb']} MB from the first cycle to the last "
                f"({b['summary']['scheduler_rss_growth_from_start_mb']} MB from start-up)"
                + _small_growth(b["summary"])
                + f"; RSS MB after each cycle: {rss}."
            ),
        ]
    return lines


def _gpu_attention_section(path: Path) -> list[str]:
    d = json.loads(path.read_text())
    m, summary = d["machine"], d["summary"]
    git = m.get("git") or {}
    commit = short_commit(git)
    changed = [f for f in git.get("modified") or [] if not f.startswith(".")]
    if changed:
        commit += f" + changes to {len(changed)} files"
    v = m["versions"]
    lines = [
        "## Decode attention on a GPU: `make gpu-check`",
        "",
        "```",
        "bash scripts/gpu_check.sh        # its benchmark step:",
        m.get("command", "python -m feather_bench.attention_gpu"),
        "```",
        "",
        wrap(
            f"{m['gpu_name']}, CUDA {m['cuda']}, torch {v['torch']}, Triton {v['triton']}, "
            f"{m['date'][:10]}, commit `{commit}`. One layer's decode step: B requests sharing a "
            f"P-token prefix plus {d['rows'][0]['suffix']} own tokens each; feather's fused "
            f"kernel against SGLang's Triton decode kernel ({_kernel_source(m['kernels']['sglang'])}"
            ", called as its backend calls it). Both matched the torch reference in "
            f"{min(summary['checked']['feather'], summary['checked']['sglang'])} of "
            f"{len(d['rows'])} cells before being timed. Times in microseconds: `do_bench` "
            "medians, host launches included (as a server without CUDA graphs pays them; at "
            "these sizes mostly launch cost, which varies from run to run), and CUDA-graph "
            "replays (the GPU's time alone). Speedup: SGLang's time / feather's."
        ),
        "",
        "| shape | dtype | B | P | feather us | SGLang us | speedup | feather us, graph | "
        "SGLang us, graph | speedup, graph |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def us(r, key):
        return f"{r[key] * 1e3:,.1f}" if key in r else "-"

    def x(r, key):
        return f"{r[key]:.2f}x" if key in r else "-"

    for r in d["rows"]:
        lines.append(
            f"| {r['shape']} ({r['Hq']}/{r['Hkv']} heads of {r['D']}) | {r['dtype']} | {r['B']} | "
            f"{r['P']:,} | {us(r, 'feather_ms')} | {us(r, 'sglang_ms')} | "
            f"{x(r, 'speedup_vs_sglang')} | {us(r, 'feather_graph_ms')} | "
            f"{us(r, 'sglang_graph_ms')} | {x(r, 'graph_speedup_vs_sglang')} |"
        )
    if summary.get("median_graph_speedup_vs_sglang") is not None:
        lines += [
            "",
            wrap(
                f"Over the {summary['cells_timed_graph_vs_sglang']} cells, CUDA-graph speedup: "
                f"median {summary['median_graph_speedup_vs_sglang']:.2f}x, least "
                f"{summary['min_graph_speedup_vs_sglang']:.2f}x; with host launches: median "
                f"{summary['median_speedup_vs_sglang']:.2f}x, least "
                f"{summary['min_speedup_vs_sglang']:.2f}x."
            ),
        ]
    return lines


def _kernel_source(how: str) -> str:
    """Where the benchmark took SGLang's kernel from, as recorded, in a reader's words."""
    digest = re.search(r"decode_attention\.py sha256 (\w+)", how or "")
    if how and how.startswith("source files") and digest:
        return f"loaded from SGLang's source files, `decode_attention.py` sha256 {digest[1]}"
    return how or "?"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _small_growth(summary: dict) -> str:
    """The growth outside the large mappings (the KV pool's, the weights'), where recorded."""
    if summary.get("scheduler_small_rss_growth_mb") is None:
        return ""
    return (
        f", {summary['scheduler_small_rss_growth_mb']} MB of it outside mappings of "
        f"{summary['large_mapping_bytes'] >> 20} MiB or more (the KV pool's pages become resident "
        "as requests first write them)"
    )


def results_markdown() -> str:
    from feather_bench import serving
    from feather_rl.evaluate import serving_markdown

    parts = [
        "# Results",
        "",
        wrap(
            "Generated by `python -m feather_bench.docs` from the JSON under `results/`; every "
            "table names the command that wrote it, the machine and the date. How each benchmark "
            "measures: [benchmarks.md](benchmarks.md)."
        ),
        "",
    ]
    bench_dir = REPO / "results" / "bench_serving"
    if any(bench_dir.glob("*.json")):
        body = serving.report(bench_dir).split("\n", 1)[1]  # without the page's own title
        parts += [
            "## SGLang's own client: `make bench-serving`",
            "",
            body.replace("\n## ", "\n### "),
        ]
    for host in sorted(p for p in (bench_dir / "hosts").glob("*") if p.is_dir()):
        if any(host.glob("*.json")):
            body = serving.report(host)
            parts += [
                f"## SGLang's own client on another host (`{host.relative_to(REPO)}`)",
                "",
                wrap(
                    "The same method as above, run with `--out-dir` naming this folder, on a host "
                    "whose speed differs: the ratios show how the policies compare there."
                ),
                body[body.index("\n## Summary") :].replace("\n## ", "\n### "),
            ]
    for topic in sorted(p for p in (bench_dir / "options").glob("*") if p.is_dir()):
        parts += _options_section(topic) + [""]
    rl = REPO / "results" / "rl" / "eval_serving.json"
    if rl.exists():
        parts += [
            "## The stop/add decision: `feather-eval` in the simulated server",
            "",
            serving_markdown(json.loads(rl.read_text()), str(rl.relative_to(REPO))),
            "",
        ]
    gpu = REPO / "results" / "gpu" / "bench_attention_gpu.json"
    if gpu.exists():
        parts += _gpu_attention_section(gpu) + [""]
    scale = REPO / "results" / "scale" / "scale.json"
    if scale.exists():
        parts += _scale_section(scale) + [""]
    for path, section in (
        (REPO / "results" / "dp" / "dp.json", _dp_section),
        *((p, _router_section) for p in sorted((REPO / "results" / "router").glob("*.json"))),
        (REPO / "results" / "reliability" / "abort_storm.json", _storm_section),
    ):
        if path.exists():
            parts += section(path) + [""]
    ab = sorted((REPO / "results" / "ab").rglob("*.json"))
    if ab:
        parts += _ab_section(ab) + [""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m feather_bench.docs", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if README.md or docs/results.md is out of date"
    )
    args = ap.parse_args(argv)
    targets = {
        REPO / "README.md": readme_with_options((REPO / "README.md").read_text()),
        REPO / "docs" / "results.md": results_markdown(),
    }
    stale = [p for p, text in targets.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(
                f"{p.relative_to(REPO)} is out of date: run python -m feather_bench.docs",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for p in stale:
        p.write_text(targets[p])
        print(f"wrote {p.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
