"""A link to a run: the page's prompt and settings in its URL's query, checked as the page's controls check them.

`link_query` writes the settings a run differs from the page's defaults in; `read_link` reads a query back,
keeping each value that passes the same checks as its control (`settings.configs`, the preset list, the
sizings) and naming every one it ignores and why, so that a bad or hostile link opens the page with its
defaults and says what it left out. No gradio here.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from urllib.parse import urlencode

from app_parts.presets import load_presets, page_token_limit
from app_parts.settings import MAX_PROMPT_CHARS, RunRequest, check_prompt, configs
from eagle2.inputs import check_number, check_text

MAX_VALUE_CHARS = MAX_PROMPT_CHARS  # a query value longer than a prompt may be is refused unread
MAX_KEYS = 40                       # a query with more keys than the page has settings is cut there
_TEXT = {"prompt", "preset", "tree_choice", "tree_json", "sizing", "left_policy", "left_arg", "right_policy",
         "right_arg"}
_BOOL = {"with_vanilla", "lookup"}
LINKED = tuple(f.name for f in fields(RunRequest))  # the settings a link may carry, named as the request names them


def link_query(req: RunRequest) -> str:
    """The query string for a run: its prompt, preset and every setting that differs from the page's default."""
    base = RunRequest(prompt="", preset="")
    out: dict[str, str] = {}
    for name in LINKED:
        value = getattr(req, name)
        if name in ("prompt", "preset") or value != getattr(base, name):
            out[name] = ("1" if value else "0") if name in _BOOL else str(value)
    return urlencode(out)


def _parse(name: str, raw: str) -> object:
    """A query value as its control holds it; ValueError naming what is wrong."""
    if name in _BOOL:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("must be 1 or 0")
    if name in _TEXT:
        if any(ord(c) < 32 and c not in "\n\t" for c in raw):
            raise ValueError("holds control characters")
        return raw
    return raw  # numbers: configs() checks them as it checks a control's value


def read_link(query: Mapping[str, str], defaults: RunRequest) -> tuple[dict[str, object], list[str]]:
    """(the settings a link sets, checked, by request field name; what it ignored, one phrase each)."""
    kept: dict[str, object] = {}
    ignored: list[str] = []
    for i, (name, raw) in enumerate(query.items()):
        shown = str(name)[:40]
        if i >= MAX_KEYS:
            ignored.append(f"everything after its first {MAX_KEYS} settings")
            break
        if name == "__theme" or name == "view":  # Gradio's own query parameters
            continue
        if name not in LINKED:
            ignored.append(f"“{shown}” (not a setting of this page)")
            continue
        if not isinstance(raw, str) or len(raw) > MAX_VALUE_CHARS:
            ignored.append(f"{name} (longer than {MAX_VALUE_CHARS:,} characters)")
            continue
        try:
            value = _parse(name, raw)
            _check(name, value, defaults)
        except ValueError as e:
            ignored.append(f"{name} ({str(e)[:160]})")
            continue
        kept[name] = _typed(name, value)
    if "tree_json" in kept and kept.get("tree_choice", defaults.tree_choice) != "custom":
        kept.pop("tree_json")
    return kept, ignored


def _typed(name: str, value: object) -> object:
    """A checked value as its control holds it: numbers as int when whole; text and booleans unchanged."""
    if name in _TEXT or name in _BOOL:
        return value
    v = float(str(value))
    return int(v) if v.is_integer() else v


def _check(name: str, value: object, defaults: RunRequest) -> None:
    """Raise ValueError when `value` would not pass the check its control's value passes (the same functions)."""
    if name == "prompt":
        check_prompt(str(value))
    elif name == "preset":
        check_text("model preset", value, MAX_VALUE_CHARS, load_presets())
    elif name == "tree_json":  # read only beside a custom tree
        configs(replace(defaults, tree_choice="custom", tree_json=str(value), sizing="custom"))
    else:
        if name == "max_new_tokens":  # the page's own limit (below the engine's), in the same words
            try:
                number = _typed(name, value)
            except ValueError:  # not a number: configs() below says so
                number = None
            if number is not None:
                check_number("max new tokens", number, 1, page_token_limit(), whole=True)
        configs(replace(defaults, **{"sizing": "custom", name: value}))
