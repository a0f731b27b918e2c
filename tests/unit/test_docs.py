"""The user's docs: generated parts up to date, the README short, no development history."""

from __future__ import annotations

import re
from pathlib import Path

from feather_bench import docs

REPO = Path(__file__).resolve().parents[2]
HISTORY = re.compile(r"\bstop \d+\b|\bissue #?\d+\b|\bsince stop\b", re.IGNORECASE)


def test_generated_options_table_and_results_page_are_up_to_date():
    assert docs.main(["--check"]) == 0, "run: python -m feather_bench.docs"


def test_readme_is_a_short_users_guide_linking_every_doc():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).exists(), link


def test_no_development_history_in_the_tree():
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "Makefile"]
    for package in ("feather_sglang", "feather_rl", "feather_bench", "feather_kernels", "scripts"):
        files += [p for p in (REPO / package).rglob("*") if p.suffix in (".py", ".sh", ".md")]
    offenders = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in files for m in HISTORY.finditer(p.read_text())]
    assert offenders == []
