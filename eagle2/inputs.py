"""Input from outside (the page, its API, uploaded files, the command line): the checks every entry point shares.

A refused value gets one kind of message: the field, what was wrong, the limit and what to do, with the value
shortened (`shown`) so that a 300-digit number or a megabyte of text is never echoed back. JSON from outside
goes through `load_json`, which bounds its nesting (deep nesting would otherwise exhaust Python's recursion,
here or later when the value is copied or drawn) and turns every parse failure into a ValueError.
"""
from __future__ import annotations

import json
import math
from numbers import Integral, Real

MAX_JSON_DEPTH = 32  # a trace nests about 6 levels, a tree 2: 32 leaves room and stays far from Python's limit
SHOWN_CHARS = 40


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`value` as a message shows it: its repr, shortened in the middle past `limit` characters (with its size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3.3 * limit:
        digits = int(value.bit_length() * 0.30103) + 1  # str() of a number past 4,300 digits raises
        head = str(value)[:8] if digits < 4000 else "-" * (value < 0)
        return f"{head}… (a number of about {digits:,} digits)"
    text = repr(value) if not isinstance(value, str) or len(value) <= limit else repr(value[:limit])
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes" if isinstance(value, bytes) else "items"
        return f"{text[:limit]}… ({len(value):,} {unit})"
    return text if len(text) <= limit else f"{text[:limit // 2]}…{text[-limit // 2:]}"


def kind(value: object) -> str:
    """What a value is, in words a visitor knows (not Python's type names)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    names = ((str, "text"), (bytes, "bytes"), (dict, "an object"), ((list, tuple), "a list"),
             (Integral, "a whole number"), (Real, "a number"))
    return next((name for t, name in names if isinstance(value, t)), "something else")


def bound(limit: object) -> str:
    """A limit as a message writes it: a power of two (or one less) past ten million as 2^k or 2^k-1, so the
    seed's limit reads 2^63-1, not a 19-digit number."""
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 10**7:
        k = limit.bit_length()
        if limit == (1 << k) - 1:
            return f"2^{k}-1"
        if limit == 1 << (k - 1):
            return f"2^{k - 1}"
    return str(limit)


def out_of_range(name: str, value: object, lo: object, hi: object) -> ValueError:
    """The message for a number outside lo..hi: the field, the value (shortened), the limit and what to do."""
    lo, hi = bound(lo), bound(hi)
    return ValueError(f"{name}={shown(value)} is outside {lo}..{hi}: choose a value from {lo} to {hi}")


def check_number(name: str, value: object, lo: float, hi: float, whole: bool = False) -> None:
    """Raise ValueError unless `value` is a real number (a whole one if `whole`) within lo..hi."""
    ok = isinstance(value, Integral) if whole else isinstance(value, Real)
    if not ok or isinstance(value, bool):
        wanted = "a whole number" if whole else "a number"
        raise ValueError(f"{name} must be {wanted} from {bound(lo)} to {bound(hi)}, not {shown(value)} "
                         f"({kind(value)})")
    if not isinstance(value, Integral) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number from {bound(lo)} to {bound(hi)}, not {value!r}")
    if not lo <= value <= hi:
        raise out_of_range(name, value, lo, hi)


def check_text(name: str, value: object, max_chars: int, choices: object = None) -> str:
    """`value` if it is text of at most `max_chars` characters (and one of `choices`, when given)."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, not {shown(value)} ({kind(value)})")
    if len(value) > max_chars:
        raise ValueError(f"{name} has {len(value):,} characters; at most {max_chars:,} are accepted: shorten it")
    if choices is not None and value not in choices:
        names = ", ".join(map(str, choices))
        raise ValueError(f"unknown {name} {shown(value)}: {name} must be one of {names}")
    return value


def load_json(text: str | bytes, what: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """Parse JSON from outside; ValueError naming `what` when it is not JSON or nests deeper than `max_depth`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply (more than {max_depth} levels of [ or {{); "
                         "flatten it") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                         "check the file or text") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text; save it as UTF-8 JSON") from None
    except ValueError:  # Python refuses integers of more than 4,300 digits
        raise ValueError(f"{what} holds a number too long to read (over 4,300 digits); use numbers of "
                         "ordinary size") from None
    if nesting(value, max_depth) > max_depth:
        raise ValueError(f"{what} is nested too deeply (more than {max_depth} levels of [ or {{); flatten it")
    return value


def nesting(value: object, stop: int) -> int:
    """How deeply lists and dicts nest in `value` (0 for a scalar), counted without recursion; stops past `stop`."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, depth)
        if depth > stop:
            return depth
        todo.extend((x, depth + 1) for x in v if isinstance(x, (list, dict)))
    return deepest


def whole_arg(lo: int, hi: int | None = None):
    """An argparse type: a whole number from lo (to hi), refused with the same words as every other input."""
    import argparse

    wanted = f"a whole number from {lo} to {hi}" if hi is not None else f"a whole number of at least {lo}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, not {shown(text)}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{shown(value)} is out of range: choose {wanted}")
        return value
    parse.__name__ = "whole number"
    return parse


def positive_arg(text: str) -> float:
    """An argparse type: a finite number above zero."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number above 0, not {shown(text)}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {shown(text)}")
    return value
