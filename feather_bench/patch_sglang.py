"""Build feather into an SGLang source tree: apply, check or revert ``patches/``.

For a fork of SGLang that should carry feather without the entry-point plugin. The patch
(``patches/sglang-0.5.23-feather.patch``) makes the same calls as the plugin's hooks, from
SGLang's own source, at the same seams; ``feather_sglang`` must still be importable, as the
patched source calls into it. TARGET is the directory that holds the ``sglang`` package: a
checkout's ``python/``, or the site-packages of an environment you own.

Every hunk must match its anchor exactly (no fuzz) or nothing is written: the patch is first
tried with ``--dry-run`` and applied only if every hunk would apply.

    python -m feather_bench.patch_sglang ~/src/sglang/python --check
    python -m feather_bench.patch_sglang ~/src/sglang/python
    python -m feather_bench.patch_sglang ~/src/sglang/python --revert

run from the repository's root (or name the patch file with ``--patch``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from feather_sglang.sglang_integration import SGLANG_VERSION as WRITTEN_FOR

PATCH = Path("patches") / f"sglang-{WRITTEN_FOR}-feather.patch"  # from the repository's root


class PatchError(RuntimeError):
    """The patch cannot be applied or reverted as asked; nothing was changed."""


def patched_files(patch: Path = PATCH) -> list[str]:
    """Paths (relative to TARGET) the patch touches."""
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), flags=re.M)


def sglang_version(target: Path) -> str:
    """The version recorded in TARGET's sglang (``_version.py``), or 'unknown' (a checkout)."""
    path = target / "sglang" / "_version.py"
    found = (
        re.search(r"__version__\s*=\s*version\s*=\s*'([^']+)'", path.read_text())
        if path.exists()
        else None
    )
    return found.group(1) if found else "unknown"


def _patch(target: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess:
    binary = shutil.which("patch")
    if binary is None:
        raise PatchError("GNU patch is not installed (apt-get install patch)")
    return subprocess.run(
        [
            binary,
            "-p1",
            "-d",
            str(target),
            "--batch",
            "--fuzz=0",
            "--no-backup-if-mismatch",
            "--reject-file=-",
            "-i",
            str(patch.resolve()),  # patch -d changes directory first
            *flags,
        ],
        capture_output=True,
        text=True,
    )


def state(target: Path, patch: Path = PATCH) -> str:
    """'applied', 'unapplied', or raise PatchError saying which hunks do not match."""
    if not (target / "sglang" / "srt" / "managers" / "scheduler.py").exists():
        raise PatchError(
            f"{target} does not hold an sglang package (no sglang/srt/managers/scheduler.py there); "
            "pass the directory that contains sglang/: a checkout's python/, or a site-packages"
        )
    forward = _patch(target, patch, "--dry-run", "--forward")
    if forward.returncode == 0:
        return "unapplied"
    if _patch(target, patch, "--dry-run", "--reverse").returncode == 0:
        return "applied"
    failed, current = [], "?"
    for line in forward.stdout.splitlines():
        if line.startswith("checking file "):
            current = line.removeprefix("checking file ")
        elif "FAILED" in line and line.startswith("Hunk"):
            failed.append(f"{current}: {line}")
    raise PatchError(
        f"the patch does not apply to {target / 'sglang'} (sglang {sglang_version(target)}; "
        f"written for {WRITTEN_FOR}), and it is not applied there either; nothing was changed.\n  "
        + "\n  ".join(failed or forward.stdout.splitlines()[-5:])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="directory holding the sglang package")
    parser.add_argument(
        "--patch", type=Path, default=PATCH, help=f"the patch file (default: {PATCH})"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="only say whether it applies; change nothing"
    )
    mode.add_argument("--revert", action="store_true", help="take an applied patch out again")
    args = parser.parse_args(argv)
    target = args.target.expanduser().resolve()
    try:
        now = state(target, args.patch)
        files = ", ".join(patched_files(args.patch))
        if args.check:
            print(
                f"{args.patch.name}: {'already applied' if now == 'applied' else 'applies cleanly'} "
                f"to {target / 'sglang'} ({files})"
            )
            return 0
        want = "unapplied" if args.revert else "applied"
        if now == want:
            print(
                f"{args.patch.name}: already {'reverted' if args.revert else 'applied'} in {target / 'sglang'}; "
                "nothing to do"
            )
            return 0
        done = _patch(target, args.patch, "--reverse" if args.revert else "--forward")
        if done.returncode != 0:  # the dry run passed, so this is unexpected: say everything
            raise PatchError(f"patch failed after a clean dry run:\n{done.stdout}{done.stderr}")
        print(
            f"{args.patch.name}: {'reverted' if args.revert else 'applied'} in {target / 'sglang'} ({files})"
        )
        return 0
    except PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
