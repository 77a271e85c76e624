"""The fused few-row Llama layer (eagle2/cpu/layer.py with `fused`, `llama_layer` in the row kernel's extension):
the stock layer's numbers up to float32 rounding in every kind of step the engine takes, the cache written as
the stock update writes it, the same greedy tokens, and the lean path wherever it does not apply."""
from __future__ import annotations

import copy

import pytest
import torch

from eagle2 import cpu
from eagle2.config import DecodeConfig
from eagle2.cpu import rows as rowkernel
from eagle2.decode.cache import new_cache
from eagle2.decode.engine import Decoder
from eagle2.decode.tree import tree_inputs
from tests.conftest import CharTokenizer, tiny_target
from tests.test_q4 import q4_1_like

pytestmark = pytest.mark.skipif(rowkernel.why_not() is not None, reason=f"row kernel not here: {rowkernel.why_not()}")

PLAN = cpu.KernelPlan(onednn=True, stock_rows=0, own_rows=32)
# (rows, tree parents or None): one-row steps (mask of one row), trees (additive masks), causal multi-row steps
STEPS = ((1, None), (4, [-1, 0, 0, 1]), (2, None), (1, None), (6, [-1, 0, 0, 1, 1, 2]), (3, None))


class Counting:
    """The compiled module, counting its fused-layer calls."""

    def __init__(self, module):
        self.module, self.calls = module, 0

    def __getattr__(self, name):
        return getattr(self.module, name)

    def llama_layer(self, *args):
        self.calls += 1
        return self.module.llama_layer(*args)


def kernel_proxy(monkeypatch, wrap):
    """The compiled module wrapped by `wrap` (a counting proxy), handed out by `rowkernel.load` for one test."""
    module = rowkernel.load()
    if module is None:
        pytest.fail(f"the row kernel should build on this machine: {rowkernel.failure()}")
    proxy = wrap(module)
    monkeypatch.setattr(rowkernel, "load", lambda: proxy)
    return proxy


@pytest.fixture
def counting(monkeypatch):
    return kernel_proxy(monkeypatch, Counting)


def models(four_bit: bool, heads: int = 4, kv_heads: int = 2):
    """(stock, fused): the same tiny Llama, the second with FastLinears and fused layers; with `four_bit` its
    weights are GGUF-Q4_1-like values, so the fused layer reads four-bit codes."""
    stock = tiny_target(vocab=32, std=0.5, heads=heads, kv_heads=kv_heads)
    if four_bit:
        with torch.no_grad():
            for i, lin in enumerate(m for m in stock.model.layers.modules() if type(m) is torch.nn.Linear):
                lin.weight.copy_(q4_1_like(*lin.weight.shape, seed=i) * 4)
    fused = copy.deepcopy(stock)
    cpu.accelerate(fused, PLAN)
    assert cpu.swap_layers(fused) == 2 and all(layer.fused for layer in fused.model.layers)
    assert (cpu.four_bit_layers(fused)[0] == 14) == four_bit
    return stock, fused


def steps(model):
    """Hidden states and the cache's keys and values after a prefill and STEPS, as the engine feeds the target."""
    torch.manual_seed(3)
    cache, out = new_cache(model.config), []
    with torch.inference_mode():
        r = model.model(input_ids=torch.randint(0, 32, (1, 9)), cache=cache, use_cache=True)
        for n, parents in STEPS:
            extra = {}
            if parents:
                ti = tree_inputs(parents, cache.get_seq_length(), torch.float32, torch.device("cpu"))
                extra = dict(attention_mask=ti.mask, position_ids=ti.position_ids)
            r = model.model(input_ids=torch.randint(0, 32, (1, n)), cache=cache, use_cache=True,
                            output_hidden_states=True, **extra)
            out += [r.last_hidden_state, *r.hidden_states]
    return out, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


@pytest.mark.parametrize("four_bit", [False, True])
def test_fused_layers_give_the_stock_numbers_in_every_kind_of_step(counting, four_bit):
    stock, fused = models(four_bit)
    (a, ca), (b, cb) = steps(stock), steps(fused)
    assert counting.calls == 2 * len(STEPS)  # every step after the prefill ran fused, in both layers
    assert len(a) == len(b)
    def close(y, x):  # float32 sums in another order, through two layers of large weights (a wrong rotary,
        # mask or cache position is off by the values' own size)
        torch.testing.assert_close(y, x, atol=1e-4 * float(x.abs().max()), rtol=1e-4)

    for x, y in zip(a, b):
        close(y, x)
    for (k1, v1), (k2, v2) in zip(ca, cb):
        assert k1.shape == k2.shape
        close(k2, k1)
        close(v2, v1)


def test_fused_layers_give_the_same_greedy_tokens(counting):
    from eagle2.heads.eagle import new_head

    stock, fused = models(four_bit=True)
    plain = Decoder(stock, new_head(stock, seed=1), CharTokenizer())
    fast = Decoder(fused, new_head(stock, seed=1), CharTokenizer())
    for method in ("vanilla", "eagle2", "eagle1"):
        cfg = DecodeConfig(method=method, max_new_tokens=40, total_tokens=6, depth=3)
        want = [t for r in plain.run([1, 2, 3, 4], cfg) for t in r.new_tokens]
        got = [t for r in fast.run([1, 2, 3, 4], cfg) for t in r.new_tokens]
        assert got == want, method
    assert counting.calls > 0


def test_the_lean_path_runs_where_the_fused_one_does_not_apply(counting):
    stock, fused = models(four_bit=False)
    layer = fused.model.layers[0]
    with torch.inference_mode():
        x = torch.randn(2, 3, 64)                   # a batch of two
        pos = fused.model.rotary_emb(x, torch.arange(3)[None])
        layer(x, position_embeddings=pos, cache=new_cache(fused.config))
        long = torch.randn(1, rowkernel.MAX_ROWS + 1, 64)   # more rows than the kernel takes (a prefill)
        pos = fused.model.rotary_emb(long, torch.arange(long.shape[1])[None])
        layer(long, position_embeddings=pos, cache=new_cache(fused.config))
        one = torch.randn(1, 1, 64)                  # a cache that was never filled: no room to write in
        layer(one, position_embeddings=fused.model.rotary_emb(one, torch.arange(1)[None]), cache=new_cache(fused.config))
    assert counting.calls == 0
    x = torch.randn(1, 2, 64, requires_grad=True)    # autograd: transformers' own forward
    pos = fused.model.rotary_emb(x, torch.arange(2)[None])
    layer(x, position_embeddings=pos).sum().backward()
    assert x.grad is not None and counting.calls == 0
    assert "fused" in repr(fused.model.layers[0])
    off = copy.deepcopy(stock)
    cpu.accelerate(off, PLAN)
    cpu.swap_layers(off, fused=False)
    assert not any(layer.fused for layer in off.model.layers)


# (prompt tokens, heads, key-value heads): head size 16 over a short cache; head size 64 (the embedded model's,
# which sums the values in its own loop) over a cache of several sixteen-key blocks
PROMPTS = ((7, 4, 2), (70, 1, 1))


@pytest.mark.parametrize("prompt_len,heads,kv_heads", PROMPTS)
def test_a_tree_row_gets_the_bits_of_one_row_steps_along_its_path(counting, prompt_len, heads, kv_heads):
    """Each row's norms, attention and sums are its own (masked keys add exact zeros), so a verified node has
    the bits that decoding its path one token at a time gives: a near tie at the argmax resolves the same way in
    every method of ours."""
    _, fused = models(four_bit=True, heads=heads, kv_heads=kv_heads)
    torch.manual_seed(5)
    prompt, tokens, parents = torch.randint(0, 32, (1, prompt_len)), [5, 9, 11, 3, 8], [-1, 0, 0, 1, 2]

    def prefilled():
        cache = new_cache(fused.config)
        fused.model(input_ids=prompt, cache=cache, use_cache=True)
        return cache

    with torch.inference_mode():
        cache = prefilled()
        ti = tree_inputs(parents, cache.get_seq_length(), torch.float32, torch.device("cpu"))
        tree = fused.model(input_ids=torch.tensor([tokens]), attention_mask=ti.mask, position_ids=ti.position_ids,
                           cache=cache, use_cache=True).last_hidden_state[0]
        for node in range(len(tokens)):
            path, i = [], node
            while i >= 0:
                path.insert(0, i)
                i = parents[i]
            cache = prefilled()
            for i in path:  # one row at a time, as plain decoding feeds it
                ti = tree_inputs([-1], cache.get_seq_length(), torch.float32, torch.device("cpu"))
                h = fused.model(input_ids=torch.tensor([[tokens[i]]]), attention_mask=ti.mask,
                                position_ids=ti.position_ids, cache=cache, use_cache=True).last_hidden_state[0, 0]
            assert torch.equal(h, tree[node]), node


@pytest.mark.parametrize("int8_rows", [False, True])
def test_a_draft_heads_layer_runs_fused_with_its_own_rows(counting, int8_rows):
    """An EAGLE head's layer (no input norm; float32 or int8 rows) drafts as its lean layer does, and the output
    stays plain greedy decoding's."""
    from eagle2.heads.eagle import new_head

    stock, fused = models(four_bit=True)
    lean_head, fused_head = new_head(stock, seed=1), new_head(stock, seed=1)
    for h, fuse in ((lean_head, False), (fused_head, True)):
        cpu.accelerate(h, PLAN, int8_rows=int8_rows)
        assert cpu.swap_layers(h, fused=fuse) == 1 and h.layers[0].fused == fuse
    torch.manual_seed(2)
    feats, mask_len = torch.randn(1, 5, 64), 5
    from eagle2.decode.tree import additive_mask
    mask = additive_mask(torch.ones(mask_len, mask_len, dtype=torch.bool).tril(), 0, torch.float32)
    outs = []
    with torch.inference_mode():
        for h in (lean_head, fused_head):
            cache = new_cache(h.config)
            ids, pos = torch.tensor([[1, 2, 3, 4, 5]]), torch.arange(5)[None]
            h(ids[:, :2], feats[:, :2], mask[..., :2, :2], pos[:, :2], cache)     # fills the cache (lean path)
            outs.append(h(ids[:, 2:], feats[:, 2:], mask[..., 2:, :], pos[:, 2:], cache))
    assert counting.calls == 1
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4 * float(outs[0].abs().max()), rtol=1e-4)
    plain = Decoder(stock, lean_head, CharTokenizer())
    fast = Decoder(fused, fused_head, CharTokenizer())
    cfg = DecodeConfig(method="eagle2", max_new_tokens=30, total_tokens=6, depth=3)
    want = [t for r in Decoder(stock, lean_head, CharTokenizer()).run([1, 2, 3], DecodeConfig(method="vanilla",
                                                                                              max_new_tokens=30))
            for t in r.new_tokens]
    assert [t for r in fast.run([1, 2, 3], cfg) for t in r.new_tokens] == want
    assert [t for r in plain.run([1, 2, 3], cfg) for t in r.new_tokens] == want


def test_the_stack_runs_every_layer_in_one_call_with_the_same_bits(counting):
    """`FusedStack`: the body's layers in one kernel call give the bits of the layer-by-layer fused calls, and the
    caches the same keys and values, in every kind of step; where it does not apply it says so (None)."""
    _, fused = models(four_bit=True)
    stack = cpu.fused_stack(fused)
    assert stack is not None
    torch.manual_seed(4)
    prompt = torch.randint(0, 32, (1, 9))
    caches = [new_cache(fused.config), new_cache(fused.config)]
    with torch.inference_mode():
        for cache in caches:
            fused.model(input_ids=prompt, cache=cache, use_cache=True)
        assert stack(prompt[:, :1], None, torch.zeros(1, 1, dtype=torch.long), new_cache(fused.config)) is None
        for n, parents in STEPS:
            ids = torch.randint(0, 32, (1, n))
            past = caches[0].get_seq_length()
            if parents:
                ti = tree_inputs(parents, past, torch.float32, torch.device("cpu"))
                mask, pos = ti.mask, ti.position_ids
            else:
                mask, pos = None, torch.arange(past, past + n)[None]
            calls = counting.calls
            layered = fused.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=caches[0],
                                  use_cache=True).last_hidden_state
            assert counting.calls == calls + 2  # one fused call per layer
            one = stack(ids, mask, pos, caches[1])
            assert counting.calls == calls + 2  # ... and none for the stack: one call for both layers
            assert one is not None and torch.equal(one, layered)
            for a, b in zip(caches[0].layers, caches[1].layers):
                assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        too_many = torch.randint(0, 32, (1, rowkernel.MAX_ROWS + 1))
        past = caches[1].get_seq_length()
        assert stack(too_many, None, torch.arange(past, past + too_many.shape[1])[None], caches[1]) is None
    with torch.enable_grad():
        assert stack(ids, None, pos, caches[1]) is None  # autograd: the body's own forward
    with torch.inference_mode():
        past = caches[1].get_seq_length()
        pos = torch.arange(past, past + 1)[None]
        fused.model.layers[1].fused = False   # a layer turned off after the stack was built: it steps aside
        assert stack(ids[:, :1], None, pos, caches[1]) is None
    assert cpu.fused_stack(fused) is None


def test_a_decoder_with_the_stack_decodes_the_same_tokens_with_fewer_kernel_calls(counting):
    from eagle2.heads.eagle import new_head

    _, fused = models(four_bit=True)
    head = new_head(fused, seed=2)
    cfg = DecodeConfig(method="eagle2", max_new_tokens=24, total_tokens=6, depth=3)
    runs = []
    for stack in (None, cpu.fused_stack(fused)):
        calls = counting.calls
        dec = Decoder(fused, head, CharTokenizer(), stack=stack)
        runs.append(([t for r in dec.run([1, 2, 3, 4], cfg) for t in r.new_tokens], counting.calls - calls))
    assert runs[0][0] == runs[1][0] and len(runs[0][0]) == 24
    assert runs[1][1] < runs[0][1]  # the target's layers ran in the stack's single call
