"""A run's metadata as typed data: what ran, how it was timed and bounded, and the machine costs that sized it.

The page builds a `RunMeta` for every run and reads its fields directly; a trace stores it as plain JSON
(`to_dict`, the same keys traces have always had) and a loaded trace is checked once, field by field, in
`from_dict`, so that nothing downstream has to guard against what a file might hold. Keys this version does
not know are kept in `extra` and written back on export. No gradio, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from eagle2.inputs import shown

TEXT = ("model", "head", "head_kind", "device", "preset", "prompt", "created")
# settings_meta's keys and the types a figure reads them as (others are kept as they are)
SETTING_TYPES: dict[str, tuple[type, ...]] = {
    **{k: (str,) for k in ("eagle2_method", "sizing", "static_tree")},
    **{k: (int,) for k in ("max_new_tokens", "seed", "total_tokens", "depth", "top_k", "draft_tokens",
                           "static_nodes")},
    **{k: (int, float) for k in ("temperature", "top_p", "min_prob", "expand_prob")},
    "lookup": (bool,), "static_paths": (list,)}


def _fail(where: str, what: str) -> None:
    raise ValueError(f"malformed trace: meta {where} {what}")


def _number(where: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        _fail(where, f"is not a finite number ({shown(v)})")
    return float(v)


def _numbers(where: str, d: object, key=str) -> dict:
    """A {name: number} object (keys converted by `key`, e.g. int for row counts)."""
    if not isinstance(d, dict):
        _fail(where, "is not an object")
    out = {}
    for k, v in d.items():
        try:
            name = key(k)
        except (TypeError, ValueError):
            _fail(where, f"has a key that is not a count ({shown(k, 20)})")
        out[name] = _number(f"{where}[{shown(k, 20)}]", v)
    return out


@dataclass
class TimeLimit:
    """The run's wall-clock budget (both passes) and the methods it ended early, with the timed pass's seconds."""

    seconds: float
    cut: dict[str, float] = field(default_factory=dict)


@dataclass
class Timing:
    """How the page timed the run: each method's decode wall time in the timed pass, and how the two passes
    compared (per tree method True when they gave the same tokens, else the first token where they differ)."""

    decode_s: dict[str, float] = field(default_factory=dict)
    live_cut: bool = False
    same_tokens: dict[str, bool | int] = field(default_factory=dict)


@dataclass
class Costs:
    """The machine profile that sized the run: when and how it was measured, verify ms by rows, the rest of a step
    by depth, and how the run's own verify cost compared with it (`eagle2.tools.profile.check_profile`)."""

    measured: str = ""
    how: str = ""
    verify_ms: dict[int, float] = field(default_factory=dict)
    rest_ms: dict[int, float] = field(default_factory=dict)
    check: dict[str, Any] | None = None

    def to_dict(self) -> dict:
        out: dict = {"measured": self.measured, "how": self.how,
                     "verify_ms": {str(k): v for k, v in self.verify_ms.items()},
                     "rest_ms": {str(k): v for k, v in self.rest_ms.items()}}
        if self.check is not None:
            out["check"] = self.check
        return out


@dataclass
class RunMeta:
    """Everything about a run besides its step records."""

    model: str = ""
    head: str = ""
    head_kind: str = ""
    device: str = ""
    preset: str = ""
    prompt: str = ""
    created: str = ""
    prompt_tokens: int = 0
    settings: dict[str, Any] = field(default_factory=dict)  # settings_meta: plain data the figures read
    costs: Costs | None = None
    limit: TimeLimit | None = None
    timing: Timing | None = None
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)  # method -> step -> pruned nodes not kept
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept for export

    @property
    def greedy(self) -> bool:
        return self.settings.get("temperature", 0.0) == 0.0

    def to_dict(self) -> dict:
        """The trace's "meta" object."""
        out: dict[str, Any] = {**self.extra, **{k: getattr(self, k) for k in TEXT if getattr(self, k)}}
        if self.prompt_tokens:
            out["prompt_tokens"] = self.prompt_tokens
        if self.settings:
            out["settings"] = self.settings
        if self.costs is not None:
            out["costs"] = self.costs.to_dict()
        if self.limit is not None:
            out["budget"] = {"seconds": self.limit.seconds, "cut": dict(self.limit.cut)}
        if self.timing is not None:
            out["page_timing"] = {"decode_s": dict(self.timing.decode_s),
                                  "passes": {"live_cut": self.timing.live_cut,
                                             "same_tokens": dict(self.timing.same_tokens)}}
        if self.dropped:
            out["dropped"] = {m: dict(steps) for m, steps in self.dropped.items()}
        return out

    @classmethod
    def from_dict(cls, d: object) -> "RunMeta":
        """A trace's "meta" object, checked once; ValueError naming the first field that is wrong."""
        if not isinstance(d, dict):
            raise ValueError("malformed trace: 'meta' is not an object")
        d = dict(d)
        meta = cls()
        for k in TEXT:
            if k in d:
                v = d.pop(k)
                if not isinstance(v, str):
                    _fail(f"'{k}'", "is not text")
                setattr(meta, k, v)
        if "prompt_tokens" in d:
            v = d.pop("prompt_tokens")
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                _fail("'prompt_tokens'", "is not a count")
            meta.prompt_tokens = v
        if "settings" in d:
            meta.settings = _settings(d.pop("settings"))
        if "costs" in d:
            meta.costs = _costs(d.pop("costs"))
        if "budget" in d:
            meta.limit = _limit(d.pop("budget"))
        if "page_timing" in d:
            meta.timing = _timing(d.pop("page_timing"))
        if "dropped" in d:
            meta.dropped = _dropped(d.pop("dropped"))
        meta.extra = d
        return meta


def _settings(s: object) -> dict[str, Any]:
    if not isinstance(s, dict):
        _fail("'settings'", "is not an object")
    for k, kinds in SETTING_TYPES.items():
        if k in s:
            v = s[k]
            bad = (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds)
            if bad or (isinstance(v, float) and not math.isfinite(v)):
                _fail(f"settings '{k}'", f"has the wrong type ({shown(v)})")
    return dict(s)


def _costs(c: object) -> Costs:
    if not isinstance(c, dict):
        _fail("'costs'", "is not an object")
    out = Costs(verify_ms=_numbers("costs 'verify_ms'", c.get("verify_ms", {}), int),
                rest_ms=_numbers("costs 'rest_ms'", c.get("rest_ms", {}), int))
    for k in ("measured", "how"):
        v = c.get(k, "")
        if not isinstance(v, str):
            _fail(f"costs '{k}'", "is not text")
        setattr(out, k, v)
    check = c.get("check")
    if check is not None:
        if not isinstance(check, dict) or not isinstance(check.get("ok"), bool):
            _fail("costs 'check'", "is not a profile check")
        for k in ("measured_ms", "predicted_ms", "rows", "ratio"):
            _number(f"costs 'check' '{k}'", check.get(k))
        out.check = dict(check)
    return out


def _limit(b: object) -> TimeLimit:
    if not isinstance(b, dict):
        _fail("'budget'", "is not an object")
    return TimeLimit(seconds=_number("budget 'seconds'", b.get("seconds")),
                     cut=_numbers("budget 'cut'", b.get("cut", {})))


def _timing(t: object) -> Timing:
    if not isinstance(t, dict):
        _fail("'page_timing'", "is not an object")
    out = Timing(decode_s=_numbers("page_timing 'decode_s'", t.get("decode_s", {})))
    passes = t.get("passes", {})
    if not isinstance(passes, dict):
        _fail("page_timing 'passes'", "is not an object")
    out.live_cut = bool(passes.get("live_cut", False))
    same = passes.get("same_tokens", {})
    if not isinstance(same, dict) or not all(v is True or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
                                             for v in same.values()):
        _fail("page_timing 'same_tokens'", "is not a method -> true or token index object")
    out.same_tokens = dict(same)
    return out


def _dropped(d: object) -> dict[str, dict[str, int]]:
    if not isinstance(d, dict):
        _fail("'dropped'", "is not an object")
    out = {}
    for m, steps in d.items():
        if not isinstance(steps, dict) or not all(str(k).isdigit() and isinstance(n, int) and not isinstance(n, bool)
                                                  and n >= 0 for k, n in steps.items()):
            _fail(f"'dropped' {shown(m, 20)}", "is not a step -> count object")
        out[str(m)] = {str(k): n for k, n in steps.items()}
    return out
