"""Our row kernel (eagle2/cpu/rows.py): the float32 product, rows independent of each other, and the dispatch
FastLinear builds around it."""
from __future__ import annotations

import pytest
import torch

from eagle2 import cpu
from eagle2.cpu import onednn
from eagle2.cpu import rows as rowkernel
from eagle2.cpu.linear import FastLinear
from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from tests.conftest import CharTokenizer, tiny_target

pytestmark = pytest.mark.skipif(rowkernel.why_not() is not None or not onednn.available(torch.zeros(1)),
                                reason=f"row kernel not available here: {rowkernel.why_not()}")


@pytest.fixture(scope="module")
def built():
    if rowkernel.load() is None:
        pytest.fail(f"the row kernel should build on this machine: {rowkernel.failure()}")


@pytest.mark.parametrize("n,k", [(8, 16), (13, 37), (1537, 576), (4, 1536)])
def test_products_match_a_float64_reference(built, n, k):
    g = torch.Generator().manual_seed(n * k)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for rows in (1, 3, 4, 7, 16):
        x = torch.randn(2, rows, k, generator=g)
        ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
        got = rowkernel.linear(x, w, b)
        assert got.shape == (2, rows, n) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, atol=1e-5 * k ** 0.5, rtol=1e-5)
        torch.testing.assert_close(rowkernel.linear(x, w).double(), ref - b.double(), atol=1e-5 * k ** 0.5, rtol=1e-5)


@pytest.mark.parametrize("k", [576, 1536])  # 1536: more than 1,024 features, so a coarser int16 step
def test_int8_rows_with_int16_inputs_stay_within_the_inputs_rounding_and_rows_stay_independent(built, k):
    # The draft head's int8 rows sum inputs rounded to int16 (where the CPU has AVX512-VNNI): each output is
    # within scale_t max|x - s z| |q_t|_1 of the exact product of the int8 rows, a row's bits do not depend on
    # the rows beside it, and switched off the float32 sums give the same values to float32 rounding.
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-128, 128, (64, k), dtype=torch.int8, generator=g)
    scale, bias = torch.rand(64, generator=g) * 0.01, torch.randn(64, generator=g)
    x = torch.randn(9, k, generator=g)
    x[:, 7] *= 100  # an outlier: the rounding to int16 is at its coarsest
    exact = x.double() @ (q.double() * scale.double()[:, None]).T + bias.double()
    got = rowkernel.q8_linear(x, q, scale, bias)
    step = x.abs().amax(1, keepdim=True).double() / min(16383, (2 ** 31 - 1) // (128 * k))  # the int16 step
    room = scale.double() * step * q.double().abs().sum(1)
    assert bool(((got.double() - exact).abs() <= room + 1e-4 * exact.abs() + 1e-5).all())
    alone = torch.cat([rowkernel.q8_linear(x[i:i + 1], q, scale, bias) for i in range(len(x))])
    assert torch.equal(got, alone)
    kernel = rowkernel.load()
    kernel.set_int16_sums(False)
    try:
        floats = rowkernel.q8_linear(x, q, scale, bias)
    finally:
        kernel.set_int16_sums(True)
    torch.testing.assert_close(floats.double(), exact, atol=1e-3, rtol=1e-5)
    if rowkernel.int16_sums(k):
        assert not torch.equal(floats, got)  # two ways of summing, both checked above
    bad = x.clone()
    bad[2, 5], bad[4, 9] = float("nan"), float("inf")  # such rows give NaN, as float32 sums would; others stay
    out = rowkernel.q8_linear(bad, q, scale, bias)
    assert bool(out[[2, 4]].isnan().all()) and torch.equal(out[[0, 1, 3, 5, 6, 7, 8]], got[[0, 1, 3, 5, 6, 7, 8]])


@pytest.mark.parametrize("k", [64, 576, 1536])
def test_the_int16_inputs_are_each_row_over_its_step_rounded_half_to_even(built, k):
    # What the int8 rows sum, pinned to the bit: z = x / s rounded half to even (clamped), s = max|x| / zmax in
    # double, the integer sums exact, then float32 (sum) * (scale * s) + bias, the last two fused. Rows of zeros,
    # tiny and huge values and exact halves take the same rule.
    if not rowkernel.int16_sums(k):
        pytest.skip("no AVX512-VNNI here: the int8 rows sum float32 inputs")
    g = torch.Generator().manual_seed(k)
    q = torch.randint(-128, 128, (48, k), dtype=torch.int8, generator=g)
    scale, bias = torch.rand(48, generator=g) * 0.01, torch.randn(48, generator=g)
    x = torch.randn(6, k, generator=g)
    x[1] = 0.0
    x[2] *= 1e-30
    x[3] *= 1e30
    x[4, 3] *= 1000
    x[5] = torch.arange(k) % 7 - 3.0  # max 3: steps land on exact halves
    zmax = min(16383, (2 ** 31 - 1) // (128 * k))
    top = x.double().abs().amax(1, keepdim=True)
    step = torch.where(top > 0, top / zmax, torch.ones_like(top))
    z = (x.double() / step).round().clamp(-zmax, zmax).long()
    # the product and the bias in one fused multiply-add (the product exact in double, the sum rounded to float32)
    want = ((z @ q.long().T).float().double() * (scale * step.float()).double() + bias.double()).float()
    assert torch.equal(rowkernel.q8_linear(x, q, scale, bias), want)


def test_a_row_gets_the_same_bits_whatever_rows_share_the_call(built):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1031, 200, generator=g)  # K and N off the kernel's block sizes: the tails count too
    x = torch.randn(rowkernel.MAX_ROWS, 200, generator=g)
    alone = torch.cat([rowkernel.linear(x[i:i + 1], w) for i in range(len(x))])
    for rows in range(1, rowkernel.MAX_ROWS + 1):
        assert torch.equal(rowkernel.linear(x[:rows], w), alone[:rows]), rows
    # PyTorch's own and oneDNN's kernels make no such promise; the tree's rows rely on ours for it
    shifted = torch.cat([x[5:], x[:5]])
    assert torch.equal(rowkernel.linear(shifted, w)[-5:], alone[:5])


def test_dispatch_by_rows_and_the_same_greedy_text(built, monkeypatch):
    target = tiny_target(vocab=16, std=0.5)
    from eagle2.heads.eagle import new_head

    head = new_head(target, seed=1)
    dec = Decoder(target, head, CharTokenizer())
    plain = [t for r in dec.run([1, 2, 3], DecodeConfig(method="vanilla", max_new_tokens=30)) for t in r.new_tokens]
    assert cpu.accelerate(target, cpu.KernelPlan(onednn=True, stock_rows=0, own_rows=3)) > 0
    lin = next(m for m in target.modules() if isinstance(m, FastLinear))
    assert lin.own_rows == 3 and "row kernel up to 3 rows" in repr(lin)
    used, real = [], rowkernel.linear
    monkeypatch.setattr(rowkernel, "linear", lambda x, *a: used.append(x.shape[-2]) or real(x, *a))
    with torch.inference_mode():
        for rows in (1, 3, 4):
            x = torch.randn(1, rows, lin.in_features)
            torch.testing.assert_close(lin(x), x @ lin.weight.T + (0 if lin.bias is None else lin.bias),
                                       atol=1e-5, rtol=1e-5)
    assert used == [1, 3]  # four rows went to the packed kernel
    monkeypatch.undo()
    for method in ("vanilla", "eagle2", "eagle1"):
        out = [t for r in dec.run([1, 2, 3], DecodeConfig(method=method, max_new_tokens=30)) for t in r.new_tokens]
        assert out == plain, method


def test_own_rows_takes_row_counts_up_to_the_first_confirmed_loss(built, monkeypatch):
    layers = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)]
    packed = [onednn.pack(m.weight) for m in layers]
    # timings in call order: (the other, ours) per timing; the other is PyTorch's up to few=1, then packed
    script = iter([10.0, 10.0,               # 1 row: a tie goes to ours
                   10.0, 12.0, 10.0, 10.3,   # 2 rows: ours 20% slower once, within MARGIN when retimed
                   10.0, 11.0, 10.0, 11.0,   # 3 rows: 10% slower twice: stop
                   10.0, 1.0])               # (never timed)
    timed = []
    monkeypatch.setattr(onednn, "_best_ms", lambda f, reps: timed.append(f()) or next(script))
    assert onednn.own_rows(layers, packed, few=1) == 2 and len(timed) == 10
    script = iter([10.0, 12.0, 10.0, 12.0])
    assert onednn.own_rows(layers, packed, few=1) == 0
    monkeypatch.undo()
    assert onednn.own_rows(layers, packed, few=1) in (0, *onednn.OWN_ROWS)  # real timings: any answer is safe


def test_bfloat16_layers_never_take_the_row_kernel():
    lin = torch.nn.Linear(8, 8).to(torch.bfloat16)
    if not onednn.available(lin.weight):
        pytest.skip("no native bf16 here")
    assert FastLinear.from_linear(lin, stock_rows=0, own_rows=8).own_rows == 0


def test_turned_off_it_says_why(monkeypatch):
    monkeypatch.setenv("EAGLE2_ROW_KERNEL", "0")
    assert "EAGLE2_ROW_KERNEL=0" in rowkernel.why_not()


def _layer_call(kernel, *, past=0, kv_heads=2, shapes=None, norm2=None, M=1):
    """llama_layer on a tiny layer (hidden 64, 4 heads of 16, 2 key/value heads), `shapes` replacing projections."""
    H, heads, D, I, room = 64, 4, 16, 128, 8
    good = [(heads * D, H), (2 * D, H), (2 * D, H), (H, heads * D), (I, H), (I, H), (H, I)]
    none_u8, none_f = torch.empty(0, dtype=torch.uint8), torch.empty(0)
    lins = []
    for n, k in (shapes or good):
        lins += [torch.randn(n, k) * 0.1, none_u8, none_f, none_f]
    kv = torch.zeros(max(kv_heads, 1), room, D)
    return kernel.llama_layer(torch.randn(M, H), torch.ones(H), torch.ones(H) if norm2 is None else norm2, 1e-5,
                              lins, torch.ones(M, D), torch.zeros(M, D), kv, kv.clone(), past, none_f, 0.25, heads,
                              kv_heads)


def test_bad_shapes_are_refused_not_read_past(built):
    """Arguments the kernel cannot handle raise an error instead of reading or writing outside the tensors."""
    kernel = rowkernel.load()
    assert _layer_call(kernel).shape == (1, 64) and _layer_call(kernel, M=0).shape == (0, 64)
    H, D, I = 64, 16, 128
    good = [(4 * D, H), (2 * D, H), (2 * D, H), (H, 4 * D), (I, H), (I, H), (H, I)]
    bad_projections = [[*good[:1], (2 * D, H + 16), *good[2:]], [*good[:3], (H, 4 * D + 32), *good[4:]],
                       [*good[:4], (I, H + 16), *good[5:]]]
    for kwargs in [{"past": -1}, {"kv_heads": 0}, {"norm2": torch.ones(8)}] + [{"shapes": s} for s in bad_projections]:
        with pytest.raises(RuntimeError):
            _layer_call(kernel, **kwargs)
    x, q = torch.randn(2, 32), torch.randint(-127, 128, (8, 32), dtype=torch.int8)
    with pytest.raises(RuntimeError):
        kernel.q8_linear(x, q, torch.ones(1), None)             # one scale for eight rows
    with pytest.raises(RuntimeError):
        kernel.q8_linear(x, q, torch.ones(8), torch.zeros(1))   # one bias for eight outputs
    with pytest.raises(RuntimeError):
        kernel.q8_upper(x, q, torch.ones(8), torch.zeros(1))    # one slack for eight rows
    codes = torch.randint(0, 256, (8, 16), dtype=torch.uint8)
    empty = rowkernel.q4_linear(torch.empty(0, 32), codes, torch.rand(8, 1), torch.rand(8, 1), None)
    assert empty.shape == (0, 8)                                # no rows: nothing read, nothing written
