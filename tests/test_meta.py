"""A run's metadata: typed on the page, the same JSON keys in a trace, checked once when a trace loads."""
from __future__ import annotations

import json

import pytest

from app_parts.meta import Costs, RunMeta, TimeLimit, Timing

FULL = RunMeta(model="m", head="h", head_kind="eagle1", device="cpu", preset="p", prompt="hi", created="now",
               prompt_tokens=7, settings={"temperature": 0.0, "total_tokens": 5, "eagle2_method": "eagle2"},
               costs=Costs(measured="2026-12-05", how="medians", verify_ms={1: 30.0, 4: 33.0}, rest_ms={2: 5.0},
                           check={"measured_ms": 33.5, "predicted_ms": 33.0, "rows": 4, "ratio": 1.015, "ok": True}),
               limit=TimeLimit(seconds=120.0, cut={"vanilla": 60.0}),
               timing=Timing(decode_s={"eagle2": 1.5}, live_cut=False, same_tokens={"eagle2": True, "eagle1": 4}),
               dropped={"eagle2": {"3": 12}}, extra={"from_a_later_version": [1, 2]})


def test_a_trace_keeps_every_field_and_the_keys_it_does_not_know():
    d = json.loads(json.dumps(FULL.to_dict()))
    assert set(d) >= {"model", "settings", "costs", "budget", "page_timing", "dropped", "from_a_later_version"}
    assert d["costs"]["verify_ms"] == {"1": 30.0, "4": 33.0}  # the keys traces have always had
    assert d["page_timing"]["passes"]["same_tokens"] == {"eagle2": True, "eagle1": 4}
    assert RunMeta.from_dict(d) == FULL
    assert RunMeta.from_dict({}) == RunMeta() and RunMeta().to_dict() == {}


@pytest.mark.parametrize("change, named", [
    ({"prompt": 5}, "'prompt' is not text"),
    ({"settings": []}, "'settings' is not an object"),
    ({"settings": {"temperature": "hot"}}, "settings 'temperature'"),
    ({"settings": {"depth": True}}, "settings 'depth'"),
    ({"costs": {"verify_ms": {"four": 3.0}}}, "costs 'verify_ms'"),
    ({"costs": {"verify_ms": {"4": float("nan")}}}, "not a finite number"),
    ({"budget": {"seconds": "long"}}, "budget 'seconds'"),
    ({"page_timing": {"passes": {"same_tokens": {"eagle2": -1}}}}, "same_tokens"),
    ({"dropped": {"eagle2": {"x": 1}}}, "'dropped'"),
    ({"prompt_tokens": -3}, "'prompt_tokens' is not a count"),
])
def test_a_bad_field_is_refused_once_naming_it(change, named):
    with pytest.raises(ValueError, match="malformed trace") as e:
        RunMeta.from_dict({**FULL.to_dict(), **change})
    assert named in str(e.value)
