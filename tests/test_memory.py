"""Memory over consecutive runs: records hold plain numbers only, and the app path does not grow per run."""
from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.slow


def _plain(value, where: str) -> None:
    """Fail if a record holds anything but plain Python data (a tensor would keep its storage alive)."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            _plain(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _plain(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _plain(v, f"{where}[{k!r}]")
    else:
        assert value is None or isinstance(value, (bool, int, float, str)), f"{where} is a {type(value).__name__}"


def test_repeated_runs_keep_compact_records_and_flat_memory(embedded):
    from checks.memcheck import measure

    rows = measure(embedded, runs=4, max_new_tokens=16, report=None)
    assert [r["run"] for r in rows] == [1, 2, 3, 4]
    assert all(r["tokens"]["eagle2"] == 16 and r["tokens"]["eagle1"] == 16 for r in rows)
    # Same prompt, same settings: every run's records are the same size (up to the digits of the timings),
    # so nothing accumulates in them from one run to the next.
    sizes = [r["trace_kb"] for r in rows]
    assert max(sizes) < 1.01 * min(sizes), sizes
    growth = rows[-1]["rss_mb"] - rows[1]["rss_mb"]
    assert growth < 40, f"resident memory grew {growth:.1f} MiB from the second run to the last: {rows}"


def test_step_records_hold_plain_data_only(embedded):
    from eagle2.api import run
    from eagle2.config import DecodeConfig

    for method in ("eagle2", "eagle1", "vanilla"):
        res = run(embedded, "Name a fruit.", DecodeConfig(method=method, max_new_tokens=8))
        for i, rec in enumerate(res.records):
            _plain(rec, f"{method} step {i}")
