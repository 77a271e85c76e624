"""Cost profiles measured on other devices (a lent GPU) and stored with the project, for the page to draw beside
this machine's own.

A stored profile has the fields of this machine's profile that price a step (`verify_ms` by verified rows,
`rest_ms` by draft depth at full width, `rest_ms_by_width` by width then depth), plus the device's name and the
date it was measured. `checks/gpucheck.py` measures one with the tuner's own timers (`autotune.time_verify`,
`autotune.time_drafting_by_width`) and writes it; copied into `assets/profiles/`, the page draws it as a
projection from costs measured elsewhere, never as a run. Reading needs no torch: the page's parts import this.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from ..config import ASSETS

FOLDER = ASSETS / "profiles"
HOW = ("verify timed at each size in 8 interleaved rounds (the first a warm-up) over a 192-token cache and drafting "
       "at each depth and width in 3 rounds, each cost the median of its rounds, made non-decreasing in rows and "
       "depth (autotune.time_verify, autotune.time_drafting_by_width)")


def profiles_dir() -> Path:
    """assets/profiles, or the folder named by the EAGLE2_PROFILES environment variable."""
    return Path(os.environ.get("EAGLE2_PROFILES") or FOLDER)


def slug(device: str, date: str) -> str:
    """A file name for a device's profile of a date: lower case letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", f"{device} {date}".lower()).strip("-")


def _ms_table(value: object) -> dict[int, float] | None:
    """{int: float} from a JSON object of positive numbers keyed by integers, or None when it is not one."""
    if not isinstance(value, dict) or not value:
        return None
    try:
        out = {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError):
        return None
    return out if all(k > 0 and v > 0 for k, v in out.items()) else None


def parse_profile(data: object) -> dict | None:
    """A stored profile with its tables keyed by integers, or None when `data` lacks what a cost chart needs
    (a device name, a date, a one-row verify cost and drafting costs)."""
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data[k] for k in ("device", "date")):
        return None
    verify, rest = _ms_table(data.get("verify_ms")), _ms_table(data.get("rest_ms"))
    if verify is None or rest is None or 1 not in verify:
        return None
    widths = data.get("rest_ms_by_width") if isinstance(data.get("rest_ms_by_width"), dict) else {}
    by_width = {int(w): t for w, t in ((w, _ms_table(t)) for w, t in widths.items() if str(w).isdigit()) if t}
    return {**data, "verify_ms": verify, "rest_ms": rest, "rest_ms_by_width": by_width}


def stored_profiles(folder: Path | None = None) -> list[dict]:
    """Every readable profile in `folder` (default `profiles_dir()`), by device then date; a file that is not
    one is named on stderr and left out, so that one bad file does not hide the others or break the page."""
    folder = folder or profiles_dir()
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            profile = parse_profile(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            profile = None
        if profile is None:
            print(f"eagle2: {path} is not a cost profile (device, date, verify_ms with 1 row, rest_ms); left out",
                  file=sys.stderr)
            continue
        out.append(profile)
    return sorted(out, key=lambda p: (p["device"], p["date"]))


def projected_label(profile: dict) -> str:
    """How a chart names a curve priced with a stored profile: a projection, not a run."""
    return f"projected from costs measured on {profile['device']}, {profile['date']}"


def make_profile(device: str, date: str, verify_ms: dict[int, float], rest_by_width: dict[int, dict[int, float]],
                 width: int, **about) -> dict:
    """A profile to store: the verify costs, the drafting costs at every timed width (`rest_ms` at `width`, the
    full width the page's break-even line uses) and `about` (model, head, dtype, software), rounded to 0.01 ms."""
    def table(ms: dict[int, float]) -> dict[str, float]:
        return {str(k): round(v, 2) for k, v in sorted(ms.items())}

    return {"device": device, "date": date, **about, "how": HOW, "verify_ms": table(verify_ms),
            "rest_ms": table(rest_by_width[width]),
            "rest_ms_by_width": {str(w): table(t) for w, t in sorted(rest_by_width.items())}}
