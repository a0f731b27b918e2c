"""Start-up refusals and settings, on SGLang's own ServerArgs (no server)."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
from sglang.srt.server_args import ServerArgs

from feather_bench.tools import trace
from feather_sglang.sglang_integration import args as args_mod
from feather_sglang.sglang_integration import refusals


def server_args(**kw) -> ServerArgs:
    return ServerArgs(model_path=kw.pop("model_path", "dummy"), device="cpu", **kw)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"pp_size": 2}, "does not support pipeline parallelism (--pp-size 2)"),
        (
            {"disaggregation_mode": "prefill"},
            "does not support PD disaggregation (--disaggregation-mode prefill)",
        ),
        ({"dllm_algorithm": "LowConfidence"}, "does not support diffusion language models"),
        (
            {"enable_priority_scheduling": True},
            "cannot be combined with --enable-priority-scheduling",
        ),
    ],
)
def test_policy_refuses_modes_it_cannot_follow(kw, message):
    problems = args_mod.startup_refusals(server_args(schedule_policy="feather", **kw))
    assert len(problems) == 1 and message in problems[0]
    assert any(what in problems[0] for what in ("allowed:", "use it with", "works with"))
    assert args_mod.startup_refusals(server_args(schedule_policy="fcfs", **kw)) == []


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"kv_cache_dtype": "fp8_e4m3"},
            "does not support --kv-cache-dtype fp8_e4m3; allowed: auto",
        ),
        ({"speculative_algorithm": "EAGLE"}, "does not support speculative decoding"),
    ],
)
def test_backend_refuses_what_it_does_not_implement(kw, message):
    problems = args_mod.startup_refusals(server_args(attention_backend="feather", **kw))
    assert len(problems) == 1 and message in problems[0]
    assert args_mod.startup_refusals(server_args(attention_backend="torch_native", **kw)) == []


def test_backend_refuses_models_with_soft_capping_or_sinks(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gemma2", "attn_logit_softcapping": 50.0})
    )
    problems = args_mod.startup_refusals(
        server_args(attention_backend="feather", model_path=str(tmp_path))
    )
    assert problems and "logit soft-capping" in problems[0]
    assert refusals.model_refusals({"model_type": "gpt_oss"})[0].endswith(
        "use SGLang's own backends for it"
    )
    assert refusals.model_refusals({"model_type": "llama"}) == []
    assert refusals.local_hf_config("org/not-a-local-dir") is None


def test_a_trace_path_that_cannot_be_written_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(trace.ENV, str(tmp_path / "missing-dir" / "trace.jsonl"))
    with pytest.raises(SystemExit) as exit_info:
        trace.register()
    assert exit_info.value.code == 2
    problem = capsys.readouterr().err
    assert problem.startswith(f"error: {trace.ENV}=") and "cannot append to it" in problem
    monkeypatch.setenv(trace.ENV, str(tmp_path / "trace.jsonl"))
    assert trace.check_path() is None


def test_cli_refusal_exits_2_with_the_reason(capsys):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args_mod.add_cli_args_after(None, parser)
    ns = parser.parse_args(
        ["--model-path", "dummy", "--schedule-policy", "feather", "--pp-size", "2"]
    )
    with pytest.raises(SystemExit) as exit_:
        args_mod.from_cli_args_after(ServerArgs.from_cli_args(ns), ServerArgs, ns)
    assert exit_.value.code == 2
    assert (
        "error: --schedule-policy feather does not support pipeline parallelism"
        in capsys.readouterr().err
    )


def test_feather_backend_turns_cuda_graphs_off_with_a_log_line(caplog):
    from sglang.srt.arg_groups.choices import (
        ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
    )

    if "feather" not in ATTENTION_BACKEND_CHOICES:  # as install_hooks does
        add_attention_backend_choices(["feather"])
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args_mod.add_cli_args_after(None, parser)
    ns = parser.parse_args(["--model-path", "dummy", "--attention-backend", "feather"])
    with caplog.at_level(logging.WARNING):
        result = args_mod.from_cli_args_after(ServerArgs.from_cli_args(ns), ServerArgs, ns)
    assert result.disable_cuda_graph is True
    assert "CUDA graphs are disabled because of --attention-backend feather" in caplog.text
    ns = parser.parse_args(["--model-path", "dummy"])
    assert (
        args_mod.from_cli_args_after(
            ServerArgs.from_cli_args(ns), ServerArgs, ns
        ).disable_cuda_graph
        is False
    )
