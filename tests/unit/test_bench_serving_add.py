"""``feather-bench-serving --add``: a later run's configurations join an earlier comparison."""

import json

import pytest

from feather_bench import serving

HOST = {
    "cpu": "CPU",
    "cores": 2,
    "arch": "x86_64",
    "gpu": False,
    "bf16_instructions": False,
    "amx": False,
    "python": "3.11.7",
    "versions": {"sglang": "0.5.23", "torch": "2"},
}


def _row(config, tok_s, date="2026-01-02T00:00:00+00:00"):
    policy, backend = config.split("+")
    return {
        "config": config,
        "policy": policy,
        "attention_backend": backend,
        "date": date,
        "output_throughput": tok_s,
        "p99_ttft_ms": 1000.0,
        "outputs_differing_from_first_config": 3,
        "server_args": ["--attention-backend", backend],
    }


def _earlier(tmp_path, **overrides):
    result = {
        "workload": "memory-bound",
        "model": "m",
        "seed": 1,
        "bench_serving_args": ["--num-prompts", "8"],
        "date": "2026-01-02T00:00:00+00:00",
        "git": {"commit": "a" * 40},
        "machine": HOST,
        "rows": [_row("dfs-weight+feather", 10.0), _row("feather+feather", 12.0)],
    }
    result.update(overrides)
    path = tmp_path / "memory-bound.json"
    path.write_text(json.dumps(result))
    return path, result


def test_add_keeps_the_configurations_this_run_does_not_repeat(tmp_path):
    path, old = _earlier(tmp_path)
    now = {k: old[k] for k in ("model", "seed", "bench_serving_args")}
    kept = serving.earlier_rows(
        path, now, {"feather+feather", "dfs-weight+torch_native"}, machine=HOST
    )
    assert [r["config"] for r in kept] == ["dfs-weight+feather"]
    assert kept[0]["git"]["commit"] == "a" * 40 and kept[0]["date"].startswith("2026-01-02")
    new = _row("feather+feather", 13.0, date="2026-01-03T00:00:00+00:00")
    new["generated_texts"] = ["x"]
    rows = kept + [new]
    serving.summarize(rows)
    assert rows[1]["vs_best_stock_same_backend"] == pytest.approx(1.3)
    assert rows[0]["outputs_differing_from_first_config"] == 3  # what its own run found


def test_add_compares_new_outputs_with_the_kept_first_configurations_jsonl(tmp_path):
    path, old = _earlier(tmp_path)
    jsonl = tmp_path / "memory-bound.dfs-weight+feather.jsonl"
    jsonl.write_text(json.dumps({"generated_texts": ["a", "b", "c"]}) + "\n")
    now = {k: old[k] for k in ("model", "seed", "bench_serving_args")}
    kept = serving.earlier_rows(path, now, {"feather+feather"}, machine=HOST)
    kept[0]["jsonl"] = str(jsonl)
    new = _row("feather+feather", 13.0)
    new["generated_texts"] = ["a", "x", "c"]
    rows = kept + [new]
    serving.summarize(rows)
    assert rows[1]["outputs_differing_from_first_config"] == 1
    jsonl.unlink()  # gone (e.g. a committed JSON without its JSONL): nothing to compare with
    new = _row("feather+feather", 13.0)
    del new["outputs_differing_from_first_config"]
    new["generated_texts"] = ["a", "x", "c"]
    rows = kept + [new]
    serving.summarize(rows)
    assert rows[1]["outputs_differing_from_first_config"] is None


def test_add_refuses_an_earlier_run_of_another_workload_shape(tmp_path):
    path, old = _earlier(tmp_path, seed=2)
    now = {"model": "m", "seed": 1, "bench_serving_args": old["bench_serving_args"]}
    with pytest.raises(SystemExit, match="seed=2"):
        serving.earlier_rows(path, now, set(), machine=HOST)


@pytest.mark.parametrize(
    "change", [{"bf16_instructions": True}, {"cores": 4}, {"versions": {"sglang": "0.5.24"}}]
)
def test_add_refuses_an_earlier_run_on_another_host(tmp_path, change):
    path, old = _earlier(tmp_path)
    now = {k: old[k] for k in ("model", "seed", "bench_serving_args")}
    key = next(iter(change))
    with pytest.raises(SystemExit, match=f"another host \\({key}="):
        serving.earlier_rows(path, now, set(), machine={**HOST, **change})
    assert serving.earlier_rows(path, now, set(), machine={**HOST, "python": "3.12.0"})


def test_the_report_names_the_rows_an_earlier_run_measured(tmp_path):
    path, old = _earlier(tmp_path)
    old["rows"][0]["git"] = old["git"]
    old["git"] = {"commit": "b" * 40}
    old["description"], old["repeats"] = "a shape", 2
    for r in old["rows"]:
        r.update(
            {k: 1.0 for k in ("median_ttft_ms", "median_tpot_ms", "p99_tpot_ms")},
            median_itl_ms=1.0,
            p99_itl_ms=1.0,
        )
    path.write_text(json.dumps(old))
    text = " ".join(serving.report(tmp_path).split())  # the prose is wrapped
    assert "dfs-weight+feather: an earlier run (`--add`), 2026-01-02, commit `aaaaaaaaaa`" in text
    assert "feather+feather: an earlier run" not in text
    old["rows"][0]["git"], old["rows"][0]["date"] = old["git"], old["date"]  # same day and commit
    path.write_text(json.dumps(old))
    assert "an earlier run" not in serving.report(tmp_path)


def test_the_report_says_how_many_runs_each_row_is_the_median_of():
    rows = [{"config": "a", "runs": 2}, {"config": "b", "runs": 2}, {"config": "c", "runs": 1}]
    assert serving.runs_of({"repeats": 1, "rows": rows}) == "medians of 2 runs per server (1 for c)"
    assert serving.runs_of({"repeats": 2, "rows": rows[:2]}) == "medians of 2 runs per server"
    # rows of 2 runs that took turns, beside one of a single run added later
    turns = [{**r, "interleaved": r["runs"] == 2} for r in rows]
    assert serving.runs_of({"repeats": 1, "rows": turns}) == (
        "medians of 2 runs, configurations taking turns, a server per run (1 for c)"
    )
    # as many rows of one run as of two: the rows of two set the sentence
    even = [*turns, {"config": "d", "runs": 1}]
    assert serving.runs_of({"repeats": 1, "rows": even}).startswith("medians of 2 runs, config")
    assert serving.runs_of({"repeats": 1, "rows": rows[2:]}) == "one run per server"
