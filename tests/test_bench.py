"""The bench's table and JSON on a tiny model: equality with greedy is reported only against a greedy run; the
peers run on a stock copy of the target."""
from __future__ import annotations

import pytest
import torch

from eagle2 import cpu
from eagle2.tools.bench import by_category, format_categories, format_phases, format_table, run_bench
from eagle2.tools.prompts import PromptRow, read_rows
from eagle2.config import DecodeConfig
from eagle2.loading import Bundle, stock_target


def _bundle(tiny, path=""):
    target, head, tok = tiny
    return Bundle(target=target, head=head, tokenizer=tok, device=target.device, dtype=target.dtype,
                  model_name="tiny", head_name="random", target_path=path)


def _loaded(tiny, folder) -> Bundle:
    """The tiny target saved to `folder`, then given our CPU layers and attention as `load` gives them."""
    tiny[0].save_pretrained(folder)
    bundle = _bundle(tiny, str(folder))
    assert cpu.swap_layers(bundle.target) == 2 and cpu.use_tree_sdpa(bundle.target)
    return bundle


def _ours(model) -> set[str]:
    return {type(m).__name__ for m in model.modules() if type(m).__module__.startswith("eagle2.")}


def test_the_peers_run_on_a_stock_copy_loaded_once(tiny, tmp_path):
    bundle = _loaded(tiny, tmp_path)
    peer = stock_target(bundle)
    assert _ours(bundle.target) == {"LeanLlamaLayer"} and _ours(peer) == set()  # ours swapped in, the copy stock
    assert peer.config._attn_implementation == "sdpa" and peer is not bundle.target and not peer.training
    assert stock_target(bundle) is peer  # loaded once per bundle
    ours, stock = bundle.target.state_dict(), peer.state_dict()
    assert stock.keys() == ours.keys() and all(torch.equal(v, ours[k]) for k, v in stock.items())  # same weights
    res = run_bench(bundle, ["abcab", "ponm"], ["vanilla", "hf_greedy", "hf_lookup"],
                    lambda m: DecodeConfig(method=m, max_new_tokens=6), 6, progress=lambda _s: None)
    assert [r["matches_vanilla"] for r in res["methods"].values()] == [1.0, 1.0, 1.0]
    assert [len(p["hf_greedy"]) for p in res["per_prompt_tokens"]] == [6, 6]
    assert res["methods"]["hf_greedy"]["settings"] == {"max_new_tokens": 6, "kernels": "stock transformers"}
    assert "stock transformers" in format_table(res).splitlines()[2]


def test_a_target_built_in_memory_has_no_stock_copy_and_needs_none_without_peers(tiny):
    with pytest.raises(ValueError, match="built in memory"):
        run_bench(_bundle(tiny), ["abc"], ["vanilla", "hf_greedy"], lambda m: DecodeConfig(method=m), 4,
                  progress=lambda _s: None)
    assert run_bench(_bundle(tiny), ["abc"], ["vanilla"], lambda m: DecodeConfig(method=m, max_new_tokens=4), 4,
                     progress=lambda _s: None)["methods"]["vanilla"]["new_tokens"] == 4


def test_without_a_greedy_run_equality_is_unknown_not_zero(tiny):
    res = run_bench(_bundle(tiny), ["abcab", "ponm"], ["eagle1", "eagle2"],
                    lambda m: DecodeConfig(method=m, max_new_tokens=6), 6, progress=lambda _s: None)
    assert all(r["matches_vanilla"] is None for r in res["methods"].values())
    assert all(line.split()[5] == "-" for line in format_table(res).splitlines()[1:])  # the "= greedy" column
    assert all(r["speedup_vs_vanilla"] is None for r in res["methods"].values())  # no vanilla run: no "x vanilla"


def test_with_plain_decoding_every_method_matches_it(tiny):
    res = run_bench(_bundle(tiny), ["abcab", "ponm"], ["vanilla", "eagle1", "eagle2"],
                    lambda m: DecodeConfig(method=m, max_new_tokens=6), 6, progress=lambda _s: None)
    assert [r["matches_vanilla"] for r in res["methods"].values()] == [1.0, 1.0, 1.0]
    assert res["methods"]["vanilla"]["mean_accept_length"] == 1.0


def test_accept_length_by_category_adds_up_to_each_prompts_record(tiny, tmp_path):
    prompts, cats = ["abcab", "ponm", "abcabc"], ["copy", "other", "copy"]
    res = run_bench(_loaded(tiny, tmp_path), prompts, ["vanilla", "eagle2", "hf_greedy"],
                    lambda m: DecodeConfig(method=m, max_new_tokens=6), 6, progress=lambda _s: None)
    got = by_category(res, cats)
    assert list(got) == ["copy", "other"]
    for cat, rows in (("copy", [0, 2]), ("other", [1])):
        toks = sum(res["per_prompt_tau_counts"][i]["eagle2"][0] for i in rows)
        fwd = sum(res["per_prompt_tau_counts"][i]["eagle2"][1] for i in rows)
        assert got[cat]["eagle2"] == toks / fwd
        # τ leaves out the prefill: its tokens are every token but each prompt's first
        assert toks == sum(res["per_prompt"][i]["eagle2"] - 1 for i in rows)
        assert got[cat]["vanilla"] == 1.0 and got[cat]["hf_greedy"] is None  # transformers' forwards unknown
    whole = res["methods"]["eagle2"]["mean_accept_length"]
    assert min(got["copy"]["eagle2"], got["other"]["eagle2"]) <= whole <= max(got["copy"]["eagle2"], got["other"]["eagle2"])
    table = format_categories(got).splitlines()
    assert table[0].split()[-2:] == ["vanilla", "eagle2"] and len(table) == 3  # a method without tau is left out
    assert by_category(res, [None, None, None]) == {}


def test_read_rows_keeps_categories(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"turns": ["a b", "c"], "category": "writing"}\n\n{"prompt": "d e"}\n')
    assert read_rows(f) == [PromptRow("a b", "writing"), PromptRow("d e")]
    assert read_rows(f, 1) == [PromptRow("a b", "writing")]
    f.write_text('{"turns": ["a"]}\n{oops\n')
    with pytest.raises(ValueError, match="p.jsonl:2 is not valid JSON"):
        read_rows(f)
    f.write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="none of instruction, turns, prompt"):
        read_rows(f)


def test_runs_in_separate_processes_can_be_checked_token_for_token(tiny):
    """A tau-only run of one method has no greedy reference; its stored outputs let another run's be compared."""
    def run(methods):
        return run_bench(_bundle(tiny), ["abcab", "ponm"], methods,
                         lambda m: DecodeConfig(method=m, max_new_tokens=6), 6, progress=lambda _s: None)

    plain, e2 = run(["vanilla"]), run(["eagle2"])
    assert [p["eagle2"] for p in e2["per_prompt_tokens"]] == [p["vanilla"] for p in plain["per_prompt_tokens"]]
    assert [len(p["eagle2"]) for p in e2["per_prompt_tokens"]] == [p["eagle2"] for p in e2["per_prompt"]]


def test_each_methods_time_splits_its_wall_time_by_the_records_own_timers(tiny):
    prompts = ["abcab", "ponm"]
    res = run_bench(_bundle(tiny), prompts, ["vanilla", "eagle2"], lambda m: DecodeConfig(method=m, max_new_tokens=6),
                    6, progress=lambda s: None)
    for m, r in res["methods"].items():
        t = r["time"]
        assert t["steps"] > 0 and t["verify_ms_per_step"] > 0
        phases = sum(t[f"{k}_ms_per_step"] for k in ("draft", "verify", "commit", "rest"))
        assert t["prefill_ms"] * len(prompts) + phases * t["steps"] == pytest.approx(r["wall_s"] * 1e3, rel=1e-3)
    drafting = {m: r["time"]["draft_ms_per_step"] for m, r in res["methods"].items()}
    assert drafting["eagle2"] > drafting["vanilla"]
    table = format_phases(res).splitlines()
    assert [line.split()[0] for line in table[1:]] == ["vanilla", "eagle2"]
    peers_only = {"methods": {"hf_greedy": {**res["methods"]["vanilla"], "time": None}}}
    assert format_phases(peers_only) == ""
