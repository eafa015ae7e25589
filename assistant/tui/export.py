"""Plain-text helpers: conversation to Markdown, the last fenced code block, titles.

Contract: `to_markdown(title, system_prompt, messages)` renders a conversation
(role/content pairs) as a Markdown document; `last_code_block(text)` returns the
body of the last fenced code block in `text` (None if there is none);
`title_from_prompt` makes a one-line conversation title; `safe_filename` a file
name from a title. Pure functions, no Textual.
"""
from __future__ import annotations

import re
from typing import Iterable

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)


def to_markdown(title: str, system_prompt: str, messages: Iterable[tuple[str, str]]) -> str:
    out = [f"# {title or 'Conversation'}", ""]
    if system_prompt:
        out += ["> **System:** " + system_prompt.replace("\n", "\n> "), ""]
    names = {"user": "You", "assistant": "Assistant", "system": "System"}
    for role, content in messages:
        out += [f"## {names.get(role, role.title())}", "", content.rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"


def last_code_block(text: str) -> str | None:
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1][1].rstrip("\n")
    # a block still open at the end (answer cut short)
    m = re.search(r"^(```|~~~)[^\n]*\n(.*)\Z", text, re.S | re.M)
    return m.group(2).rstrip("\n") if m else None


def title_from_prompt(prompt: str, width: int = 40) -> str:
    line = " ".join(prompt.split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def safe_filename(title: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", title).strip("-.")[:60]
    return (name or "conversation") + ".md"
