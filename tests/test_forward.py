"""The forward report: ms per verify forward by rows beside the time the weights take to read at this machine's
measured bandwidth."""
from __future__ import annotations

import torch

import eagle2.tools.forward as forward
from eagle2.loading import Bundle


def test_the_report_times_each_row_count_against_the_memory_limit(tiny, monkeypatch):
    target, head, tok = tiny
    bundle = Bundle(target=target, tokenizer=tok, head=head, device=torch.device("cpu"), dtype=torch.float32,
                    model_name="tiny", head_name="random")
    monkeypatch.setattr(forward, "warmup_texts", lambda n=None: ["abcabcabca"])
    monkeypatch.setattr(forward, "BUFFER_MB", 64)
    linears = sum(m.weight.numel() * 4 + (m.bias.numel() * 4 if m.bias is not None else 0)
                  for m in target.modules() if isinstance(m, torch.nn.Linear))
    norms = sum(p.numel() * 4 for n, p in target.named_parameters() if "norm" in n)
    buffers = sum(b.numel() * 4 for b in target.buffers())  # the rotary frequencies
    assert forward.weight_bytes(bundle) == linears + norms + buffers  # embedding rows are looked up, not read whole
    r = forward.report(bundle, rows=(1, 2, 4))
    assert list(r["rows"]) == ["1", "2", "4"] and r["bandwidth_gbs"] > 0
    ms = [v["ms"] for v in r["rows"].values()]
    assert ms == sorted(ms)  # costs never fall as rows grow
    for v in r["rows"].values():
        assert abs(v["of_limit"] - r["limit_ms"] / v["ms"]) < 0.01
    text = forward.format_report(r)
    assert "GB/s" in text and text.count("\n") == 2 + 3
