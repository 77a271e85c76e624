"""A draft head cheaper than the target (bf16, or int8 weight rows, drafting for a float32 target): the output is
unchanged, the shared embedding is untouched, the draft's probabilities stay close, and `auto` picks int8 where our
row kernel builds, else bf16 only where it pays."""
from __future__ import annotations

import pytest
import torch

from eagle2 import cpu, loading
from eagle2.cpu import onednn
from eagle2.cpu import rows as rowkernel
from eagle2.config import DecodeConfig
from eagle2.decode.engine import Decoder
from eagle2.heads.eagle import new_head
from tests.conftest import CharTokenizer, tiny_target


def _tokens(dec: Decoder, cfg: DecodeConfig) -> tuple[list[int], list]:
    recs = list(dec.run([1, 2, 3], cfg))
    return [t for r in recs for t in r.new_tokens], recs


def _same_output_close_probabilities(ref: Decoder, cheap: Decoder) -> None:
    """Both decode plain greedy's tokens with EAGLE-2 and EAGLE-1; the same first tree is drafted with
    probabilities that agree to the cheap draft's precision, and they really differ."""
    plain, _ = _tokens(ref, DecodeConfig(method="vanilla", max_new_tokens=30))
    for method in ("eagle2", "eagle1"):
        cfg = DecodeConfig(method=method, max_new_tokens=30, total_tokens=12, depth=4)
        out32, recs32 = _tokens(ref, cfg)
        out, recs = _tokens(cheap, cfg)
        assert out == plain and out32 == plain, method
        first32 = {n.id: n.prob for n in recs32[1].nodes if n.depth == 1}
        first = {n.id: n.prob for n in recs[1].nodes if n.depth == 1}
        assert first.keys() == first32.keys()
        assert max(abs(first[i] - first32[i]) for i in first32) < 0.02
        assert any(a.prob != b.prob for a, b in zip(recs32[1].nodes[1:], recs[1].nodes[1:]))


def test_a_bfloat16_draft_keeps_the_output_and_the_targets_embedding():
    target = tiny_target(vocab=16, std=0.5)
    ref_head = new_head(target, seed=1)
    head = new_head(target, seed=1).cast(torch.bfloat16)
    assert head.dtype == torch.bfloat16 and head.fc.weight.dtype == torch.bfloat16
    # the head shares the target's (tied or not) embedding: casting the head must leave it in float32
    assert head.embed_tokens is target.get_input_embeddings() and head.embed_tokens.weight.dtype == torch.float32
    assert target.get_output_embeddings().weight.dtype == torch.float32
    assert head.rotary.inv_freq.dtype == torch.float32
    fp32, bf16 = Decoder(target, ref_head, CharTokenizer()), Decoder(target, head, CharTokenizer())
    assert bf16.head_dtype == torch.bfloat16
    assert bf16.draft_rows().logits(torch.zeros(1, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16
    _same_output_close_probabilities(fp32, bf16)


def test_sampling_with_a_bfloat16_draft_runs_in_the_targets_distribution_code():
    target = tiny_target(vocab=16, std=0.5)
    dec = Decoder(target, new_head(target, seed=1).cast(torch.bfloat16), CharTokenizer())
    recs = list(dec.run([1, 2, 3], DecodeConfig(method="eagle2", max_new_tokens=20, temperature=0.8, seed=3)))
    assert sum(len(r.new_tokens) for r in recs) == 20  # probabilities are float32 where acceptance reads them


@pytest.mark.skipif(rowkernel.why_not() is not None, reason="needs the row kernel")
def test_an_int8_draft_keeps_the_output_and_its_probabilities_stay_close():
    target = tiny_target(vocab=16, std=0.5)
    ref = Decoder(target, new_head(target, seed=1), CharTokenizer())
    head = new_head(target, seed=1)
    plan = cpu.KernelPlan(onednn=True)
    assert cpu.accelerate(head, plan, int8_rows=True) == 8  # fc and the layer's seven linears
    assert all(m.q is not None for m in head.modules() if isinstance(m, cpu.FastLinear))
    dec = Decoder(target, head, CharTokenizer(), draft_linear=cpu.draft_linear(plan, int8_rows=True))
    assert dec.draft_rows().logits.q is not None and target.get_output_embeddings().weight.dtype == torch.float32
    _same_output_close_probabilities(ref, dec)


def test_auto_picks_int8_where_the_row_kernel_builds_else_bfloat16_where_it_pays(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    pick = loading.draft_dtype_for
    monkeypatch.setattr(onednn, "native_bf16", lambda: True)
    monkeypatch.setattr(rowkernel, "load", lambda: object())
    assert pick("auto", torch.float32, cpu, "auto") == "int8"
    assert pick("auto", torch.float32, cpu, "torch") == "float32"       # PyTorch's kernels: keep float32
    monkeypatch.setattr(rowkernel, "load", lambda: None)                # no row kernel here
    if onednn.available(torch.zeros(1)):  # oneDNN present
        assert pick("auto", torch.float32, cpu, "auto") == "bfloat16"
    assert pick("auto", torch.bfloat16, cuda, "auto") == "bfloat16"     # already bf16: the target's own
    assert pick("auto", torch.float16, cuda, "auto") == "float16"
    assert pick("float32", torch.float32, cpu, "auto") == "float32"
    assert pick("bfloat16", torch.float32, cpu, "torch") == "bfloat16"  # asked for: given
    monkeypatch.setattr(onednn, "native_bf16", lambda: False)
    assert pick("auto", torch.float32, cpu, "auto") == "float32"        # emulated bf16 would not pay
    assert not onednn.available(torch.zeros(1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="draft_dtype must be one of auto, float32, bfloat16, int8"):
        pick("half", torch.float32, cpu, "auto")


def test_the_cli_refuses_an_unknown_draft_dtype(capsys):
    from eagle2.__main__ import main

    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "hi", "--draft-dtype", "half"])
    assert "invalid choice: 'half'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_real_model_with_the_other_draft_dtypes_equals_greedy(embedded):
    """Whichever `auto` gave the session's bundle, the other cheap drafts decode the same tokens too."""
    from eagle2.api import decoder_for
    from eagle2.decode.engine import encode_prompt
    from eagle2.heads.eagle import load_head

    ids = encode_prompt(embedded.tokenizer, "Write a short poem about autumn leaves.")
    cfg = DecodeConfig(method="eagle2", max_new_tokens=40)
    base = [t for r in decoder_for(embedded).run(ids, cfg) for t in r.new_tokens]
    plain = [t for r in Decoder(embedded.target, embedded.head, embedded.tokenizer).run(
        ids, DecodeConfig(method="vanilla", max_new_tokens=40)) for t in r.new_tokens]
    assert base == plain and len(plain) == 40
    for other in {"bfloat16", "int8"} - {embedded.draft_dtype}:
        head = load_head(loading.DEFAULT_HEAD, embedded.target)  # PyTorch's kernels for this copy
        linear = None
        if other == "int8":
            if rowkernel.why_not() is not None:
                continue
            cpu.accelerate(head, cpu.KernelPlan(), int8_rows=True)
            linear = cpu.draft_linear(cpu.KernelPlan(), int8_rows=True)
        else:
            head.cast(torch.bfloat16)
        dec = Decoder(embedded.target, head, embedded.tokenizer, draft_linear=linear)
        mine = [t for r in dec.run(ids, cfg) for t in r.new_tokens]
        assert mine == plain, other
    dtype = str(embedded.dtype).removeprefix("torch.")
    assert (f"draft {embedded.draft_dtype}" in embedded.describe()) == (embedded.draft_dtype != dtype)
