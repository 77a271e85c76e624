"""Prompts written by the target itself: the pre-query, the filter that guards the evaluation prompts, resuming."""
from __future__ import annotations

import json

import pytest

from eagle2.decode.engine import encode_prompt
from eagle2.train.instructions import PromptFilter, pre_query_ids, write_instructions

EVAL = ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences.",
        "Tell me a joke."]


def test_filter_drops_copies_of_excluded_prompts_duplicates_and_fragments():
    f = PromptFilter(EVAL, n=6)
    # a 6-word run of an evaluation prompt, in other case and punctuation, inside a longer request
    assert not f.accept("Please: compose an ENGAGING travel blog post, about a recent trip to Japan.")
    assert not f.accept("tell me a joke!")                   # a short excluded prompt, verbatim
    assert not f.accept("Hi there")                          # a fragment
    assert f.accept("Write a short poem about the sea and the wind at night.")
    assert not f.accept("write a short poem about the sea, and the wind at night")  # a duplicate
    assert f.accept("Compose an engaging blog post about baking bread at home.")     # 5 shared words only


@pytest.mark.slow
def test_pre_query_is_the_chat_templates_start_of_a_user_turn(embedded):
    tok = embedded.tokenizer
    prefix = pre_query_ids(tok)
    full = encode_prompt(tok, "How do tides work?")
    assert full[: len(prefix)] == prefix and len(full) > len(prefix) + 3
    assert tok.decode(prefix).endswith("user\n")


@pytest.mark.slow
def test_write_instructions_resumes_and_keeps_only_whole_filtered_prompts(embedded, tmp_path):
    out = tmp_path / "own.jsonl"
    args = dict(exclude=EVAL, temperature=1.0, max_tokens=40, batch_size=8, seed=3)
    assert write_instructions(embedded.target, embedded.tokenizer, out, 3, **args) == 3
    first = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    assert write_instructions(embedded.target, embedded.tokenizer, out, 5, **args) == 5
    rows = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    assert rows[:3] == first and len(rows) == 5
    check = PromptFilter(EVAL)
    assert all(check.accept(p) for p in rows)  # distinct, whole, sized, none sharing 6 words with EVAL
    for p in rows:  # none was cut off by the cap: each fits in fewer tokens than max_tokens
        assert len(embedded.tokenizer(p, add_special_tokens=False)["input_ids"]) < 40


@pytest.mark.slow
def test_openers_start_the_requests_round_robin(embedded, tmp_path):
    out = tmp_path / "own.jsonl"
    n = write_instructions(embedded.target, embedded.tokenizer, out, 4, EVAL, temperature=1.0, max_tokens=40,
                           batch_size=8, seed=5, openers=["Write", "Solve"])
    rows = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    assert n == 4 == len(rows)
    assert all(p.split()[0] in {"Write", "Solve"} and len(p.split()) >= 4 for p in rows)  # the model went on
    assert {p.split()[0] for p in rows} == {"Write", "Solve"}
