"""FastLinear with prepacked oneDNN matmuls (eagle2/cpu): same products, same greedy tokens, training untouched."""
from __future__ import annotations

import copy

import pytest
import torch

from eagle2 import cpu
from eagle2.config import DecodeConfig
from eagle2.cpu import int8, onednn
from eagle2.cpu.linear import FastLinear
from eagle2.decode.engine import Decoder
from tests.conftest import CharTokenizer, tiny_target

pytestmark = pytest.mark.skipif(not onednn.available(torch.zeros(1)), reason="no oneDNN on this machine")


def test_fast_linears_give_the_same_products_and_the_same_greedy_text():
    from eagle2.heads.eagle import new_head

    target = tiny_target(vocab=16, std=0.5)
    head = new_head(target, seed=1)
    x = torch.arange(12)[None] % 16
    with torch.inference_mode():
        before = target(x).logits
    n_linear = sum(type(m) is torch.nn.Linear for m in target.modules())
    plan = cpu.KernelPlan(onednn=True, stock_rows=0, own_rows=0)
    assert cpu.accelerate(target, plan) == n_linear and cpu.accelerate(target, plan) == 0  # twice is harmless
    assert not any(type(m) is torch.nn.Linear for m in target.modules())
    assert "FastLinear" in repr(target) and "oneDNN packed" in repr(target)  # the module tree shows the swap
    assert set(target.state_dict()) == set(tiny_target(vocab=16).state_dict())  # and saves as nn.Linear does
    cpu.accelerate(head, plan)
    with torch.inference_mode():
        after = target(x).logits
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)  # float32 sums in another order
    dec = Decoder(target, head, CharTokenizer(), draft_linear=cpu.draft_linear(plan))
    assert isinstance(dec.draft_rows().logits, cpu.FastLinear)  # the draft's rows are packed too
    plain = [t for r in dec.run([1, 2, 3], DecodeConfig(method="vanilla", max_new_tokens=30)) for t in r.new_tokens]
    for method in ("eagle2", "eagle1"):
        out = [t for r in dec.run([1, 2, 3], DecodeConfig(method=method, max_new_tokens=30)) for t in r.new_tokens]
        assert out == plain, method


def test_training_through_a_fast_layer_uses_autograd():
    lin = FastLinear.from_linear(torch.nn.Linear(8, 4), stock_rows=0, own_rows=0)
    x = torch.randn(3, 8, requires_grad=True)
    lin(x).sum().backward()  # the packed op has no backward: the plain product must have run
    assert x.grad is not None and lin.weight.grad is not None
    with torch.no_grad():
        torch.testing.assert_close(lin(x), x @ lin.weight.T + lin.bias)


def test_load_rejects_unknown_kernels():
    from eagle2.loading import load

    with pytest.raises(ValueError, match="kernels must be one of"):
        load("embedded", kernels="fast")


def test_a_packing_failure_leaves_the_model_as_it_was(monkeypatch):
    target = tiny_target()
    x = torch.arange(6)[None]
    with torch.inference_mode():
        before = target(x).logits
    calls = []

    def flaky(w):
        calls.append(w.shape)
        if len(calls) == 3:
            raise RuntimeError("oneDNN: unsupported")
        return torch.ops.mkldnn._reorder_linear_weight(w, onednn.ROWS_HINT)

    monkeypatch.setattr(onednn, "pack", flaky)
    with pytest.raises(RuntimeError, match="unsupported"):
        cpu.accelerate(target, cpu.KernelPlan(onednn=True))
    assert not any(isinstance(m, FastLinear) for m in target.modules())  # nothing half-switched
    with torch.inference_mode():
        assert torch.equal(target(x).logits, before)


def test_few_rows_keep_pytorchs_kernel_and_more_rows_run_the_packed_one(monkeypatch):
    lin = FastLinear.from_linear(torch.nn.Linear(16, 8), stock_rows=2, own_rows=0)
    used = []
    real = onednn.packed_linear
    monkeypatch.setattr(onednn, "packed_linear", lambda *a: used.append(a[0].shape) or real(*a))
    with torch.inference_mode():
        for rows in (1, 2, 3, 5):
            x = torch.randn(1, rows, 16)
            torch.testing.assert_close(lin(x), x @ lin.weight.T + lin.bias, atol=1e-6, rtol=1e-6)
    assert used == [(1, 3, 16), (1, 5, 16)]  # one and two rows ran PyTorch's own kernel


def test_the_plan_is_timed_once_per_machine_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path))
    target = tiny_target()
    timed = []
    real = onednn.stock_rows
    monkeypatch.setattr(onednn, "stock_rows", lambda *a, **k: timed.append(1) or real(*a, **k))
    first = cpu.plan_for([target])
    assert first.onednn and timed == [1] and len(list(tmp_path.glob("kernels-*.json"))) == 1
    assert cpu.plan_for([target]) == first and timed == [1]  # read back: the same dispatch in every run
    monkeypatch.setenv("EAGLE2_KERNELS_RETIME", "1")
    cpu.plan_for([target])
    assert timed == [1, 1]
    assert cpu.plan_for([target], "torch") == cpu.KernelPlan() and "torch" in cpu.KernelPlan().describe()


def test_stock_rows_keeps_pytorchs_kernel_only_up_to_its_first_loss(monkeypatch):
    layers = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)]
    packed = [onednn.pack(m.weight) for m in layers]
    # timings in call order: (PyTorch's, packed) for 1, 2, 3, ... rows
    script = iter([10.0, 12.0,    # 1 row: PyTorch's 17% faster
                   10.0, 11.0,    # 2 rows: 9% faster
                   10.0, 10.2,    # 3 rows: within MARGIN: packed wins, timing stops here
                   10.0, 20.0])   # (4 rows would favour PyTorch's again: never timed)
    timed, real = [], onednn._best_ms
    monkeypatch.setattr(onednn, "_best_ms", lambda f, reps: timed.append(f()) or next(script))
    assert onednn.stock_rows(layers, packed) == 2
    assert len(timed) == 6
    script = iter([12.0, 10.0])  # the packed kernel wins at one row: it runs everything
    assert onednn.stock_rows(layers, packed) == 0
    monkeypatch.undo()
    assert real(lambda: None, 2) >= 0.0
    assert onednn.stock_rows(layers, packed) in (0, *onednn.CALIBRATE_ROWS)  # real timings: any answer is safe


@pytest.mark.parametrize("int8_rows", [False, True])
def test_a_fast_layer_stays_right_after_to(int8_rows):
    """`.to()` converts the weight; the packed copy, the int8 rows and the tensors forward reads follow it."""
    stock = torch.nn.Linear(32, 8)
    lin = FastLinear.from_linear(copy.deepcopy(stock), stock_rows=1, own_rows=4, int8_rows=int8_rows)
    lin.to(torch.float64)
    stock.to(torch.float64)
    with torch.inference_mode():
        for rows in (1, 3, 6):  # PyTorch's kernel, then the packed one (beyond stock_rows)
            x = torch.randn(rows, 32, dtype=torch.float64)
            torch.testing.assert_close(lin(x), stock(x))
        assert lin.packed is None and lin.q is None  # neither applies to float64 weights
        lin.to(torch.float32)
        stock.to(torch.float32)
        assert lin.packed is not None and (lin.q is not None) == (int8_rows and int8.fits(lin.weight))
        for rows in (1, 3, 6):
            x = torch.randn(rows, 32)
            tol = 0.02 if int8_rows else 1e-5  # int8 rows round each weight to 1/254 of its row's largest
            torch.testing.assert_close(lin(x), stock(x), atol=tol, rtol=tol)


def _tree_steps(model, steps=((1, None), (4, [-1, 0, 0, 1]), (1, None), (3, [-1, 0, 1]))):
    """Hidden states (and every layer's) of a prefill then tree and one-row steps on one cache, as the engine
    feeds the target: an additive 4D mask and explicit positions for a tree."""
    from eagle2.decode.cache import new_cache
    from eagle2.decode.tree import tree_inputs

    torch.manual_seed(3)
    cache, out = new_cache(model.config), []
    with torch.inference_mode():
        ids = torch.randint(0, model.config.vocab_size, (1, 9))
        r = model.model(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=True)
        out += [r.last_hidden_state, *r.hidden_states]
        for n, parents in steps:
            ids = torch.randint(0, model.config.vocab_size, (1, n))
            extra = {}
            if parents:
                ti = tree_inputs(parents, cache.get_seq_length(), torch.float32, torch.device("cpu"))
                extra = dict(attention_mask=ti.mask, position_ids=ti.position_ids)
            r = model.model(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=True, **extra)
            out += [r.last_hidden_state, *r.hidden_states]
    return out


def test_lean_layers_compute_the_stock_layers_numbers_bit_for_bit():
    stock = tiny_target(vocab=32, std=0.5)
    lean = copy.deepcopy(stock)
    assert cpu.swap_layers(lean) == 2 and all(type(l) is cpu.LeanLlamaLayer for l in lean.model.layers)
    assert lean.state_dict().keys() == stock.state_dict().keys()  # the same weights under the same names
    assert "LeanLlamaLayer" in repr(lean)
    a, b = _tree_steps(stock), _tree_steps(lean)
    assert len(a) == len(b) == 5 * 4  # last hidden state and every layer's (hidden states are still recorded)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # autograd goes through the stock forward: training sees transformers' own layer
    x = torch.randn(1, 3, 64, requires_grad=True)
    pos = lean.model.rotary_emb(x, torch.arange(3)[None])
    lean.model.layers[0](x, position_embeddings=pos).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_heads_layer_is_swapped_and_other_dtypes_are_left_alone():
    from eagle2.heads.eagle import new_head

    target = tiny_target()
    head = new_head(target, seed=1)
    assert cpu.swap_layers(head) == 1  # its layer, without an input norm, is swapped too
    assert not head.layers[0]._input_norm
    assert cpu.swap_layers(copy.deepcopy(target).to(torch.float64)) == 0
