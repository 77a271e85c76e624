"""Tree as data: masks, positions and paths, and the tree-masked forward against sequential decoding."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from eagle2.config import DecodeConfig, parse_tree
from eagle2.decode.rerank import Candidate, select_dynamic
from eagle2.decode.tree import ancestor_matrix, depths, tree_inputs
from tests.conftest import tiny_target


def leaf_paths(parents: list[int]) -> list[list[int]]:
    """Root-to-leaf node-index paths, root included (the sequences a tree forward must match)."""
    has_child = {p for p in parents if p >= 0}
    paths = []
    for leaf in range(len(parents)):
        if leaf in has_child:
            continue
        path, i = [], leaf
        while i >= 0:
            path.append(i)
            i = parents[i]
        paths.append(path[::-1])
    return paths


PARENTS = [-1, 0, 0, 1, 1, 2, 3, 5]  # root with two branches of depth 3


def test_tree_inputs_shape_positions_paths():
    ti = tree_inputs(PARENTS, past_len=5, dtype=torch.float32)
    assert ti.mask.shape == (1, 1, 8, 13)
    assert ti.position_ids.tolist() == [[5 + d for d in depths(PARENTS)]] == [[5, 6, 6, 7, 7, 7, 8, 8]]
    assert sorted(map(tuple, leaf_paths(PARENTS))) == sorted([(0, 1, 3, 6), (0, 1, 4), (0, 2, 5, 7)])
    visible = ti.mask[0, 0] == 0
    assert visible[:, :5].all()  # the whole cached prefix is visible to every node
    anc = ancestor_matrix(PARENTS)
    assert torch.equal(visible[:, 5:], anc)
    assert anc[7].nonzero().flatten().tolist() == [0, 2, 5, 7]
    assert not anc[7, 1] and not anc[3, 2]


def test_tree_forward_matches_sequential_along_every_path():
    torch.manual_seed(3)
    model = tiny_target(vocab=32, std=0.2)
    prefix = torch.randint(0, 32, (1, 9))
    tokens = torch.randint(0, 32, (len(PARENTS),))
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(prefix, cache=cache, use_cache=True)
        ti = tree_inputs(PARENTS, 9, torch.float32)
        tree_logits = model(tokens[None], attention_mask=ti.mask, position_ids=ti.position_ids, cache=cache,
                            use_cache=True).logits[0]
        for path in leaf_paths(PARENTS):
            seq = torch.cat([prefix[0], tokens[path]])[None]
            seq_logits = model(seq).logits[0, 9:]
            assert torch.allclose(tree_logits[path], seq_logits, atol=1e-5, rtol=1e-4), path


def _pool(scores_by_parent):
    pool = [Candidate(parent=-1, token=0, depth=0, rank=0, logp=0.0, score=0.0)]
    for parent, logp in scores_by_parent:
        d = pool[parent].depth + 1
        pool.append(Candidate(parent=parent, token=len(pool), depth=d, rank=0, logp=logp,
                              score=pool[parent].score + logp))
    return pool


def test_select_dynamic_keeps_top_scores_connected_and_prefers_shallow_ties():
    pool = _pool([(0, -0.1), (0, -1.0), (0, -2.0), (1, -0.2), (1, -0.9), (2, -0.05), (4, -0.1)])
    kept = select_dynamic(pool, keep=4)
    assert kept[0] == 0 and len(kept) == 5
    best = sorted((-pool[i].score, i) for i in range(1, len(pool)))[:4]
    assert set(kept[1:]) == {i for _, i in best}
    assert all(pool[i].parent in kept for i in kept[1:])
    tie = _pool([(0, -1.0), (0, 0.0), (2, -1.0)])  # node 1 (depth 1) and node 3 (depth 2) tie at -1.0
    assert select_dynamic(tie, keep=2) == [0, 1, 2]


@pytest.mark.parametrize("bad, msg", [
    ("[]", "non-empty"), ("[[0], [1, 0]]", "prefix-closed"), ("[[0], [9]]", "outside"),
    ("not json", "preset"), ("[[0], [0]]", "repeated"), ("[[0], \"x\"]", "integer"),
    (str([[0] * k for k in range(1, 15)]), "deeper"),
])
def test_static_tree_validation_names_the_problem(bad, msg):
    with pytest.raises(ValueError, match=msg):
        parse_tree(bad, top_k=8)


def test_presets_and_config_bounds():
    mc = parse_tree("mc_sim_7b_63", 8)
    assert len(mc) == 25 and max(len(p) for p in mc) == 5
    assert parse_tree("chain_5", 8) == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match="total_tokens"):
        DecodeConfig(total_tokens=1)
    with pytest.raises(ValueError, match="method"):
        DecodeConfig(method="medusa")
