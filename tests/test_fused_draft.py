"""A draft level in one kernel call (eagle2/cpu/level.py, `DraftLevel` in the row kernel's extension): the same
trees as the head's own PyTorch operations, step by step (every candidate, its parent, its status, its probability
up to float32 rounding), in EAGLE-2's, EAGLE-1's, a chain's and a prompt-lookup branch's levels; the output is
plain greedy decoding's; and the drafter's usual path wherever it does not apply. EAGLE-2's whole step in one
call (`DraftLevel::grow`) grows the tree its levels grow one call each, node for node and bit for bit."""
from __future__ import annotations

import pytest
import torch

from eagle2 import cpu
from eagle2.config import DecodeConfig
from eagle2.cpu import rows as rowkernel
from eagle2.decode.engine import Decoder
from eagle2.heads.eagle import new_head
from tests.conftest import CharTokenizer
from tests.test_fused_layer import PLAN, kernel_proxy, models

pytestmark = pytest.mark.skipif(rowkernel.why_not() is not None, reason=f"row kernel not here: {rowkernel.why_not()}")


class CountingLevels:
    """The compiled module, counting the rows each fused draft level ran."""

    def __init__(self, module):
        self.module, self.rows, self.grown = module, [], []  # rows a level ran; pairs each whole step fed

    def __getattr__(self, name):
        return getattr(self.module, name)

    def DraftLevel(self, *args):  # noqa: N802 (the extension's class name)
        level, rows = self.module.DraftLevel(*args), self.rows

        grown = self.grown

        class Counted:
            def run(self, tokens, *rest):
                rows.append(tokens.numel())
                return level.run(tokens, *rest)

            def grow(self, tokens, *rest):
                grown.append(tokens.numel())
                return level.grow(tokens, *rest)
        return Counted()


@pytest.fixture
def counting(monkeypatch):
    return kernel_proxy(monkeypatch, CountingLevels)


def decoders():
    """(plain, fused): the same four-bit target and int8 head, drafting through PyTorch's operations and through
    one kernel call per level."""
    _, target = models(four_bit=True)
    head = new_head(target, seed=1)
    with torch.no_grad():  # sharp attention, so that a wrong position or mask shows in the probabilities
        for proj in (head.layers[0].self_attn.q_proj, head.layers[0].self_attn.k_proj):
            proj.weight.mul_(40)
    cpu.accelerate(head, PLAN, int8_rows=True)
    assert cpu.swap_layers(head) == 1
    linear = cpu.draft_linear(PLAN, int8_rows=True)
    plain = Decoder(target, head, CharTokenizer(), draft_linear=linear)
    fused = Decoder(target, head, CharTokenizer(), draft_linear=linear, draft_level=cpu.draft_level)
    return plain, fused


def shape(rec):
    return [(n.parent, n.token, n.depth, n.rank, n.status, n.verdict, n.source) for n in rec.nodes]


CONFIGS = {
    "eagle2": DecodeConfig(method="eagle2", max_new_tokens=40, total_tokens=6, depth=3, top_k=4),
    "eagle2 wide": DecodeConfig(method="eagle2", max_new_tokens=40, total_tokens=12, depth=4, top_k=10),
    "eagle1": DecodeConfig(method="eagle1", max_new_tokens=40, tree=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))),
    "chain": DecodeConfig(method="chain", max_new_tokens=40, total_tokens=4, depth=3, top_k=1),
    "lookup": DecodeConfig(method="eagle2", max_new_tokens=40, total_tokens=6, depth=3, top_k=4, lookup=True,
                           lookup_tokens=4),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_fused_level_grows_the_trees_the_heads_own_operations_grow(counting, name):
    plain, fused = decoders()
    cfg = CONFIGS[name]
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]  # repeats: the lookup branch has something to offer
    want = [t for r in plain.run(prompt, DecodeConfig(method="vanilla", max_new_tokens=40)) for t in r.new_tokens]
    slow = list(plain.run(prompt, cfg))
    assert counting.rows == counting.grown == []  # the plain decoder never calls it
    fast = list(fused.run(prompt, cfg))
    assert counting.rows or counting.grown, "the fused level never ran"
    assert all(n <= rowkernel.MAX_ROWS for n in counting.rows)
    # the paper's EAGLE-2 grows each step in one call; the other trees level by level, and so does a step with a
    # prompt-lookup continuation to add (one without grows in one call: the tree is the paper's)
    if name.startswith("eagle2"):
        assert len(counting.grown) == len(fast) - 1 and counting.rows == []
    elif name == "lookup":
        assert counting.rows and len(counting.grown) < len(fast) - 1
    else:
        assert counting.grown == []
    assert [t for r in fast for t in r.new_tokens] == [t for r in slow for t in r.new_tokens] == want
    assert len(fast) == len(slow)
    for a, b in zip(slow, fast):
        assert shape(a) == shape(b), a.step
        for x, y in zip(a.nodes, b.nodes):
            assert y.prob == pytest.approx(x.prob, rel=1e-4, abs=1e-7)
            assert y.score == pytest.approx(x.score, rel=1e-4, abs=1e-5)


def test_the_first_step_feeds_the_whole_prompt_in_pieces_of_the_kernels_rows(counting, monkeypatch):
    """Before the first step the head cache is empty, and the prompt's pairs can be more than the kernel's 32 rows:
    they go through it in pieces of 32 (each over the keys the pieces before it wrote), and the text is still plain
    decoding's, level by level and in one call a step alike."""
    plain, fused = decoders()
    prompt = [1, 2, 3] * 15  # 45 pairs reach the head at the first step: more than the kernel's 32 rows
    cfg = DecodeConfig(method="eagle2", max_new_tokens=12, total_tokens=4, depth=2, top_k=4)
    want = [t for r in plain.run(prompt, cfg) for t in r.new_tokens]
    monkeypatch.setattr(cpu.FusedDraft, "GROW", False)
    levels = list(fused.run(prompt, cfg))
    assert [t for r in levels for t in r.new_tokens] == want
    assert counting.rows[:2] == [32, 13] and all(n <= rowkernel.MAX_ROWS for n in counting.rows)
    monkeypatch.setattr(cpu.FusedDraft, "GROW", True)
    counting.rows.clear()
    whole = list(fused.run(prompt, cfg))
    assert [t for r in whole for t in r.new_tokens] == want
    assert counting.grown[0] == 45 and counting.rows == []  # the kernel cuts the pieces itself
    assert [shape(r) for r in whole] == [shape(r) for r in levels]


GROWTHS = [DecodeConfig(method="eagle2", max_new_tokens=30, total_tokens=n, depth=d, top_k=k)
           for n, d, k in ((2, 1, 4), (3, 2, 4), (6, 3, 4), (12, 4, 10), (26, 6, 10), (8, 5, 1), (5, 3, 2))]


@pytest.mark.parametrize("cfg", GROWTHS, ids=lambda c: f"{c.total_tokens}n-d{c.depth}-k{c.top_k}")
def test_a_step_grown_in_one_call_is_the_tree_its_levels_grow(counting, monkeypatch, cfg):
    """`DraftLevel::grow` against `DraftTree.grow_dynamic` over the same level kernel: every candidate (parent,
    token, depth, rank, status, expansion) and its cumulative score to the last bit, every step; the prompt as
    long as the kernel's rows, and longer."""
    _, fused = decoders()
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [4, 1, 5, 9, 2, 6] * 7):
        monkeypatch.setattr(cpu.FusedDraft, "GROW", False)
        levels = list(fused.run(prompt, cfg))
        monkeypatch.setattr(cpu.FusedDraft, "GROW", True)
        counting.grown.clear()
        whole = list(fused.run(prompt, cfg))
        assert len(counting.grown) == len(whole) - 1  # every step after the prefill, in one call
        assert len(whole) == len(levels)
        for a, b in zip(levels, whole):
            assert [(n.parent, n.token, n.depth, n.rank, n.status, n.expanded, n.score, n.prob) for n in a.nodes] == \
                   [(n.parent, n.token, n.depth, n.rank, n.status, n.expanded, n.score, n.prob) for n in b.nodes]
            assert a.new_tokens == b.new_tokens


def test_it_applies_only_to_int8_eagle_heads_with_a_fused_layer():
    _, target = models(four_bit=True)
    linear = cpu.draft_linear(PLAN, int8_rows=True)
    rows = linear(target.get_output_embeddings().weight.detach())
    float_head = new_head(target, seed=1)
    cpu.accelerate(float_head, PLAN, int8_rows=False)
    cpu.swap_layers(float_head)
    assert cpu.draft_level(float_head, rows) is None  # float32 fc and layer
    int8_head = new_head(target, seed=1)
    cpu.accelerate(int8_head, PLAN, int8_rows=True)
    assert cpu.draft_level(int8_head, rows) is None  # its layer is not fused yet
    cpu.swap_layers(int8_head)
    assert cpu.draft_level(int8_head, rows) is not None
    assert cpu.draft_level(int8_head, torch.nn.Linear(64, 32)) is None  # rows the kernel cannot read
