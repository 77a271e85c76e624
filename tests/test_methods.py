"""Method names say what ran: each name's config, EAGLE-1's tree cut to the shared budget, and the refusals."""
from __future__ import annotations

import pytest

from eagle2.config import DecodeConfig, cut_tree, parse_tree
from eagle2.decode.methods import (EAGLE2_KINDS, LABELS, OURS, STATIC_NODES, Shared, budget_note, check_methods,
                                   config_for, settings_of, tunable)


def test_every_name_runs_as_itself_and_says_so():
    for name in OURS:
        cfg = config_for(name, Shared())
        assert cfg.name == name and settings_of(cfg)["method"] == name and name in LABELS
    paper = config_for("eagle2", Shared(min_prob=0.2, expand_prob=0.4))  # floors belong to eagle2_sized only
    assert not paper.sized and not paper.lookup and (paper.min_prob, paper.expand_prob) == (0.0, 0.0)
    sized = config_for("eagle2_sized", Shared(min_prob=0.2))
    assert (sized.min_prob, sized.expand_prob) == (0.2, 0.48)
    assert "(ours)" in LABELS["eagle2_sized"] and "(ours)" in LABELS["eagle2_lookup"] and LABELS["eagle2"] == "EAGLE-2"
    with pytest.raises(ValueError, match="above 0"):
        config_for("eagle2_sized", Shared(min_prob=0.0, expand_prob=0.0))


def test_eagle1_is_cut_breadth_first_to_the_budget():
    whole = parse_tree("mc_sim_7b_63", 20)
    assert STATIC_NODES == len(whole) + 1 == 26
    for n in range(2, 40):
        tree = config_for("eagle1", Shared(total_tokens=n)).tree
        assert len(tree) + 1 == min(n, STATIC_NODES)
        assert list(tree) == sorted(whole, key=lambda p: (len(p), p))[:n - 1]  # level order, ranks in order
        assert all(p[:-1] in set(tree) for p in tree if len(p) > 1)  # still a tree
    assert cut_tree(whole, 5) == ((0,), (1,), (2,), (3,))
    assert config_for("eagle1", Shared(total_tokens=6, tree="[[0], [0, 0]]")).tree == ((0,), (0, 0))  # given: kept
    assert budget_note(Shared(total_tokens=40), ["eagle1"]) and not budget_note(Shared(total_tokens=26), ["eagle1"])
    assert not budget_note(Shared(total_tokens=40), ["eagle2"])


def test_tuned_settings_go_to_their_own_method_and_lookup_variants_follow_their_tree():
    s = Shared(total_tokens=20, tuned={"eagle2": {"total_tokens": 6, "depth": 3, "top_k": 4},
                                       "eagle2_sized": {"total_tokens": 12, "depth": 6, "top_k": 10,
                                                        "min_prob": 0.08, "expand_prob": 0.24},
                                       "eagle1": {"total_tokens": 5}})
    assert [config_for(m, s).total_tokens for m in EAGLE2_KINDS] == [6, 12, 6, 12]
    assert config_for("eagle2_sized_lookup", s).min_prob == 0.08 and config_for("eagle2_lookup", s).min_prob == 0.0
    assert len(config_for("eagle1", s).tree) == 4
    assert tunable(["eagle2_lookup", "eagle1", "vanilla"], tree_given=False) == ["eagle2", "eagle1"]
    assert tunable(["eagle1", "hf_greedy"], tree_given=True) == []


def test_unknown_names_and_stray_floors_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        check_methods(["eagle3"], Shared())
    with pytest.raises(ValueError, match="eagle2_sized"):
        check_methods(["eagle2", "eagle1"], Shared(min_prob=0.1))
    check_methods(["eagle2", "eagle2_sized", "hf_greedy"], Shared(min_prob=0.1))
    assert DecodeConfig(lookup=True, min_prob=0.1).name == "eagle2_sized_lookup"
