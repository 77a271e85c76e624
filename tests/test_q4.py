"""Exact four-bit codes (eagle2/cpu/q4.py): found only where every weight is one, the same float32 values back,
and through the row kernel the very bits `rows_linear` gives over the float32 weight."""
from __future__ import annotations

import pytest
import torch

from eagle2 import cpu
from eagle2.cpu import q4
from eagle2.cpu import rows as rowkernel
from eagle2.cpu.linear import FastLinear
from eagle2.cpu.plan import KernelPlan

pytestmark = pytest.mark.skipif(rowkernel.why_not() is not None, reason=f"row kernel not here: {rowkernel.why_not()}")


@pytest.fixture(scope="module")
def built():
    if rowkernel.load() is None:
        pytest.fail(f"the row kernel should build on this machine: {rowkernel.failure()}")


def q4_1_like(n: int, k: int, seed: int, full_span: bool = True) -> torch.Tensor:
    """A weight as GGUF Q4_1 dequantises: per block of 32, half-precision d and m, codes 0..15, (d * j) + m in
    float32. Without `full_span` some blocks never use code 15 (their largest weight is a smaller code)."""
    g = torch.Generator().manual_seed(seed)
    blocks = n * k // 32
    d = (torch.rand(blocks, 1, generator=g) * 0.02).half().float()
    m = (-torch.rand(blocks, 1, generator=g) * 0.15).half().float()
    j = torch.randint(0, 16 if full_span else 13, (blocks, 32), generator=g).float()
    j[:, 0] = 0
    if full_span:
        j[:, 1] = 15
    d[0] = 0  # a constant block
    return ((d * j) + m).reshape(n, k)


@pytest.mark.parametrize("full_span", [True, False])
def test_codes_give_back_every_weight_exactly(built, full_span):
    w = q4_1_like(64, 96, 1, full_span)
    codes = q4.recode(w)
    assert codes is not None
    assert torch.equal(codes.weight().view(torch.int32), w.view(torch.int32))
    assert codes.nbytes() < w.numel() * w.element_size() / 4


def test_a_single_weight_off_the_grid_keeps_float32(built):
    w = q4_1_like(64, 96, 2)
    w[17, 40] = torch.nextafter(w[17, 40], torch.tensor(1.0))   # one ulp
    assert q4.recode(w) is None
    assert q4.recode(torch.randn(64, 96)) is None
    bad = q4_1_like(64, 96, 3)
    bad[3, 3] = float("nan")
    assert q4.recode(bad) is None
    assert q4.recode(torch.zeros(64, 96)) is not None
    assert q4.recode(q4_1_like(64, 96, 4).double()) is None     # float32 only
    assert q4.recode(q4_1_like(6, 64, 5)) is None               # N a multiple of 4


@pytest.mark.parametrize("switches", ["defaults", "codes fetched like the rest", "all off"])
@pytest.mark.parametrize("n,k", [(64, 96), (1536, 576), (576, 1536)])
def test_products_are_the_row_kernels_bits(built, n, k, switches):
    kernel = rowkernel.load()
    kernel.set_eight_rows(switches != "all off")  # five to eight rows in registers, or expanded into L1 (ablate)
    kernel.set_prefetch(switches != "all off")    # codes fetched ahead, or not
    kernel.set_stream_codes(switches == "defaults")  # ahead as non-temporal, or as the rest
    try:
        products_are_the_row_kernels_bits(n, k)
    finally:
        kernel.set_eight_rows(True)
        kernel.set_prefetch(True)
        kernel.set_stream_codes(True)


def products_are_the_row_kernels_bits(n, k):
    w = q4_1_like(n, k, n + k)
    codes = q4.recode(w)
    g = torch.Generator().manual_seed(k)
    bias = torch.randn(n, generator=g)
    one = torch.randn(1, k, generator=g)
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 26, 32):  # each pass of q4_columns
        x = torch.randn(rows, k, generator=g)
        x[0] = one[0]
        got = codes.linear(x, bias)
        assert torch.equal(got, rowkernel.linear(x, w, bias))
        assert torch.equal(got[0], codes.linear(one, bias)[0])  # a row's bits do not depend on the others
        torch.testing.assert_close(got.double(), torch.nn.functional.linear(x.double(), w.double(), bias.double()),
                                   atol=1e-5 * k ** 0.5, rtol=1e-5)


def test_a_float32_d_gives_the_same_bits_too(built):
    """Blocks whose d is float32 rather than half precision: d * j is then not always exact, so the kernel must
    round the product and the sum apart, as the weights were made (a fused multiply-add gives other values)."""
    g = torch.Generator().manual_seed(3)
    tried = 0
    for _ in range(200):
        m = -torch.rand(4, 1, generator=g) * 0.15
        d = (torch.rand(4, 1, generator=g) * 0.3 - m) / 15
        j = torch.randint(0, 16, (4, 32), generator=g).float()
        j[:, 0], j[:, 1] = 0, 15
        w = (d * j) + m
        codes = q4.recode(w)
        if codes is None or torch.equal(codes.d.half().float(), codes.d):
            continue
        tried += 1
        x = torch.randn(2, 32, generator=g)
        assert torch.equal(codes.linear(x), rowkernel.linear(x, w))
    assert tried > 100


@torch.no_grad()
def test_fast_linear_runs_from_codes_where_the_row_kernel_runs(built):
    w = q4_1_like(128, 64, 7)
    lin = torch.nn.Linear(64, 128, bias=False)
    lin.weight.data.copy_(w)
    plan = KernelPlan(onednn=True, stock_rows=0, own_rows=8)
    fast = FastLinear.from_linear(lin, plan.stock_rows, plan.own_rows)
    plain = FastLinear.from_linear(lin, plan.stock_rows, plan.own_rows, four_bit=False)
    assert fast.codes is not None and plain.codes is None and "four-bit" in repr(fast)
    x = torch.randn(3, 64)
    assert torch.equal(fast(x), rowkernel.linear(x, w)) and torch.equal(fast(x), plain(x))
    y = torch.randn(20, 64)   # past own_rows: oneDNN over the float32 weight, as before
    torch.testing.assert_close(fast(y), y @ w.T)
    fast.double()             # the codes follow the weight (shared with lin): float64 has none
    assert fast.codes is None
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False))
    model[0].weight.data.copy_(w)
    cpu.accelerate(model, plan)
    assert cpu.four_bit_layers(model)[0] == 1
    off = torch.nn.Sequential(torch.nn.Linear(64, 128))
    cpu.accelerate(off, plan)  # random weights are not codes
    assert cpu.four_bit_layers(off) == (0, 0)
