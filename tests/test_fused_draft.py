"""A draft level in one kernel call (eagle2/cpu/level.py, `DraftLevel` in the row kernel's extension): the same
trees as the head's own PyTorch operations, step by step (every candidate, its parent, its status, its probability
up to float32 rounding), in EAGLE-2's, EAGLE-1's, a chain's and a prompt-lookup branch's levels; the output is
plain greedy decoding's; and the drafter's usual path wherever it does not apply."""
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
        self.module, self.rows = module, []

    def __getattr__(self, name):
        return getattr(self.module, name)

    def DraftLevel(self, *args):  # noqa: N802 (the extension's class name)
        level, rows = self.module.DraftLevel(*args), self.rows

        class Counted:
            def run(self, tokens, *rest):
                rows.append(tokens.numel())
                return level.run(tokens, *rest)
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
    assert counting.rows == []  # the plain decoder never calls it
    fast = list(fused.run(prompt, cfg))
    assert counting.rows, "the fused level never ran"
    assert max(counting.rows) <= rowkernel.MAX_ROWS
    assert [t for r in fast for t in r.new_tokens] == [t for r in slow for t in r.new_tokens] == want
    assert len(fast) == len(slow)
    for a, b in zip(slow, fast):
        assert shape(a) == shape(b), a.step
        for x, y in zip(a.nodes, b.nodes):
            assert y.prob == pytest.approx(x.prob, rel=1e-4, abs=1e-7)
            assert y.score == pytest.approx(x.score, rel=1e-4, abs=1e-5)


def test_the_first_step_and_long_rows_take_the_usual_path(counting):
    """The head cache is empty before the first step (no room yet) and a prompt longer than the kernel's rows
    cannot go through it: both are drafted as before, and the text is still plain decoding's."""
    plain, fused = decoders()
    prompt = [1, 2, 3] * 15  # 45 pairs reach the head at the first step: more than the kernel's 32 rows
    cfg = DecodeConfig(method="eagle2", max_new_tokens=12, total_tokens=4, depth=2, top_k=4)
    fast = list(fused.run(prompt, cfg))
    assert [t for r in fast for t in r.new_tokens] == [t for r in plain.run(prompt, cfg) for t in r.new_tokens]
    assert counting.rows and all(n <= rowkernel.MAX_ROWS for n in counting.rows)
    drafted_levels = sum(max(n.depth for n in r.nodes) for r in fast[1:])
    assert len(counting.rows) < drafted_levels  # the first step's root went the usual way


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
