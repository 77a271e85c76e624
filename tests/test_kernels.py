"""Prepacked oneDNN matmuls (eagle2/kernels.py): same products, same greedy tokens, training untouched."""
from __future__ import annotations

import pytest
import torch

from eagle2 import kernels
from eagle2.config import DecodeConfig
from eagle2.engine import Decoder
from tests.conftest import CharTokenizer, tiny_target

pytestmark = pytest.mark.skipif(not kernels.available(torch.zeros(1)), reason="no oneDNN on this machine")


def test_packed_linears_give_the_same_products_and_the_same_greedy_text():
    from eagle2.head import new_head

    target = tiny_target(vocab=16, std=0.5)
    head = new_head(target, seed=1)
    x = torch.arange(12)[None] % 16
    with torch.inference_mode():
        before = target(x).logits
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in target.modules())
    assert kernels.use_onednn(target) == n_linear and kernels.use_onednn(target) == 0  # twice is harmless
    kernels.use_onednn(head)
    with torch.inference_mode():
        after = target(x).logits
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    dec = Decoder(target, head, CharTokenizer())
    assert dec.draft_rows().packed is not None  # the draft's rows are packed too
    plain = [t for r in dec.run([1, 2, 3], DecodeConfig(method="vanilla", max_new_tokens=30)) for t in r.new_tokens]
    for method in ("eagle2", "eagle1"):
        out = [t for r in dec.run([1, 2, 3], DecodeConfig(method=method, max_new_tokens=30)) for t in r.new_tokens]
        assert out == plain, method
    with kernels.stock(target), torch.inference_mode():
        assert torch.equal(target(x).logits, before)  # the block restores PyTorch's own kernels exactly
    assert all(kernels.patched(m) for m in target.modules() if isinstance(m, torch.nn.Linear))


def test_training_through_a_patched_layer_uses_autograd():
    lin = torch.nn.Linear(8, 4)
    kernels.use_onednn(lin)
    x = torch.randn(3, 8, requires_grad=True)
    lin(x).sum().backward()  # the packed op has no backward: the original forward must have run
    assert x.grad is not None and lin.weight.grad is not None
    with torch.no_grad():
        torch.testing.assert_close(lin(x), x @ lin.weight.T + lin.bias)


def test_load_rejects_unknown_kernels():
    from eagle2.loading import load

    with pytest.raises(ValueError, match="kernels must be one of"):
        load("embedded", kernels="fast")


def test_a_packing_failure_leaves_the_model_on_its_own_kernels(monkeypatch):
    target = tiny_target()
    x = torch.arange(6)[None]
    with torch.inference_mode():
        before = target(x).logits
    calls = []

    def flaky(w):
        calls.append(w.shape)
        if len(calls) == 3:
            raise RuntimeError("oneDNN: unsupported")
        return torch.ops.mkldnn._reorder_linear_weight(w, kernels.ROWS_HINT)

    monkeypatch.setattr(kernels, "pack", flaky)
    with pytest.raises(RuntimeError, match="unsupported"):
        kernels.use_onednn(target)
    assert not any(kernels.patched(m) for m in target.modules())  # nothing half-switched
    monkeypatch.undo()
    assert kernels.use_onednn(target) > 0
    kernels.restore(target)
    assert not any(kernels.patched(m) for m in target.modules())
    with torch.inference_mode():
        assert torch.equal(target(x).logits, before)
