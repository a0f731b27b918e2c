"""Runs a dispatched batch through the real model with ``sglang.Engine`` and measures its decode.

One Engine is kept for the executor's life (start-up takes seconds). Per batch:

1. ``flush_cache``, then the prompts are prefilled once (``max_new_tokens=1``) so the radix
   cache holds them: requests that share a prefix then share its KV slots, as they do in a
   feather server (its prefix leader computes a group's prefix once before the group runs), and
   the prefix-shared attention backend sees the sharing;
2. all requests are sent at once (``max_running_requests`` >= batch size, so they decode as one
   batch) with streaming; each output chunk is time-stamped as it arrives;
3. decode window: from the moment the last request got its first token (every request is
   decoding from then on) to the last chunk; throughput = output tokens that arrived in the
   window / its length;
4. ``flush_cache`` again, so the next batch starts cold.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from feather_bench.tools.engine import shutdown_engine
from feather_rl.executors.batch import BatchKey, Measurement

# NOTE: 64 running requests and 64K KV tokens cover every batch the environment forms from the
# built-in workloads (at most 64 requests of <= 1100 tokens, most of them shared).
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_TOTAL_TOKENS = 65536


@dataclass
class RealExecutor:
    """Decode throughput of real batches (see module docstring). ``attention_backend`` is
    'feather' (prefix-shared) or 'torch_native'; ``repeats`` > 1 takes the median."""

    model_path: str
    attention_backend: str = "feather"
    max_batch: int = DEFAULT_MAX_BATCH
    max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS
    repeats: int = 1
    engine_kwargs: dict = field(default_factory=dict)
    _engine: object = field(default=None, init=False, repr=False)

    @property
    def backend(self) -> str:
        return self.attention_backend

    def start(self):
        if self._engine is None:
            import sglang

            self._engine = sglang.Engine(
                model_path=str(self.model_path),
                schedule_policy="fcfs",
                attention_backend=self.attention_backend,
                max_running_requests=self.max_batch,
                max_total_tokens=self.max_total_tokens,
                skip_tokenizer_init=True,
                log_level="error",
                random_seed=0,
                **self.engine_kwargs,
            )
            # warm-up: the first forward passes pay one-time costs
            self._engine.generate(input_ids=[[100] * 64] * 2, sampling_params={"max_new_tokens": 4})
        return self._engine

    def describe(self) -> dict:
        """Model, backend and the server settings the measurements were taken with."""
        engine = self.start()
        args = engine.server_args
        return {
            "model": Path(self.model_path).name,
            "attention_backend": self.attention_backend,
            "dtype": str(args.dtype),
            "device": str(args.device),
            "max_running_requests": self.max_batch,
            "max_total_tokens": self.max_total_tokens,
        }

    def measure(self, prompts: Sequence[Sequence[int]], output_len: int) -> Measurement:
        """Decode throughput of ``prompts`` run together, ``output_len`` tokens each (>= 2)."""
        if not 1 <= len(prompts) <= self.max_batch:
            raise ValueError(
                f"batch of {len(prompts)} requests: this executor runs 1..{self.max_batch}"
            )
        if output_len < 2:
            raise ValueError("output_len must be >= 2: decode starts after the first token")
        engine = self.start()
        runs = []
        for _ in range(self.repeats):
            engine.flush_cache()
            engine.generate(
                input_ids=[list(p) for p in prompts], sampling_params={"max_new_tokens": 1}
            )
            runs.append(engine.loop.run_until_complete(self._stream_all(prompts, output_len)))
            engine.flush_cache()
        tokens, seconds = sorted(runs, key=lambda r: r[0] / r[1])[len(runs) // 2]
        return Measurement(
            BatchKey.of([tuple(p) for p in prompts]), tokens, seconds, output_len, self.backend
        )

    async def _stream_all(self, prompts, output_len: int) -> tuple[int, float]:
        params = {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}
        streams = await asyncio.gather(*(self._stream_one(list(p), params) for p in prompts))
        window_start = max(s[0][0] for s in streams)  # the last request's first token
        window_end = max(s[-1][0] for s in streams)
        tokens = sum(n for s in streams for t, n in s if t > window_start)
        if window_end <= window_start or tokens == 0:
            raise RuntimeError(
                "no decode tokens after the last first token: batch did not decode together"
            )
        return tokens, window_end - window_start

    async def _stream_one(self, ids: list[int], params: dict) -> list[tuple[float, int]]:
        """(arrival time, new tokens) per streamed chunk."""
        out, seen = [], 0
        async for chunk in await self._engine.async_generate(
            input_ids=ids, sampling_params=params, stream=True
        ):
            done = chunk["meta_info"]["completion_tokens"]
            out.append((time.perf_counter(), done - seen))
            seen = done
        return out

    def close(self) -> None:
        if self._engine is not None:
            shutdown_engine(self._engine)
            self._engine = None

    def __enter__(self) -> "RealExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
