"""Recorded text made inert for each kind of output: Markdown, HTML and the terminal.

A workload name, a case id, a branch, an error message or a commit subject comes from a
record, and a record may come from anywhere (`memtrack ingest`). Shown, it must read as the
text it is: never a heading, a second comment marker, an HTML element, a link, a mention,
a table row, a screen clear or a terminal hyperlink. Every report and the dashboard pass
recorded strings through the one function of their output kind here.
"""

from __future__ import annotations

import re
import unicodedata

WORD_JOINER = "\u2060"
"""Invisible and zero-width: breaks the patterns that GitHub and Streamlit turn into links
(`https://`, `www.`, `user@host`) and mentions (`@name`) without changing what reads."""

_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
"""Bidirectional embeddings, overrides and isolates: they reorder what is shown, so that
text reads other than it is."""

_LINKISH = re.compile(r"(?<=:)(?=//)|(?<=[Ww]{3})(?=\.)|(?<=@)")
"""Where a word joiner goes: after the colon of `scheme://`, between `www` and its dot,
after every `@` (an e-mail address, a mailto: link, or a mention)."""

_MD_ENTITY = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;"}
_MD_SPECIAL = re.compile(r"[\\`*_\[\]~$&<>|]")
"""What starts a Markdown construct anywhere in a line: a backslash, code, emphasis,
strikethrough, a link or image (`[`; its `(`, `!` and `{` mean nothing without it), math,
an HTML element or entity, a table cell's end."""
_MD_LINE_START = re.compile(r"^(?:[!-/:-@\[-`{-~]|\d{1,9}(?=[.)](?:[ \t]|$)))")
"""What starts a block at the beginning of a line: a heading, quote, list, rule or fence (an
ordered list's number only with its `.` or `)` and a space or the end after it: `189.30` is
no list)."""

_HTML = str.maketrans({c: f"&#{ord(c)};" for c in "&<>\"'[]()*_!$`:~\\#|{}@"})
"""Characters that mean something to HTML, Markdown or math, as character references."""


def _visible(ch: str) -> bool:
    """Not a control character, a lone surrogate (which no output can encode) or a bidi
    override."""
    return unicodedata.category(ch) not in ("Cc", "Cs") and ch not in _BIDI


def one_line(text: object) -> str:
    """`text` on one line: every run of whitespace (newlines, tabs, Unicode line and
    paragraph separators) one space, control characters and bidi overrides dropped."""
    s = " ".join(str("" if text is None else text).split())
    return s if s.isprintable() else "".join(ch for ch in s if _visible(ch))


def _cut(s: str, limit: int | None) -> str:
    return s if limit is None or len(s) <= limit else s[: max(limit - 1, 0)] + "…"


def markdown_text(text: object, limit: int | None = None, *, inline: bool = False) -> str:
    """Recorded text for Markdown prose or a table cell (GitHub, and Streamlit's reader):
    one line, `limit` characters at most, every character that can start a construct
    escaped (no heading, list, emphasis, link, image, directive, math, HTML or cell end can
    form), and the shapes that readers turn into links or mentions broken by a word joiner.
    Other punctuation stays as it is, so the Markdown source reads as the text. With
    `inline` (text that follows something on its line, or fills a table cell) what would
    start a block at a line's beginning ('1.', '#', '-') is left as it is."""
    s = _LINKISH.sub(WORD_JOINER, _cut(one_line(text), limit))
    start = None if inline else _MD_LINE_START.match(s)
    lead = ""
    if start and not _MD_SPECIAL.match(s):  # those are escaped below, wherever they stand
        n = start.end()
        lead, s = (s[:n] + "\\", s[n:]) if s[0].isdigit() else ("\\" + s[0], s[1:])
    return lead + _MD_SPECIAL.sub(lambda m: _MD_ENTITY.get(m.group(), "\\" + m.group()), s)


def markdown_code(text: object, *, in_table: bool = False, limit: int | None = None) -> str:
    """Recorded text as a Markdown code span (a case id, a branch): one line, fenced by more
    backticks than it holds. In a code span nothing is a link, a mention or HTML; in a
    table cell `|` must still be escaped, and is with `in_table`."""
    s = _cut(one_line(text), limit)
    longest = max((len(run) for run in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    if in_table:
        s = s.replace("|", "\\|")
    return f"{fence}{pad}{s}{pad}{fence}"


def html_text(text: object, limit: int | None = None) -> str:
    """Recorded text for an HTML element or attribute (the dashboard's panels): one line,
    every character that means something to HTML, Markdown or math a character reference,
    and a word joiner where a link or mention could be read."""
    s = _cut(one_line(text), limit)
    return _LINKISH.sub(WORD_JOINER, s).translate(_HTML)


def terminal_text(text: object) -> str:
    """Recorded text for the terminal: control characters (escape sequences that clear the
    screen, move the cursor, set the title or make a hyperlink; the bell; a carriage return
    that overwrites the line) shown as `\\xNN` instead of acting, bidi overrides as
    `\\uNNNN`; newlines, tabs and Unicode line and paragraph separators as spaces, so one
    item stays one line."""
    s = str("" if text is None else text)
    if s.isprintable():
        return s
    out = []
    for ch in s:
        if ch in "\n\t\u2028\u2029":
            out.append(" ")
        elif _visible(ch):
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
    return "".join(out)


__all__ = [
    "WORD_JOINER",
    "html_text",
    "markdown_code",
    "markdown_text",
    "one_line",
    "terminal_text",
]
