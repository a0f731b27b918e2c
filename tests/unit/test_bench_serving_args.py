"""feather-bench-serving's ``--bench-args``: a flag the workload sets too is replaced, not given
twice (bench_serving would take the last, and the recorded command would show both)."""

from feather_bench import serving


def test_bench_args_replace_the_workloads_own_flags_and_add_the_others():
    online = serving.WORKLOADS["online"][1]
    assert online[-2:] == ("--request-rate", "2")
    args = serving.bench_serving_args(online, "--request-rate 1 --max-concurrency 8")
    assert args == [*online[:-2], "--request-rate", "1", "--max-concurrency", "8"]
    args = serving.bench_serving_args(online, "--request-rate=0.5")
    assert args == [*online[:-2], "--request-rate=0.5"]
    assert serving.bench_serving_args(online, "") == list(online)
