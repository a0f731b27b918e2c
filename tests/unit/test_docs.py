"""The README documents every feather option (the table is what users read first)."""

from pathlib import Path

from feather_sglang.config import FeatherConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_every_option():
    text = README.read_text()
    missing = [flag for flag, _ in FeatherConfig.options() if f"`{flag}`" not in text]
    assert not missing, f"README.md does not document {missing}"
