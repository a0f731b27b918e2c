"""Workloads for the A/B tool and the RL environment: deterministic, real text, exact lengths.

A workload is a list of :class:`WorkloadRequest` (token ids, output length, optional arrival
time, and the prefix-group label used only for reporting). Built-in workloads are generated
from a seed; their text is real English prose (the Python reference documentation shipped
with CPython as ``pydoc_data.topics``) tokenised by the model's own tokenizer, and then cut
to exact token lengths, so every configuration sees the same token ids.

Built-ins (``WORKLOADS``), scaled from the papers' setups to a 2-core CPU serving
SmolLM2-135M, where one configuration must finish in a few minutes:

Each shaped workload is named by its shape, ``gGROUPSxREQUESTS-pPREFIX-qQUESTION`` (output 16
tokens); the names it had before are still accepted (``ALIASES``: ``feather-8x100``,
``feather-8x50``, ``batchllm``, ``feather-8x100-p400``, ``batchllm-half``).

================ ============================================ ================================
name             here                                         scaled from
================ ============================================ ================================
gsp             4 groups x 8 prompts, prefix 512, question   sglang bench_serving
                32, output 16, shuffled (all ``--gsp-*``     generated-shared-prefix (64 x 16,
                settable)                                    2048 / 128 / 256)
g8x8-p2000-q24  8 groups x 8 requests, prefix 2000,          Feather: 800 requests in 8 prefix
(feather-8x100) question 24, output 16, shuffled             groups (8 x 100) of long-context
                                                             prompts (2.7K-210K tokens): 1/12.5
                                                             of the requests, prompts cut to
                                                             2,000 tokens
g8x50-p400-q24  8 groups x 50 requests, prefix 400,          Feather's 8 x 100 at half the
(feather-8x50)  question 24, output 16 (400 requests: more   requests: lpm's 128-request
                than lpm's 128 wait for 272 admissions)      cut-off and groups larger than
                                                             the batch, as in the paper;
                                                             prompts cut to 400 tokens
g4x16-p2000-    4 prefixes x share 16, prefix 2000,          BatchLLM: prefix 2000, share 16,
q200 (batchllm) distinct 200, output 16, shuffled            distinct 200 (not scaled: one
                                                             configuration takes 1.5-4 min)
multilevel       system 128 -> 2 few-shot blocks of 192 ->    (no paper figure) RAG / few-shot
                3 documents of 256 each -> 5 questions of    serving with a prefix tree four
                 24, output 16 (30 requests), shuffled        levels deep
no-sharing       32 requests of 440 distinct tokens,          control: nothing shared
                 output 16
================ ============================================ ================================

``SPECS`` names two parameter sets of ``gsp``: ``g8x8-p400-q24`` (``feather-8x100-p400``:
g8x8-p2000-q24 with 400-token prompts) and ``g4x8-p1000-q100`` (``batchllm-half``: BatchLLM's
sizes halved); :func:`parse_spec` reads them and the ``NAME:key=value,...`` form.

A workload file is JSON Lines, one request per line::

    {"id": "r1", "prompt": "text ...", "max_new_tokens": 16, "arrival_s": 0.5}
    {"id": "r2", "input_ids": [1, 2, 3], "max_new_tokens": 16}

``prompt`` or ``input_ids`` (exactly one), ``max_new_tokens`` required, ``arrival_s``
(seconds from start, >= 0) and ``group`` optional. :func:`load_workload_file` checks every
line first and raises :class:`WorkloadError` listing every bad line by number.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class WorkloadError(ValueError):
    """A workload name, parameter or file is invalid; the message says what and what is allowed."""


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    rid: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    arrival_s: Optional[float] = None  # seconds from the start; None: all at once
    group: str = ""  # prefix-group label, for reports only


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[WorkloadRequest, ...]
    description: str
    params: dict = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.input_ids) for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.max_new_tokens for r in self.requests)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "params": self.params,
            "requests": len(self.requests),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "groups": len({r.group for r in self.requests}),
        }

    def with_max_new_tokens(self, n: int) -> "Workload":
        reqs = tuple(replace(r, max_new_tokens=n) for r in self.requests)
        return replace(self, requests=reqs, params={**self.params, "max_new_tokens": n})

    def with_poisson_arrivals(self, rate: float, seed: int) -> "Workload":
        """Arrival times from a Poisson process of ``rate`` requests/s (in the current order)."""
        if rate <= 0:
            raise WorkloadError(f"--request-rate must be > 0 requests/s, got {rate}")
        rng, t, reqs = random.Random(seed), 0.0, []
        for r in self.requests:
            reqs.append(replace(r, arrival_s=round(t, 6)))
            t += rng.expovariate(rate)
        return replace(self, requests=tuple(reqs), params={**self.params, "request_rate": rate})


# ---- text ------------------------------------------------------------------------------------
class TextSource:
    """An endless, deterministic stream of real-text token ids; ``take(n)`` cuts exact lengths."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", seed: int) -> None:
        self._tokens = _corpus_tokens(tokenizer)
        self._pos = random.Random(seed).randrange(len(self._tokens))

    def take(self, n: int) -> tuple[int, ...]:
        out: list[int] = []
        while len(out) < n:
            chunk = self._tokens[self._pos : self._pos + (n - len(out))]
            out.extend(chunk)
            self._pos = (self._pos + len(chunk)) % len(self._tokens)
        return tuple(out)


_CORPUS_CACHE: dict[int, list[int]] = {}


def _corpus_tokens(tokenizer) -> list[int]:
    key = id(tokenizer)
    if key not in _CORPUS_CACHE:
        from pydoc_data.topics import topics

        # NOTE: one topic at a time (each is under the model's context), joined end to end
        tokens: list[int] = []
        for name in sorted(topics):
            tokens.extend(
                tokenizer(topics[name] + "\n\n", add_special_tokens=False, verbose=False)[
                    "input_ids"
                ]
            )
        _CORPUS_CACHE[key] = tokens
    return _CORPUS_CACHE[key]


# ---- built-in generators -----------------------------------------------------------------------
def _positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise WorkloadError(f"{name} must be a positive integer, got {value!r}")
    return value


def gsp(
    tokenizer,
    seed: int = 0,
    *,
    groups: int = 4,
    prompts_per_group: int = 8,
    prefix_len: int = 512,
    question_len: int = 32,
    output_len: int = 16,
    shuffle: bool = True,
) -> Workload:
    """sglang bench_serving's generated-shared-prefix shape: ``groups`` system prompts of
    ``prefix_len`` tokens, each followed by ``prompts_per_group`` questions."""
    for k, v in dict(
        groups=groups,
        prompts_per_group=prompts_per_group,
        prefix_len=prefix_len,
        question_len=question_len,
        output_len=output_len,
    ).items():
        _positive(k, v)
    text = TextSource(tokenizer, seed)
    reqs = []
    for g in range(groups):
        prefix = text.take(prefix_len)
        for i in range(prompts_per_group):
            reqs.append(
                WorkloadRequest(
                    f"g{g}-q{i}", prefix + text.take(question_len), output_len, None, f"g{g}"
                )
            )
    if shuffle:
        random.Random(seed).shuffle(reqs)
    params = dict(
        groups=groups,
        prompts_per_group=prompts_per_group,
        prefix_len=prefix_len,
        question_len=question_len,
        output_len=output_len,
        shuffle=shuffle,
        seed=seed,
    )
    return Workload(
        "gsp", tuple(reqs), "generated shared prefix (sglang bench_serving shape)", params
    )


def _feather_groups(
    tokenizer, seed: int, per_group: int, prefix_len: int, name: str, description: str
) -> Workload:
    """Feather's 8 prefix groups (question 24, output 16)."""
    w = gsp(
        tokenizer,
        seed,
        groups=8,
        prompts_per_group=per_group,
        prefix_len=prefix_len,
        question_len=24,
        output_len=16,
    )
    return replace(w, name=name, description=description)


def feather_8x100(tokenizer, seed: int = 0) -> Workload:
    """Feather's 8 groups at 1/12.5 of the requests (8 x 8), prompts cut to 2,000 tokens: about
    the longest that keeps one configuration within a few minutes here (the paper's are 2.7K
    tokens and up). The same with 400-token prompts is ``SPECS["g8x8-p400-q24"]``."""
    return _feather_groups(
        tokenizer,
        seed,
        8,
        2000,
        "g8x8-p2000-q24",
        "Feather's 8 prefix groups, scaled from 8 x 100 to 8 x 8 requests, prefix 2000",
    )


def feather_8x50(tokenizer, seed: int = 0) -> Workload:
    """Feather's 8 groups at half the paper's request count (8 x 50 = 400), prompts cut to 400
    tokens (400 requests at 2,000 would take an hour per configuration here): the queue stays
    above lpm's 128-request cut-off (where SGLang's lpm turns into FCFS) for the first 272
    admissions, and every group outnumbers the batch limit, as in the paper."""
    return _feather_groups(
        tokenizer,
        seed,
        50,
        400,
        "g8x50-p400-q24",
        "Feather's 8 prefix groups at half the paper's count: 8 x 50 requests",
    )


def batchllm(tokenizer, seed: int = 0) -> Workload:
    """BatchLLM's shape at its own sizes: 4 prefixes of 2000 tokens, each shared by 16 requests
    with 200 distinct tokens. Every size halved is ``SPECS["g4x8-p1000-q100"]``."""
    w = gsp(
        tokenizer,
        seed,
        groups=4,
        prompts_per_group=16,
        prefix_len=2000,
        question_len=200,
        output_len=16,
    )
    return replace(
        w,
        name="g4x16-p2000-q200",
        description="BatchLLM's prefix 2000 / share 16 / distinct 200, 4 prefixes",
    )


def multilevel(
    tokenizer,
    seed: int = 0,
    *,
    system_len: int = 128,
    fewshot_blocks: int = 2,
    fewshot_len: int = 192,
    documents: int = 3,
    document_len: int = 256,
    questions: int = 5,
    question_len: int = 24,
    output_len: int = 16,
) -> Workload:
    """system prompt -> few-shot block -> document -> question: a prefix tree four levels deep."""
    text = TextSource(tokenizer, seed)
    system = text.take(system_len)
    reqs = []
    for f in range(fewshot_blocks):
        shots = system + text.take(fewshot_len)
        for d in range(documents):
            doc = shots + text.take(document_len)
            for q in range(questions):
                reqs.append(
                    WorkloadRequest(
                        f"f{f}d{d}-q{q}",
                        doc + text.take(question_len),
                        output_len,
                        None,
                        f"f{f}d{d}",
                    )
                )
    random.Random(seed).shuffle(reqs)
    params = dict(
        system_len=system_len,
        fewshot_blocks=fewshot_blocks,
        fewshot_len=fewshot_len,
        documents=documents,
        document_len=document_len,
        questions=questions,
        question_len=question_len,
        output_len=output_len,
    )
    return Workload("multilevel", tuple(reqs), "system -> few-shot -> document -> question", params)


def no_sharing(
    tokenizer, seed: int = 0, *, requests: int = 32, prompt_len: int = 440, output_len: int = 16
) -> Workload:
    text = TextSource(tokenizer, seed)
    reqs = [
        WorkloadRequest(f"u{i}", text.take(prompt_len), output_len, None, f"u{i}")
        for i in range(requests)
    ]
    return Workload(
        "no-sharing",
        tuple(reqs),
        "control: no two prompts share a prefix",
        dict(requests=requests, prompt_len=prompt_len, output_len=output_len),
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "gsp": gsp,
    "g8x8-p2000-q24": feather_8x100,
    "g8x50-p400-q24": feather_8x50,
    "g4x16-p2000-q200": batchllm,
    "multilevel": multilevel,
    "no-sharing": no_sharing,
}


# Named parameter sets of the built-ins ("NAME:key=value,..."): g8x8-p2000-q24 with 400-token
# prompts and g4x16-p2000-q200 at half its sizes, the shapes the replay recording covers. The
# one place they are written (Makefile, RL, tests).
SPECS: dict[str, str] = {
    "g8x8-p400-q24": "gsp:groups=8,prompts_per_group=8,prefix_len=400,question_len=24,output_len=16",
    "g4x8-p1000-q100": "gsp:groups=4,prompts_per_group=8,prefix_len=1000,question_len=100,output_len=16",
}

# The names the shaped workloads had before they were named by their shape; still accepted.
ALIASES: dict[str, str] = {
    "feather-8x100": "g8x8-p2000-q24",
    "feather-8x50": "g8x50-p400-q24",
    "batchllm": "g4x16-p2000-q200",
    "feather-8x100-p400": "g8x8-p400-q24",
    "batchllm-half": "g4x8-p1000-q100",
}


def is_workload_name(name: str) -> bool:
    """A built-in, a named shape or an alias of either."""
    return name in WORKLOADS or name in SPECS or name in ALIASES


def parse_spec(spec: str) -> tuple[str, dict]:
    """A workload spec as ``(name, params)``: ``NAME`` (a built-in), a name in :data:`SPECS`,
    ``NAME:key=value,key=value`` (generator parameters, e.g. ``gsp:groups=8,prefix_len=400``)
    or ``file:PATH`` (``("file", {"path": PATH})``). :class:`WorkloadError` names what is wrong."""
    spec = ALIASES.get(spec, spec)
    spec = SPECS.get(spec, spec)
    if spec.startswith("file:"):
        return "file", {"path": spec[len("file:") :]}
    name, _, rest = spec.partition(":")
    name = ALIASES.get(name, name)
    if name not in WORKLOADS:
        raise WorkloadError(
            f"unknown workload {name!r}; built-in workloads: {', '.join(WORKLOADS)}; "
            f"named shapes: {', '.join(SPECS)}; or NAME:key=value,... or file:PATH"
        )
    params = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise WorkloadError(f"workload {spec!r}: parameter {item!r} is not key=value")
        params[key] = int(value) if value.lstrip("-").isdigit() else value
    return name, params


def build_workload(name: str, tokenizer, seed: int = 0, **params) -> Workload:
    """A built-in workload by name; ``params`` are passed to its generator (``gsp`` takes
    groups, prompts_per_group, prefix_len, question_len, output_len, shuffle)."""
    name = ALIASES.get(name, name)
    if name not in WORKLOADS:
        raise WorkloadError(
            f"unknown workload {name!r}; built-in workloads: {', '.join(WORKLOADS)}"
        )
    try:
        return WORKLOADS[name](tokenizer, seed, **params)
    except TypeError as e:
        raise WorkloadError(f"workload {name!r}: {e}") from None


# ---- files ---------------------------------------------------------------------------------------
def load_workload_file(
    path: str | Path, tokenizer, default_max_new_tokens: Optional[int] = None
) -> Workload:
    """Read a JSON Lines workload file (format in the module docstring). Every line is checked
    before anything is returned; all problems are raised together, each with its line number."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"workload file {path} does not exist")
    problems, reqs, seen = [], [], set()
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            reqs.append(_parse_line(line, lineno, seen, tokenizer, default_max_new_tokens))
        except WorkloadError as e:
            problems.append(f"  line {lineno}: {e}")
    if not reqs and not problems:
        problems.append("  the file has no requests")
    if problems:
        raise WorkloadError(
            f"workload file {path} is malformed ({len(problems)} problem(s)); nothing was run:\n"
            + "\n".join(problems)
        )
    arrivals = [r.arrival_s is not None for r in reqs]
    if any(arrivals) and not all(arrivals):
        raise WorkloadError(f"workload file {path}: either every line has arrival_s or none does")
    return Workload(path.stem, tuple(reqs), f"from {path}", {"file": str(path)})


_KEYS = {"id", "prompt", "input_ids", "max_new_tokens", "arrival_s", "group"}


def _parse_line(
    line: str, lineno: int, seen: set, tokenizer, default_max_new_tokens
) -> WorkloadRequest:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise WorkloadError("expected a JSON object")
    unknown = set(obj) - _KEYS
    if unknown:
        raise WorkloadError(f"unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
        raise WorkloadError('"id" must be a non-empty string')
    if rid in seen:
        raise WorkloadError(f'duplicate id "{rid}"')
    seen.add(rid)
    if ("prompt" in obj) == ("input_ids" in obj):
        raise WorkloadError(
            'give exactly one of "prompt" (a string) or "input_ids" (a list of ints)'
        )
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise WorkloadError('"prompt" must be a non-empty string')
        ids = tuple(tokenizer(obj["prompt"])["input_ids"])
    else:
        ids = obj["input_ids"]
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
        ):
            raise WorkloadError('"input_ids" must be a non-empty list of non-negative ints')
        if max(ids) >= len(tokenizer):
            raise WorkloadError(
                f'"input_ids" has token id {max(ids)}, beyond the vocabulary ({len(tokenizer)})'
            )
        ids = tuple(ids)
    n = obj.get("max_new_tokens", default_max_new_tokens)
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise WorkloadError('"max_new_tokens" must be a positive int')
    arrival = obj.get("arrival_s")
    if arrival is not None and (
        not isinstance(arrival, (int, float)) or isinstance(arrival, bool) or arrival < 0
    ):
        raise WorkloadError('"arrival_s" must be a number >= 0 (seconds from the start)')
    group = obj.get("group", "")
    if not isinstance(group, str):
        raise WorkloadError('"group" must be a string')
    return WorkloadRequest(rid, ids, n, None if arrival is None else float(arrival), group)


def write_workload_file(workload: Workload, path: str | Path) -> None:
    """The inverse of :func:`load_workload_file` (``input_ids`` form)."""
    with open(path, "w") as f:
        for r in workload.requests:
            obj = {"id": r.rid, "input_ids": list(r.input_ids), "max_new_tokens": r.max_new_tokens}
            if r.arrival_s is not None:
                obj["arrival_s"] = r.arrival_s
            if r.group:
                obj["group"] = r.group
            f.write(json.dumps(obj) + "\n")


@lru_cache(maxsize=4)
def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
