"""What the A/B tool shows a person: the table, the summary ratios, the chart, the greedy check."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from feather_bench.ab.metrics import COLUMNS
from feather_bench.ab.runner import DEFAULT_BACKEND
from feather_bench.tools.machine import cpu_label
from feather_bench.tools.workload import Output, compare_greedy


def check_greedy(outputs: dict) -> list[str]:
    """Every configuration's greedy tokens against the first configuration's (near-ties allowed,
    see ``tools.workload.compare_greedy``); returns the mismatches, [] when all agree."""
    configs = list(outputs)
    if len(configs) < 2:
        return []

    def as_outputs(records):
        return {rid: Output(rid, "", r.output_ids, r.top2) for rid, r in records.items()}

    ref = as_outputs(outputs[configs[0]])
    problems = []
    for c in configs[1:]:
        problems += [
            f"{c.name} vs {configs[0].name}: {p}"
            for p in compare_greedy(ref, as_outputs(outputs[c]))
        ]
    return problems


def _row(rows, policy, backend) -> Optional[dict]:
    hits = [r for r in rows if r["policy"] == policy and r["attention_backend"] == backend]
    return max(hits, key=lambda r: r["output_throughput"]) if hits else None


def summary(rows: list[dict], baseline_policies) -> dict:
    """Feather's best configuration against the best of SGLang's own policies on the baseline
    backend (torch_native, SGLang's CPU backend, or on an accelerator SGLang's own default,
    where it was run), plus the ratios that separate policy from backend."""
    backends = [r["attention_backend"] for r in rows]
    base_backend = next(
        (b for b in ("torch_native", DEFAULT_BACKEND) if b in backends), backends[0]
    )
    baselines = [
        r
        for r in rows
        if r["policy"] in baseline_policies and r["attention_backend"] == base_backend
    ]
    feathers = [r for r in rows if r["policy"] == "feather"]
    out: dict = {"baseline_backend": base_backend}
    if not baselines or not feathers:
        return {**out, "speedup_vs_best_baseline": None, "best_baseline": None}
    best = max(baselines, key=lambda r: r["output_throughput"])
    top = max(feathers, key=lambda r: r["output_throughput"])
    out.update(
        best_baseline=best["config"],
        best_feather=top["config"],
        speedup_vs_best_baseline=top["output_throughput"] / best["output_throughput"],
    )
    # What a faster attention backend could still give feather's best: its time with every
    # second of attention removed (the rest, matmuls and runtime, no attention kernel changes).
    if top.get("attention_s") and top["duration"] > top["attention_s"]:
        rest = top["duration"] - top["attention_s"]
        out["attention_fraction_of_best_feather"] = top["attention_fraction"]
        out["speedup_bound_if_attention_were_free"] = (
            top["total_output_tokens"] / rest / best["output_throughput"]
        )
    # the policy alone: feather vs the best baseline policy on the same attention backend
    same = [
        r
        for r in rows
        if r["policy"] in baseline_policies and r["attention_backend"] == top["attention_backend"]
    ]
    if same:
        b = max(same, key=lambda r: r["output_throughput"])
        out["policy_speedup_same_backend"] = top["output_throughput"] / b["output_throughput"]
        out["policy_speedup_same_backend_vs"] = b["config"]
    fcfs = _row(rows, "fcfs", top["attention_backend"])
    if fcfs:
        out["output_throughput_vs_fcfs_same_backend"] = (
            top["output_throughput"] / fcfs["output_throughput"]
        )
        out["ttft_p99_vs_fcfs_same_backend"] = top["p99_ttft_ms"] / fcfs["p99_ttft_ms"]
    fcfs_base = _row(rows, "fcfs", base_backend)
    if fcfs_base:
        out["ttft_p99_vs_fcfs_" + base_backend] = top["p99_ttft_ms"] / fcfs_base["p99_ttft_ms"]
    return out


def summary_text(s: dict) -> str:
    if s.get("speedup_vs_best_baseline") is None:
        return "summary: needs feather and at least one of fcfs/lpm/dfs-weight to compare"
    lines = [
        f"feather's best ({s['best_feather']}) vs the best baseline ({s['best_baseline']}): "
        f"{s['speedup_vs_best_baseline']:.2f}x output throughput"
    ]
    if "speedup_bound_if_attention_were_free" in s:
        lines.append(
            f"attention is {s['attention_fraction_of_best_feather']:.1%} of its step time; with attention "
            f"free it would be {s['speedup_bound_if_attention_were_free']:.2f}x"
        )
    if "policy_speedup_same_backend" in s:
        lines.append(
            f"policy alone, same backend (vs {s['policy_speedup_same_backend_vs']}): "
            f"{s['policy_speedup_same_backend']:.2f}x"
        )
    if "ttft_p99_vs_fcfs_same_backend" in s:
        lines.append(
            f"vs fcfs on the same backend: {s['output_throughput_vs_fcfs_same_backend']:.2f}x throughput, "
            f"TTFT p99 {s['ttft_p99_vs_fcfs_same_backend']:.2f}x"
        )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    headers = ["configuration"] + [h for _, h, _ in COLUMNS]
    body = [[r["config"]] + [fmt.format(r[k]) for k, _, fmt in COLUMNS] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(headers, *body)]

    def line(cells):
        return "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, body)])


def _bar_label(v: float) -> str:
    """Two significant digits, never an exponent (165.3 -> "165", 7.2 -> "7.2")."""
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.2g}"


def chart(result: dict, path: Path) -> None:
    """Three panels a person reads at a glance: output throughput, TTFT p99, batch homogeneity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = [r["config"].replace(" + ", "\n+ ") for r in rows]
    colours = ["#d95f02" if r["policy"] == "feather" else "#7570b3" for r in rows]
    panels = [
        ("output_throughput", "output tokens/s (higher is better)"),
        ("p99_ttft_ms", "TTFT p99, ms (lower is better)"),
        ("mean_groups_per_decode", "prefix groups per decode step (lower: more homogeneous)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 5.0))
    for ax, (key, title) in zip(axes, panels):
        vals = [r[key] for r in rows]
        bars = ax.bar(range(len(rows)), vals, color=colours)
        ax.set_xticks(
            range(len(rows)), names, fontsize=7, rotation=40, ha="right", rotation_mode="anchor"
        )
        ax.set_title(title, fontsize=9)
        ax.bar_label(bars, fmt=_bar_label, fontsize=7)
    w, m = result["workload"], result["machine"]
    s = result["summary"]
    head = (
        f"feather-ab: {w['name']} ({w['requests']} requests, {w['prompt_tokens']} prompt tokens), "
        f"{result['common']['model']}, {result['common']['mode']}"
    )
    if s.get("speedup_vs_best_baseline"):
        head += f" - feather {s['speedup_vs_best_baseline']:.2f}x the best baseline"
    fig.suptitle(head + f"\n{cpu_label(m)}, {m['cores']} cores, {result['date'][:10]}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
