"""The generated text as HTML, each token tinted by who produced it.

Green tokens are draft tokens the target accepted; orange ones the target produced itself (the
prefill token and each step's bonus). A token's tooltip names its step. Styles are inline so the
snippet reads the same in any page, and classes (`tok-draft`, `tok-target`) leave a hook for CSS.
"""
from __future__ import annotations

import html

from eagle2.decode.records import StepRecord

# source -> (background colour, tooltip wording)
_SOURCES = {
    "draft": ("#c7e9c0", "accepted draft token"),
    "target": ("#fdd0a2", "target's token (bonus or prefill)"),
}
_OTHER = ("#e0e0e0", "token")


def _span(text: str, source: str, step: int, highlight: bool) -> str:
    colour, what = _SOURCES.get(source, _OTHER)
    cls = f"tok tok-{source}" if source in _SOURCES else "tok tok-other"
    # Escape first, then turn newlines into breaks, so the <br> itself is not escaped.
    body = html.escape(text).replace("\r\n", "\n").replace("\n", "<br>")
    ring = "outline:2px solid #333;" if highlight else ""
    tip = html.escape(f"step {step}: {what}", quote=True)
    return (f'<span class="{cls}" data-step="{step}" title="{tip}" '
            f'style="background:{colour};border-radius:3px;{ring}">{body}</span>')


def legend_html() -> str:
    """A one-line key to the token colours."""
    items = "".join(
        f'<span class="tok tok-{src}" style="background:{colour};border-radius:3px;'
        f'padding:0 4px;margin-right:8px">{html.escape(what)}</span>'
        for src, (colour, what) in _SOURCES.items()
    )
    return f'<div class="tok-legend" style="font-size:0.85em;margin-bottom:6px">{items}</div>'


def tokens_html(records: list[StepRecord], highlight_step: int | None = None) -> str:
    """Output text as coloured spans (one per new token) under a small legend."""
    spans = []
    for r in records:
        for text, source in zip(r.new_texts, r.new_sources):
            spans.append(_span(text, source, r.step, r.step == highlight_step))
    # pre-wrap keeps runs of spaces; newlines are already <br>, so none are left in the markup.
    body = "".join(spans)
    return (f'{legend_html()}<div class="tok-text" style="white-space:pre-wrap;'
            f'font-family:ui-monospace,monospace;line-height:1.6">{body}</div>')
