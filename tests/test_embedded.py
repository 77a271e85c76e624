"""The real embedded model (SmolLM2-135M-Instruct, float32 CPU): every method equals transformers' greedy generate."""
from __future__ import annotations

import pytest
import torch

from eagle2.api import run
from eagle2.tools.prompts import read_prompts
from eagle2.config import ASSETS, DecodeConfig
from eagle2.decode.engine import encode_prompt

pytestmark = pytest.mark.slow

PROMPTS = [
    ("What is 2+2? Answer in one short sentence.", 64),   # ends at EOS well before the limit
    ("Write a short poem about autumn leaves.", 40),       # cut by the limit
    ("def fibonacci(n):", 40),                              # code
]


def greedy_reference(target, ids, n):
    """transformers' greedy generate."""
    x = torch.tensor([ids])
    out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def references(embedded):
    """References from a stock copy of the model (the session's bundle runs our kernels and layers)."""
    from eagle2.loading import stock_target

    stock = stock_target(embedded)
    refs = {}
    for text, n in PROMPTS:
        ids = encode_prompt(embedded.tokenizer, text)
        refs[text] = (ids, greedy_reference(stock, ids, n))
    return refs


def test_the_stock_copy_is_the_converted_files_without_our_modules(embedded):
    from eagle2.loading import resolve_model, stock_target

    stock = stock_target(embedded)
    assert embedded.target_path == resolve_model() and stock.name_or_path == embedded.target_path
    assert not any(type(m).__module__.startswith("eagle2.") for m in stock.modules())
    assert any(type(m).__module__.startswith("eagle2.") for m in embedded.target.modules())
    assert sum(p.numel() * p.element_size() for p in stock.parameters()) == 538_060_032  # what the bench adds


@pytest.mark.parametrize("method,lookup", [("eagle2", False), ("eagle1", False), ("eagle2", True)])
def test_greedy_equals_transformers_generate(embedded, references, method, lookup):
    for text, n in PROMPTS:
        ids, ref = references[text]
        res = run(embedded, ids, DecodeConfig(method=method, max_new_tokens=n, lookup=lookup))
        assert res.token_ids == ref, text
    eos = embedded.target.generation_config.eos_token_id
    eos = set(eos) if isinstance(eos, list) else {eos}
    short, limited = references[PROMPTS[0][0]][1], references[PROMPTS[1][0]][1]
    assert short[-1] in eos and len(short) < PROMPTS[0][1]  # the first prompt really ends at EOS
    assert len(limited) == PROMPTS[1][1]                     # the second really hits the limit


def test_limit_inside_an_accepted_path_on_the_real_model(embedded, references):
    ids, _ = references[PROMPTS[1][0]]
    full = run(embedded, ids, DecodeConfig(method="eagle2", max_new_tokens=40))
    step = next((r for r in full.records[1:] if len(r.accepted) >= 2), None)
    if step is None:
        pytest.skip(f"head {embedded.head_name} accepted no 2-token path on this prompt (untrained head?)")
    limit = sum(len(r.new_tokens) for r in full.records if r.step < step.step) + 1
    cut = run(embedded, ids, DecodeConfig(method="eagle2", max_new_tokens=limit))
    assert len(cut.records[-1].accepted) >= 2 and len(cut.records[-1].new_tokens) == 1
    assert cut.token_ids == greedy_reference(embedded.target, ids, limit)


def test_plain_decoding_is_one_token_per_forward(embedded, references):
    ids, ref = references[PROMPTS[0][0]]
    res = run(embedded, ids, DecodeConfig(method="vanilla", max_new_tokens=64))
    assert res.token_ids == ref
    assert res.to_json()["mean_accept_length"] == 1.0


def test_partial_utf8_tokens_are_shown_by_their_bytes(embedded):
    from eagle2.decode.tokens import TokenText

    tok = embedded.tokenizer
    ids = tok("smile 😀 and 中文 مرحبا")["input_ids"]
    shown = [TokenText(tok)(i) for i in ids]
    assert not any("\ufffd" in s for s in shown)
    assert any("\\xf0\\x9f" in s for s in shown)  # the emoji's leading bytes, visible as bytes
    assert "".join(shown).count("م") == 1
    res = run(embedded, "Reply with one emoji: 😀", DecodeConfig(method="eagle2", max_new_tokens=6))
    assert not any("\ufffd" in n.text for r in res.records for n in r.nodes)


def test_lookup_branch_is_accepted_where_the_answer_copies_the_prompt(embedded):
    # an extraction prompt of the copy-heavy bench set: the answer copies dates from the prompt word for word
    # (a "repeat this sentence" prompt is not enough: this model rewords the sentence)
    prompt = read_prompts(ASSETS / "bench" / "copy_heavy.jsonl")[1]
    ids = encode_prompt(embedded.tokenizer, prompt)
    ref = greedy_reference(embedded.target, ids, 40)
    plain = run(embedded, ids, DecodeConfig(max_new_tokens=40))
    looked = run(embedded, ids, DecodeConfig(max_new_tokens=40, lookup=True))
    assert plain.token_ids == ref and looked.token_ids == ref
    by_step = [{n.id: n for n in r.nodes} for r in looked.records]
    accepted_lookup = [by[i] for r, by in zip(looked.records, by_step) for i in r.accepted if by[i].source == "lookup"]
    assert accepted_lookup  # tokens the draft did not propose, copied from the prompt and accepted by the target

    def tau(res):
        return len(res.token_ids) / sum(r.target_forwards for r in res.records)
    assert tau(looked) > tau(plain)
