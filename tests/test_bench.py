"""The bench's table and JSON on a tiny model: equality with greedy is reported only against a greedy run."""
from __future__ import annotations

from types import SimpleNamespace

from eagle2.bench import format_table, run_bench
from eagle2.config import DecodeConfig


def _bundle(tiny):
    target, head, tok = tiny
    return SimpleNamespace(target=target, head=head, tokenizer=tok, device=target.device)


def test_without_a_greedy_run_equality_is_unknown_not_zero(tiny):
    res = run_bench(_bundle(tiny), ["abcab", "ponm"], ["eagle1", "eagle2"],
                    lambda m: DecodeConfig(method=m, max_new_tokens=6), 6, progress=lambda _s: None)
    assert all(r["matches_vanilla"] is None for r in res["methods"].values())
    assert all(line.split()[-1] == "-" for line in format_table(res).splitlines()[1:])


def test_with_plain_decoding_every_method_matches_it(tiny):
    res = run_bench(_bundle(tiny), ["abcab", "ponm"], ["vanilla", "eagle1", "eagle2"],
                    lambda m: DecodeConfig(method=m, max_new_tokens=6), 6, progress=lambda _s: None)
    assert [r["matches_vanilla"] for r in res["methods"].values()] == [1.0, 1.0, 1.0]
    assert res["methods"]["vanilla"]["mean_accept_length"] == 1.0
