"""The drafting report on the tiny model: every depth and width timed, levels against their memory limit."""
from __future__ import annotations

import pytest

from eagle2.tools import drafting


class _Bundle:  # what the report reads of a loaded bundle (weak-referenceable, as decoder_for keeps one per bundle)
    draft_linear = greedy = stack = None

    def __init__(self, target, head, tokenizer):
        self.target, self.head, self.tokenizer = target, head, tokenizer

    def describe(self) -> str:
        return "tiny"


def test_report_times_every_depth_and_width_and_prices_the_limit():
    from eagle2.heads.eagle import new_head
    from tests.conftest import CharTokenizer, tiny_target

    target = tiny_target(vocab=32)  # the report's prompt is English text: 26 letters for the tiny tokenizer
    head, tok = new_head(target, seed=1), CharTokenizer()
    bundle = _Bundle(target, head, tok)
    r = drafting.report(bundle, depths=(1, 2), widths=(1, 2), rounds=1)
    assert set(r["drafting"]) == {"1", "2"} and all(set(v) == {"1", "2"} for v in r["drafting"].values())
    for by in r["drafting"].values():
        assert by["2"]["step_ms"] >= by["1"]["step_ms"] > 0  # made non-decreasing in depth
        assert by["2"]["per_level_ms"] == pytest.approx(by["2"]["step_ms"] / 2, abs=1e-3)  # both rounded
    h, v = target.config.hidden_size, target.config.vocab_size
    head_weights = sum(p.numel() * 4 for p in list(head.fc.parameters()) + list(head.layers.parameters()))
    assert drafting.draft_bytes(bundle) == head_weights + v * h * 4  # float32 head, all rows
    layers = sum(m.weight.numel() for m in target.model.layers.modules() if hasattr(m, "weight")
                 and m.weight.dim() == 2)
    assert drafting.target_macs_per_row(bundle) == layers
    assert r["extra_row_of_gemm_rate"] is None or r["extra_row_of_gemm_rate"] > 0
    assert set(r["verify_ms"]) == {"1", "2", "3", "8"} and set(r["extra_rows_ms"]) == {"2", "3", "1-8"}
    assert drafting.format_report(r).count("\n") >= 3


def test_the_fma_peak_is_the_arithmetic_of_its_chains():
    """The peak counts 2 flops x 16 lanes x 12 chains a round on every thread: a rate no core can pass (64 flops a
    cycle at 6 GHz) says the chains were optimised away or miscounted, and a rate far under a library's GEMM says the
    chains wait on one another."""
    import torch
    from eagle2.cpu import rows

    if rows.load() is None:
        pytest.skip(f"row kernel not built: {rows.failure()}")
    peak = drafting.fma_gflops(4_000_000)
    assert 0.5 * drafting.gemm_gflops(512) <= peak <= 64 * 6 * torch.get_num_threads()
