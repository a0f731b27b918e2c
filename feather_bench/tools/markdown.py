"""Markdown for the generated docs: prose wrapped and commands in fenced blocks, so that no line
is longer than 200 characters (a test checks every Markdown file in the tree)."""

from __future__ import annotations

import textwrap

WIDTH = 100  # as the hand-written docs wrap


def wrap(text: str, width: int = WIDTH, indent: str = "") -> str:
    """``text`` in lines of at most ``width`` characters where its words allow (a word is never
    split, so a code span may continue on the next line: Markdown renders that as one space);
    lines after the first start with ``indent``."""
    return textwrap.fill(
        text,
        width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def option_groups(command: str) -> list[str]:
    """The words of a command line, each option with the values that follow it."""
    groups: list[str] = []
    for word in command.split():
        if groups and not word.startswith("-"):
            groups[-1] += " " + word
        else:
            groups.append(word)
    return groups or [""]


def command_block(command: str, width: int = WIDTH) -> list[str]:
    """A command line as recorded, in a fenced block: continued with `` \\`` where it would pass
    ``width``, an option kept on one line with its values."""
    groups = option_groups(command)
    lines = [groups[0]]
    for group in groups[1:]:
        if len(lines[-1]) + 1 + len(group) + 2 <= width:
            lines[-1] += " " + group
        else:
            lines[-1] += " \\"
            lines.append("    " + group)
    return ["```", *lines, "```"]


def command_item(marker: str, command: str, width: int = WIDTH) -> str:
    """A list item (``marker``: ``"1."``, ``"-"``) holding a command line as one code span, broken
    between options where it would pass ``width``."""
    indent = " " * (len(marker) + 1)
    groups = option_groups(command)
    lines = [f"{marker} `{groups[0]}"]
    for group in groups[1:]:
        if len(lines[-1]) + 1 + len(group) + 1 <= width:
            lines[-1] += " " + group
        else:
            lines.append(indent + group)
    return "\n".join(lines) + "`"
