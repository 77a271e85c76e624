"""Token text made visible and safe for Plotly labels and HTML.

Tokens are often a lone space, a newline or half of a UTF-8 character; drawn raw they vanish or
break the markup, so whitespace gets a visible symbol and everything is HTML-escaped (Plotly's
text and hover labels read a subset of HTML).
"""
from __future__ import annotations

import html
import re

# Visible stand-ins for characters that would otherwise render as nothing.
_VISIBLE = {
    " ": "␣",
    "\n": "↵",
    "\r": "␍",
    "\t": "⇥",
    "\ufffd": "�",  # a partial UTF-8 sequence decodes to U+FFFD; keep it, it is the honest hint
}


def visible_text(text: str, max_len: int = 10) -> str:
    """Token text with whitespace shown as symbols, other controls as \\xNN, truncated with '…'."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    shown = "".join(out)
    if len(shown) > max_len:
        shown = shown[: max(max_len - 1, 1)] + "…"
    return shown


def label_html(text: str, max_len: int = 10) -> str:
    """`visible_text`, HTML-escaped for a Plotly text or hover label."""
    return html.escape(visible_text(text, max_len), quote=False)


_MD = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")  # label_html has already made < and & entities


def label_md(text: str, max_len: int = 16) -> str:
    """Token text for markdown: visible, HTML-escaped, markdown characters backslash-escaped, in quotes."""
    return "“" + _MD.sub(r"\\\1", label_html(text, max_len)) + "”"


def counted(n: int, noun: str) -> str:
    """'1 new token', '3 new tokens'."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
