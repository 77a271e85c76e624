"""The registry of tree policies and the chain policy: every name resolves, a chain is a chain, it is lossless."""
from __future__ import annotations

import math
import pathlib
import re

import pytest

from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from eagle2.decode.methods import Shared, config_for, settings_of
from eagle2.decode.records import KEPT, ROOT
from eagle2.policies import OURS, PEERS, REGISTRY, policy
from tests.test_engine import PROMPT, reference, tokens

ROOT_DIR = pathlib.Path(__file__).resolve().parent.parent


def test_every_registered_method_builds_a_config_that_names_it_back():
    for name in OURS:
        assert config_for(name, Shared(max_new_tokens=8)).name == name
    assert set(PEERS) == {n for n, p in REGISTRY.items() if p.peer}
    with pytest.raises(ValueError, match="unknown method 'eagle9'; choose from eagle2, "):
        policy("eagle9")


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_chain_equals_generate_and_is_a_chain(tiny, k):
    target, head, tok = tiny
    cfg = config_for("chain", Shared(max_new_tokens=30, chain_tokens=k))
    recs = list(Decoder(target, head, tok).run(PROMPT, cfg))
    assert tokens(recs) == reference(target, PROMPT, 30)
    for r in recs[1:]:
        kept = [n for n in r.nodes if n.status != ROOT and n.status in (KEPT,) or n.verdict is not None]
        assert len(r.verified) == k + 1, "a chain without p_min verifies all k drafts and the root"
        assert all(n.rank == 0 for n in r.nodes[1:]), "every drafted token is the draft's top-1"
        assert [n.depth for n in r.verified] == list(range(k + 1)), "one node a level"
        assert kept


def test_p_min_stops_the_chain_before_an_unlikely_draft(tiny):
    target, head, tok = tiny
    p_min = 0.2
    cfg = config_for("chain", Shared(max_new_tokens=30, chain_tokens=4, p_min=p_min))
    recs = list(Decoder(target, head, tok).run(PROMPT, cfg))
    assert tokens(recs) == reference(target, PROMPT, 30)
    cut = 0
    for r in recs[1:]:
        probs = [n.prob for n in r.verified[1:]]
        assert all(p >= p_min for p in probs)
        drafted = [n for n in r.nodes[1:]]
        if len(r.verified) < 5:  # stopped early: the next draft, drafted but not verified, was below p_min
            cut += 1
            assert drafted[len(probs)].prob < p_min
    assert cut, "this tiny model's drafts are unsure: some chains must stop early"
    assert settings_of(cfg)["p_min"] == p_min


def test_p_min_is_a_chain_setting_only():
    with pytest.raises(ValueError, match="p_min stops a chain early"):
        DecodeConfig(method="eagle2", p_min=0.5)
    with pytest.raises(ValueError, match="top-1 token"):
        DecodeConfig(method="chain", depth=3, top_k=4, total_tokens=4)


def test_no_code_outside_the_registry_compares_a_method_name_with_a_literal():
    names = "|".join(sorted(REGISTRY, key=len, reverse=True))
    compare = re.compile(rf"""(==|!=|\bin|startswith\()\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=|\bin\b)""")
    found = []
    for folder in ("eagle2", "app_parts", "viz", "checks"):
        for path in (ROOT_DIR / folder).rglob("*.py"):
            if path.name == "policies.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if compare.search(line.split("#")[0]):
                    found.append(f"{path.relative_to(ROOT_DIR)}:{i}: {line.strip()}")
    for i, line in enumerate((ROOT_DIR / "app.py").read_text().splitlines(), 1):
        if compare.search(line.split("#")[0]):
            found.append(f"app.py:{i}: {line.strip()}")
    assert not found, "\n".join(found)
