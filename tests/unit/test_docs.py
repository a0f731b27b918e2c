"""The user's docs: generated parts up to date, the README short, no development history."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from feather_bench import docs

REPO = Path(__file__).resolve().parents[2]
HISTORY = re.compile(
    # "[ ]" is a space: the pattern's own text is then no match of itself
    r"\bstop[ ]\d+\b|\bissue[ ]#?\d+\b|\bsince[ ]stop\b|\bfresh[ ]clone\b"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\s?UTC\b",  # a time of day
    re.IGNORECASE,
)
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
SKIP_DIRS = {".venv", ".venv-zoo", "logs", "models", "results", ".git", "build", "dist"}
COMMIT_COLUMN = {"docs/results.md"}  # its tables name the commit each result was measured on


def test_generated_options_table_and_results_page_are_up_to_date():
    assert docs.main(["--check"]) == 0, "run: python -m feather_bench.docs"


def test_readme_is_a_short_users_guide_linking_every_doc():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).exists(), link


def _tree_files() -> list[Path]:
    """Every *.md, *.py, *.sh file and the Makefile, outside .venv, models and results."""
    return sorted(
        p
        for p in REPO.rglob("*")
        if p.is_file()
        and (p.suffix in (".md", ".py", ".sh") or p.name == "Makefile")
        and not SKIP_DIRS & set(p.relative_to(REPO).parts)
    )


def test_no_development_history_in_the_tree():
    offenders = [
        f"{p.relative_to(REPO)}: {m.group(0)}"
        for p in _tree_files()
        for m in HISTORY.finditer(p.read_text())
    ]
    assert offenders == []


def test_no_commit_hashes_in_the_tree():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    found: dict[str, set[str]] = {}
    for p in _tree_files():
        if p.relative_to(REPO).as_posix() not in COMMIT_COLUMN:
            for m in HEX.finditer(p.read_text()):
                found.setdefault(m.group(0), set()).add(str(p.relative_to(REPO)))
    names = sorted(found)
    checked = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "--batch-check"],
        input="".join(f"{h}^{{commit}}\n" for h in names),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    commits = [
        f"{h} in {sorted(found[h])}"
        for h, line in zip(names, checked)
        if not line.endswith((" missing", " ambiguous"))
    ]
    assert commits == []


def test_no_markdown_line_over_200_characters():
    """Tables keep one row per line, so long prose goes under them; generated pages wrap."""
    offenders = [
        f"{p.relative_to(REPO)}:{n}: {len(line)}"
        for p in _tree_files()
        if p.suffix == ".md"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if len(line) > 200
    ]
    assert offenders == []
