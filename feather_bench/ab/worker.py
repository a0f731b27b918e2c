"""Child process of the A/B tool's offline mode: one ``sglang.Engine``, one workload.

    python -m feather_bench.ab.worker SPEC.json

SPEC: ``{"engine_kwargs": {...}, "workload": "w.jsonl", "out": "out.json", "desc": "..."}``.
Writes ``{"records": [...], "makespan_s": s, "start_monotonic": t}`` to ``out``. Its stdout and
stderr are the run's log; the progress bar goes to the file descriptor named by
``FEATHER_AB_PROGRESS_FD`` (the parent's terminal) when set.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    import sglang

    from feather_bench.ab.client import drive, engine_stream_fn
    from feather_bench.ab.runner import warmup_ids
    from feather_bench.tools.engine import shutdown_engine
    from feather_bench.workloads import load_tokenizer, load_workload_file

    kwargs = spec["engine_kwargs"]
    workload = load_workload_file(spec["workload"], load_tokenizer(kwargs["model_path"]))
    engine = sglang.Engine(**kwargs)
    try:
        engine.generate(
            input_ids=warmup_ids(workload), sampling_params={"max_new_tokens": 4, "temperature": 0}
        )
        engine.flush_cache()
        start = time.monotonic()
        fd = os.environ.get("FEATHER_AB_PROGRESS_FD")
        progress = os.fdopen(int(fd), "w") if fd else None
        records, makespan = engine.loop.run_until_complete(
            drive(workload, engine_stream_fn(engine), spec["desc"], progress)
        )
    finally:
        shutdown_engine(engine)
    with open(spec["out"], "w") as f:
        json.dump(
            {
                "records": [r.to_json() for r in records],
                "makespan_s": makespan,
                "start_monotonic": start,
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1])
