"""feather-ab's bench_serving conventions without a server: flag names and their aliases, the
serving metrics against sglang.bench_serving's own calculate_metrics on the same requests, the
per-worker figures, the streamed timings, --base-url's refusals and the host-dependent
defaults."""

from __future__ import annotations

import asyncio
import math

import pytest

from feather_bench.ab import cli, datasets
from feather_bench.ab.client import RequestRecord, drive
from feather_bench.ab.metrics import serving_metrics, worker_metrics
from feather_bench.ab.runner import DEFAULT_BACKEND, ABConfig
from feather_bench.workloads import Workload, WorkloadRequest
from tests.conftest import TINY_MODEL


def test_old_flags_are_aliases_of_bench_servings_names():
    old = cli.parse_args(
        ["--workload", "gsp", "--gsp-groups", "3", "--gsp-prefix-len", "100", "--json", "o.json"]
    )
    new = cli.parse_args(
        [
            "--workload",
            "gsp",
            "--gsp-num-groups",
            "3",
            "--gsp-system-prompt-len",
            "100",
            "--output-file",
            "o.json",
        ]
    )
    assert vars(old) == vars(new)
    assert (old.gsp_num_groups, old.gsp_system_prompt_len, old.output_file) == (3, 100, "o.json")


def test_gsp_defaults_are_bench_servings_with_dataset_name_and_feathers_with_workload():
    args = cli.parse_args(["--dataset-name", "generated-shared-prefix", "--gsp-output-len", "8"])
    ns = datasets.bench_serving_namespace(args)
    assert (ns.gsp_num_groups, ns.gsp_prompts_per_group, ns.gsp_system_prompt_len) == (
        64,
        16,
        2048,
    )
    assert (ns.gsp_question_len, ns.gsp_output_len, ns.gsp_ordered) == (128, 8, False)
    args = cli.parse_args(["--workload", "gsp", "--gsp-output-len", "8"])
    assert datasets.resolve_gsp(args, datasets.FEATHER_GSP_DEFAULTS) == {
        "gsp_num_groups": 4,
        "gsp_prompts_per_group": 8,
        "gsp_system_prompt_len": 512,
        "gsp_question_len": 32,
        "gsp_output_len": 8,
    }


def record(rid, ttft, e2e, n_out, itl, prompt=100, dp_rank=None):
    return RequestRecord(rid, prompt, 0, list(range(n_out)), [], 0.0, ttft, e2e, itl, dp_rank)


def test_serving_metrics_equal_bench_servings_calculate_metrics():
    from sglang.benchmark.datasets import DatasetRow
    from sglang.benchmark.serving import RequestFuncOutput, calculate_metrics

    records = [
        record("a", 0.5, 2.0, 4, [0.5, 0.5, 0.5]),
        record("b", 1.0, 1.6, 3, [0.2, 0.4], prompt=50),
        record("c", 0.3, 0.3, 1, [], prompt=10),  # one token: no TPOT, no ITL
    ]
    outputs = [
        RequestFuncOutput(
            success=True,
            latency=r.e2e_s,
            ttft=r.ttft_s,
            itl=r.itl_s,
            output_len=len(r.output_ids),
            prompt_len=r.prompt_tokens,
        )
        for r in records
    ]
    rows = [DatasetRow("p", r.prompt_tokens, len(r.output_ids)) for r in records]

    class NoTokenizer:
        def encode(self, text, add_special_tokens=False):
            return []

    theirs, _ = calculate_metrics(rows, outputs, 4.0, NoTokenizer(), "sglang")
    ours = serving_metrics(records, 4.0)
    assert ours["completed"] == theirs.completed == 3
    assert ours["total_input_tokens"] == theirs.total_input == 160
    assert ours["total_output_tokens"] == theirs.total_output == 8
    for key, value in ours.items():
        if key in ("duration", "completed", "total_input_tokens", "total_output_tokens"):
            continue
        assert value == pytest.approx(float(getattr(theirs, key))), key
    # the units: ms for latencies, tokens/s for throughput
    assert ours["median_ttft_ms"] == 500.0 and ours["output_throughput"] == 2.0
    assert ours["mean_tpot_ms"] == pytest.approx((1500 / 3 + 600 / 2) / 2)


def test_per_worker_requests_spread_and_homogeneity():
    records = [record(f"r{i}", 0.1, 0.2, 2, [0.1], dp_rank=i % 2) for i in range(6)]
    records.append(record("r6", 0.1, 0.2, 2, [0.1], dp_rank=0))
    group_of = {f"r{i}": f"g{i % 3}" for i in range(7)}
    steps = [
        {"mode": "decode", "rids": ["r0", "r2", "r4"]},  # worker 0: groups g0, g2, g1
        {"mode": "decode", "rids": ["r1", "r3"]},  # worker 1: g1, g0
        {"mode": "extend", "rids": ["r6"]},
    ]
    w = worker_metrics(records, steps, group_of, dp_size=3)
    assert w["requests_per_worker"] == {"0": 4, "1": 3, "2": 0}
    assert w["load_spread"] == pytest.approx((4 - 0) / (7 / 3))
    per = w["per_worker_homogeneity"]
    assert per["0"]["mean_groups_per_decode"] == 3 and per["1"]["mean_groups_per_decode"] == 2
    assert per["2"]["decode_steps"] == 0 and math.isnan(per["2"]["mean_groups_per_decode"])


def test_streamed_chunks_give_ttft_and_one_itl_per_later_token():
    async def stream(req):
        for n in (0, 1, 3, 4):  # a chunk without output, then 1, then 2 tokens at once, then 1
            await asyncio.sleep(0.02)
            yield {
                "meta_info": {
                    "completion_tokens": n,
                    "prompt_tokens": 5,
                    "output_token_logprobs": [[-0.1, t] for t in range(n)],
                    "output_top_logprobs": [[[-0.1, t], [-2.0, t + 1]] for t in range(n)],
                    "dp_rank": 1,
                }
            }

    wl = Workload("w", (WorkloadRequest("x", (1, 2, 3, 4, 5), 4),), "test")
    (r,), span = asyncio.run(drive(wl, stream, "t"))
    assert r.output_ids == [0, 1, 2, 3] and r.dp_rank == 1 and r.prompt_tokens == 5
    assert len(r.itl_s) == 3 and r.itl_s[0] == r.itl_s[1]  # the 2-token chunk: two equal gaps
    assert 0.03 < r.ttft_s < r.e2e_s <= span
    assert r.ttft_s + sum(r.itl_s) == pytest.approx(r.e2e_s, abs=0.01)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--base-url", "http://127.0.0.1:1", "--policies", "fcfs", "--dtype", "float32"],
            "--policies, --dtype: these describe the servers feather-ab starts; with --base-url",
        ),
        (
            ["--base-url", "http://127.0.0.1:1", "--mode", "offline"],
            "--mode offline runs sglang.Engine in-process: drop it with --base-url",
        ),
        (["--base-url", "127.0.0.1:30000"], "--base-url must start with http:// or https://"),
        (["--base-url", "http://127.0.0.1:1"], "--base-url http://127.0.0.1:1: no SGLang server"),
        (["--flush-cache"], "--flush-cache needs --base-url"),
        (
            ["--server-args", "--dp-size 2 --schedule-policy lpm"],
            "--server-args: --schedule-policy is set by feather-ab; use feather-ab's --policies",
        ),
        (
            ["--server-args", "--dp-sizes 2"],
            "--server-args: not SGLang server flags: --dp-sizes (see",
        ),
        (["--num-prompts", "4"], "--num-prompts: used only with --dataset-name"),
        (["--backends", "cuda_magic"], "allowed: default, "),
    ],
)
def test_bad_server_options_exit_2_saying_what_is_allowed(argv, message, capsys):
    if "--base-url" not in argv:
        argv = [*argv, "--workload", "gsp"]
    else:
        argv = [*argv, "--dataset-name", "random-ids"]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dataset-name", "sharegpt"], "--dataset-name sharegpt needs --dataset-path"),
        (["--dataset-name", "random"], "or use --dataset-name random-ids, which needs none"),
        (["--dataset-name", "file", "--dataset-path", "/nowhere.jsonl"], "no file at /nowhere"),
        (["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "0"], "must be >= 1"),
        (
            ["--dataset-name", "random-ids", "--dataset-path", "x"],
            "--dataset-path is not used by --dataset-name random-ids",
        ),
    ],
)
def test_bad_dataset_options_say_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_server_args_pass_through_and_become_engine_arguments():
    args = cli.parse_args(
        [
            "--workload",
            "gsp",
            "--model",
            str(TINY_MODEL),
            "--server-args",
            "--dp-size 2 --load-balance-method prefix_group",
        ]
    )
    cli.validate(args)
    assert args.server_args_list == ["--dp-size", "2", "--load-balance-method", "prefix_group"]
    assert args.server_kwargs == {"dp_size": 2, "load_balance_method": "prefix_group"}
    assert cli.dp_size_of(args, None) == 2 and cli.dp_size_of(args, {"dp_size": 4}) == 4


def test_model_may_be_a_hub_id_and_the_defaults_follow_the_host(monkeypatch):
    args = cli.parse_args(["--workload", "gsp", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct"])
    monkeypatch.setattr(cli, "accelerator", lambda: True)
    configs, _ = cli.validate(args)
    assert args.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert args.dtype == "bfloat16" and args.backends == f"{DEFAULT_BACKEND},feather"
    assert configs[0] == ABConfig("fcfs", DEFAULT_BACKEND)
    assert "--attention-backend" not in configs[0].server_args()
    assert "attention_backend" not in configs[0].engine_kwargs()
    args = cli.parse_args(["--workload", "gsp"])
    monkeypatch.setattr(cli, "accelerator", lambda: False)
    cli.validate(args)
    assert args.dtype == "float32" and args.backends == "torch_native,feather"


def test_generated_shared_prefix_rows_are_grouped_by_their_system_prompt():
    from sglang.benchmark.datasets import DatasetRow

    from feather_bench.workloads import load_tokenizer

    tok = load_tokenizer(str(TINY_MODEL))
    sys_a, sys_b = "alpha beta gamma delta " * 8, "one two three four " * 8
    rows = [DatasetRow(p, 0, 4) for p in (sys_a + "q1", sys_b + "q2", sys_a + "q3")]
    wl = datasets.rows_to_workload(rows, tok, "generated-shared-prefix", {}, group_key=16)
    assert [r.group for r in wl.requests] == ["g0", "g1", "g0"]
    assert [r.rid for r in wl.requests] == ["g0-r0", "g1-r1", "g0-r2"]
    assert all(r.max_new_tokens == 4 for r in wl.requests)
    plain = datasets.rows_to_workload(rows, tok, "random", {})
    assert [r.group for r in plain.requests] == ["r0", "r1", "r2"]
