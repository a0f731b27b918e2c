"""Built-in workloads and workload files (feather_bench/workloads.py), on the real tokenizer."""

from __future__ import annotations

import json
import os

import pytest

from feather_bench.workloads import (
    SPECS,
    WORKLOADS,
    WorkloadError,
    build_workload,
    load_tokenizer,
    load_workload_file,
    parse_spec,
    write_workload_file,
)
from tests.conftest import TINY_MODEL


@pytest.fixture(scope="module")
def tok():
    if not (TINY_MODEL / "config.json").exists():
        pytest.fail("models/tiny-llama is missing: run `make setup`")
    return load_tokenizer(str(TINY_MODEL))


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_builtins_are_deterministic_and_seeded(tok, name):
    a, b, c = (
        build_workload(name, tok, 0),
        build_workload(name, tok, 0),
        build_workload(name, tok, 1),
    )
    assert a == b
    assert [r.input_ids for r in a.requests] != [r.input_ids for r in c.requests]
    assert len({r.rid for r in a.requests}) == len(a.requests)
    assert all(r.max_new_tokens > 0 and r.arrival_s is None for r in a.requests)


def test_gsp_groups_share_exactly_their_prefix(tok):
    w = build_workload(
        "gsp", tok, 3, groups=3, prompts_per_group=4, prefix_len=64, question_len=8, output_len=5
    )
    assert len(w.requests) == 12 and all(
        len(r.input_ids) == 72 and r.max_new_tokens == 5 for r in w.requests
    )
    assert [r.group for r in w.requests] != sorted(r.group for r in w.requests)  # shuffled
    for r in w.requests:
        for s in w.requests:
            if r is not s:
                depth = common_prefix(r.input_ids, s.input_ids)
                assert depth >= 64 if r.group == s.group else depth < 64
    ordered = build_workload(
        "gsp", tok, 3, groups=3, prompts_per_group=4, prefix_len=64, question_len=8, shuffle=False
    )
    assert [r.group for r in ordered.requests] == sorted(r.group for r in ordered.requests)


def test_batchllm_has_the_papers_sizes(tok):
    """BatchLLM's setup unscaled: shared prefix 2000, share degree 16, distinct 200."""
    w = build_workload("batchllm", tok)
    assert len(w.requests) == 64 and {r.group for r in w.requests} == {f"g{i}" for i in range(4)}
    assert all(len(r.input_ids) == 2200 and r.max_new_tokens == 16 for r in w.requests)
    by_group = {}
    for r in w.requests:
        by_group.setdefault(r.group, []).append(r.input_ids)
    assert all(len(members) == 16 for members in by_group.values())
    a, b = by_group["g0"][:2]
    assert 2000 <= common_prefix(a, b) < 2200


def test_multilevel_is_a_four_level_prefix_tree(tok):
    w = build_workload("multilevel", tok)
    p = w.params
    by = {r.rid: r for r in w.requests}
    assert len(w.requests) == p["fewshot_blocks"] * p["documents"] * p["questions"]
    system, shots, doc = (
        p["system_len"],
        p["system_len"] + p["fewshot_len"],
        p["system_len"] + p["fewshot_len"] + p["document_len"],
    )
    assert common_prefix(by["f0d0-q0"].input_ids, by["f0d0-q1"].input_ids) >= doc
    assert shots <= common_prefix(by["f0d0-q0"].input_ids, by["f0d1-q0"].input_ids) < doc
    assert system <= common_prefix(by["f0d0-q0"].input_ids, by["f1d0-q0"].input_ids) < shots


def test_no_sharing_shares_nothing_worth_caching(tok):
    w = build_workload("no-sharing", tok)
    ids = [r.input_ids for r in w.requests]
    assert max(common_prefix(a, b) for i, a in enumerate(ids) for b in ids[i + 1 :]) < 16


def test_unknown_workload_and_bad_parameters_say_what_is_allowed(tok):
    with pytest.raises(
        WorkloadError, match="unknown workload 'nope'; built-in workloads: gsp, g8x8-p2000-q24"
    ):
        build_workload("nope", tok)
    with pytest.raises(WorkloadError, match="prefix_len must be a positive integer, got 0"):
        build_workload("gsp", tok, prefix_len=0)
    with pytest.raises(WorkloadError, match="workload 'g4x16-p2000-q200'"):
        build_workload("batchllm", tok, groups=2)


def test_specs_name_parameter_sets_and_parse_with_clear_errors(tok):
    assert parse_spec("batchllm") == ("g4x16-p2000-q200", {})
    assert parse_spec("gsp:groups=8,prefix_len=400") == ("gsp", {"groups": 8, "prefix_len": 400})
    assert parse_spec("file:a/b.jsonl") == ("file", {"path": "a/b.jsonl"})
    name, params = parse_spec("feather-8x100-p400")
    assert name == "gsp" and params == dict(
        groups=8, prompts_per_group=8, prefix_len=400, question_len=24, output_len=16
    )
    w = build_workload(name, tok, 0, **params)  # 8 groups of 8 requests over 400-token prefixes
    assert len(w.requests) == 64 and len({r.group for r in w.requests}) == 8
    assert all(len(r.input_ids) == 424 for r in w.requests)
    half = build_workload(
        *parse_spec("batchllm-half")[:1], tok, 0, **parse_spec("batchllm-half")[1]
    )
    assert len(half.requests) == 32 and all(len(r.input_ids) == 1100 for r in half.requests)
    assert set(SPECS) == {"g8x8-p400-q24", "g4x8-p1000-q100"}
    with pytest.raises(
        WorkloadError, match="unknown workload 'nope'; .*named shapes: g8x8-p400-q24"
    ):
        parse_spec("nope:groups=2")
    with pytest.raises(WorkloadError, match="parameter 'groups' is not key=value"):
        parse_spec("gsp:groups")


def test_poisson_arrivals_are_seeded_and_increasing(tok):
    w = build_workload("gsp", tok).with_poisson_arrivals(2.0, seed=5)
    times = [r.arrival_s for r in w.requests]
    assert times[0] == 0 and times == sorted(times) and len(set(times)) == len(times)
    assert times == [
        r.arrival_s for r in build_workload("gsp", tok).with_poisson_arrivals(2.0, seed=5).requests
    ]
    assert 0.25 < times[-1] / (len(times) - 1) < 1.5  # mean gap near 1/rate
    with pytest.raises(WorkloadError, match="--request-rate must be > 0"):
        build_workload("gsp", tok).with_poisson_arrivals(0, seed=5)


def test_workload_file_round_trip_and_prompt_lines(tok, tmp_path):
    w = build_workload("multilevel", tok).with_poisson_arrivals(3.0, seed=1)
    path = tmp_path / "w.jsonl"
    write_workload_file(w, path)
    back = load_workload_file(path, tok)
    assert back.requests == w.requests
    text = tmp_path / "t.jsonl"
    text.write_text(
        '{"id": "a", "prompt": "Hello there", "max_new_tokens": 3}\n\n'
        '{"id": "b", "input_ids": [1, 2, 3], "max_new_tokens": 2, "group": "x"}\n'
    )
    t = load_workload_file(text, tok)
    assert (
        t.requests[0].input_ids == tuple(tok("Hello there")["input_ids"])
        and t.requests[1].group == "x"
    )


def test_malformed_workload_file_lists_every_bad_line(tok, tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [
        '{"id": "ok", "prompt": "fine", "max_new_tokens": 4}',
        '{"id": "ok", "prompt": "again", "max_new_tokens": 4}',  # 2: duplicate id
        "not json",  # 3
        '{"id": "p", "prompt": "x", "input_ids": [1], "max_new_tokens": 4}',  # 4: both
        '{"id": "q", "input_ids": [1, -2], "max_new_tokens": 4}',  # 5: negative id
        '{"id": "r", "prompt": "x", "max_new_tokens": 0}',  # 6
        '{"id": "s", "prompt": "x", "max_new_tokens": 4, "arrival_s": -1}',  # 7
        '{"id": "t", "prompt": "x", "max_new_tokens": 4, "colour": "red"}',  # 8
        "[1, 2]",  # 9
        '{"id": "u", "input_ids": [999999999], "max_new_tokens": 4}',  # 10: beyond the vocabulary
    ]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError) as e:
        load_workload_file(path, tok)
    msg = str(e.value)
    assert "(9 problem(s)); nothing was run" in msg
    by_line = {int(x.split(":")[0].split()[1]): x for x in msg.splitlines()[1:]}
    for n, what in [
        (2, 'duplicate id "ok"'),
        (3, "not valid JSON"),
        (4, "give exactly one of"),
        (5, "non-negative ints"),
        (6, '"max_new_tokens" must be a positive int'),
        (7, '"arrival_s" must be a number >= 0'),
        (8, "unknown key(s) ['colour']"),
        (9, "expected a JSON object"),
        (10, "beyond the vocabulary"),
    ]:
        assert what in by_line[n], (n, by_line.get(n))
    assert 1 not in by_line


def test_workload_file_other_errors(tok, tmp_path):
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload_file(tmp_path / "missing.jsonl", tok)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(WorkloadError, match="no requests"):
        load_workload_file(empty, tok)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        json.dumps({"id": "a", "prompt": "x", "max_new_tokens": 1, "arrival_s": 0})
        + os.linesep
        + json.dumps({"id": "b", "prompt": "y", "max_new_tokens": 1})
        + os.linesep
    )
    with pytest.raises(WorkloadError, match="either every line has arrival_s or none does"):
        load_workload_file(mixed, tok)


def test_shaped_workloads_are_named_by_their_shape_and_old_names_still_work(tok):
    import re

    from feather_bench.workloads import ALIASES

    for old, shape in ALIASES.items():
        assert parse_spec(old) == parse_spec(shape)
        groups, per_group, prefix, question = map(
            int, re.fullmatch(r"g(\d+)x(\d+)-p(\d+)-q(\d+)", shape).groups()
        )
        w = build_workload(*parse_spec(shape)[:1], tok, 0, **parse_spec(shape)[1])
        assert (
            len({r.group for r in w.requests}) == groups and len(w.requests) == groups * per_group
        )
        assert all(len(r.input_ids) == prefix + question for r in w.requests), shape
    assert build_workload("feather-8x100", tok).name == "g8x8-p2000-q24"
