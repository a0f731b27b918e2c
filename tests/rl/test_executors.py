"""Executors: the replay executor answers from real measurements only; one real measurement."""

from __future__ import annotations

import json

import pytest

from feather_rl.executors import (
    DEFAULT_RECORDING,
    BatchKey,
    Measurement,
    RealExecutor,
    RecordingError,
    ReplayExecutor,
)


def test_shipped_recording_has_provenance_and_real_measurements():
    data = json.loads(DEFAULT_RECORDING.read_text())
    prov = data["provenance"]
    for key in ("command", "date", "machine", "model", "settings", "duration_s"):
        assert key in prov, key
    assert prov["command"].startswith("feather-record") and prov["machine"]["cpu"]
    assert len(data["measurements"]) >= 30
    assert all(m["decode_s"] > 0 and m["decode_tokens"] > 0 for m in data["measurements"])


def test_replay_returns_the_recorded_value_for_a_recorded_key():
    replay = ReplayExecutor()
    for m in replay.measurements[:10]:
        same = [x.tokens_per_s for x in replay.measurements if x.key == m.key]
        assert replay.throughput(m.key) == pytest.approx(sum(same) / len(same))


def test_replay_between_keys_stays_within_its_nearest_real_measurements():
    replay = ReplayExecutor()
    values = [m.tokens_per_s for m in replay.measurements]
    for key in (BatchKey(12, 700.0, 0.6), BatchKey(3, 300.0, 0.1), BatchKey(200, 5000.0, 0.99)):
        assert min(values) <= replay.throughput(key) <= max(values)
    # a batch's measurement from its prompts: key computed from the tokens, decode tokens = n x (len - 1)
    prompts = [tuple(range(300)) + (1000 + i,) * 20 for i in range(6)]
    m = replay.measure(prompts, 17)
    assert m.key == BatchKey.of(prompts) and m.decode_tokens == 6 * 16
    assert m.tokens_per_s == pytest.approx(replay.throughput(m.key))


def test_replay_refuses_a_missing_recording_or_backend(tmp_path):
    with pytest.raises(RecordingError, match="does not exist"):
        ReplayExecutor(tmp_path / "none.json")
    with pytest.raises(RecordingError, match="no measurements for backend 'torch_native'"):
        ReplayExecutor(backend="torch_native")


def test_batch_key_sees_sharing_across_groups():
    a, b = tuple(range(500)), tuple(range(1000, 1500))
    assert BatchKey.of([a, a, a, a]).shared_frac == pytest.approx(0.75)
    assert BatchKey.of([a, a, b, b]).shared_frac == pytest.approx(0.5)
    assert BatchKey.of([a, b]).shared_frac == 0.0


@pytest.mark.e2e
def test_real_executor_measures_one_batch_on_the_tiny_model(tiny_model):
    prompts = [tuple(range(100, 400)) + (2000 + i,) * 10 for i in range(4)]
    with RealExecutor(str(tiny_model), max_batch=4, max_total_tokens=8192) as executor:
        m = executor.measure(prompts, 9)
        info = executor.describe()
    assert isinstance(m, Measurement) and m.backend == "feather" and info["model"] == "tiny-llama"
    # every token after the last first token is counted: at most 4 x 8, at least the last step's
    assert 4 <= m.decode_tokens <= 4 * 8 and m.decode_s > 0 and m.tokens_per_s > 0
    assert m.key == BatchKey.of(prompts)
    print(f"\n  real executor, tiny-llama, 4 x 310 tokens: {m.tokens_per_s:.0f} decode tok/s")
