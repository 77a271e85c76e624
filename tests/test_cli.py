"""The command-line contract: `generate --json` fields and `bench` output on the embedded model."""
from __future__ import annotations

import dataclasses
import json

import pytest

from eagle2.__main__ import main

pytestmark = pytest.mark.slow


def test_generate_json_contract(capsys, embedded):
    assert main(["generate", "--prompt", "Name three colours.", "--max-new-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("method", "text", "token_ids", "new_tokens", "target_forwards", "mean_accept_length", "wall_s",
                "tokens_per_s", "steps"):
        assert key in out, key
    assert out["method"] == "eagle2" and out["new_tokens"] == len(out["token_ids"]) <= 12
    # τ leaves out the prefill's forward and its one token (records.tau)
    assert out["mean_accept_length"] == pytest.approx((out["new_tokens"] - 1) / (out["target_forwards"] - 1))
    # where the time went (records.step_phases): the prefill and the drafted steps' phases add up to the wall time
    t = out["time"]
    assert all(v >= 0 for v in t.values()) and t["draft_ms_per_step"] > 0 and t["verify_ms_per_step"] > 0
    phases = sum(t[f"{k}_ms_per_step"] for k in ("draft", "verify", "commit", "rest"))
    assert t["prefill_ms"] + out["steps"] * phases == pytest.approx(out["wall_s"] * 1e3, rel=1e-3, abs=0.05)
    curve = out["replayed_accept_length_by_nodes"]  # 1 node = plain decoding, then up to the 26-node default
    assert len(curve) == 26 and curve[0] == 1.0 and curve == sorted(curve)
    assert main(["generate", "--prompt", "Name three colours.", "--max-new-tokens", "6", "--json",
                 "--method", "eagle2_lookup"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["method"] == out["settings"]["method"] == "eagle2_lookup"
    assert "replayed_accept_length_by_nodes" not in out
    assert main(["generate", "--prompt", "Name three colours.", "--max-new-tokens", "6", "--json",
                 "--method", "eagle1"]) == 0
    static = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["replayed_accept_length_by_nodes"]
    assert len(static) == 26 and static[0] == 1.0 and static == sorted(static)
    # a node budget cuts EAGLE-1's tree breadth first to it; above its 26 nodes the output says it runs whole
    assert main(["generate", "--prompt", "Name three colours.", "--max-new-tokens", "6", "--json",
                 "--method", "eagle1", "--total-tokens", "8"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["settings"]["total_tokens"] == 8 and out["settings"]["tree"] == [[0], [1], [2], [3], [0, 0], [0, 1],
                                                                                  [0, 2]]
    assert max(len(r) for r in out["settings"]["tree"]) == 2 and len(out["replayed_accept_length_by_nodes"]) <= 8
    assert main(["generate", "--prompt", "Hi.", "--max-new-tokens", "4", "--method", "eagle1",
                 "--total-tokens", "40"]) == 0
    assert "runs it whole" in capsys.readouterr().err


def test_generate_plain_text_and_errors(capsys):
    assert main(["generate", "--prompt", "Say hi.", "--method", "vanilla", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["generate", "--prompt", "   "]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--tree", "[[1, 0]]"]) == 2
    assert "prefix-closed" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--top-k", "99"]) == 2
    assert "top_k" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--method", "eagle2_lookup", "--lookup-tokens", "0"]) == 2
    assert "lookup_tokens" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--method", "eagle2", "--min-prob", "0.1"]) == 2
    assert "eagle2_sized" in capsys.readouterr().err  # floors never turn the paper's EAGLE-2 into our variant


def test_lookup_tokens_reach_the_lookup_methods_only():
    import argparse

    from eagle2.tools.cli_common import config_from, decode_args

    p = argparse.ArgumentParser()
    decode_args(p)
    args = p.parse_args(["--lookup-tokens", "4"])
    cfg = config_from(args, "eagle2_lookup")
    assert cfg.method == "eagle2" and cfg.lookup and cfg.lookup_tokens == 4
    assert not config_from(args, "eagle2").lookup and not config_from(args, "eagle1").lookup


def test_bench_writes_the_json_contract(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["Count to five.", "ignored"]}) + "\n" +
                       json.dumps({"prompt": "Name a fruit."}) + "\n")
    out = tmp_path / "res.json"
    assert main(["bench", "--prompts", str(prompts), "--max-new-tokens", "8", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["methods"]) == {"vanilla", "eagle1", "eagle2"}
    for m, r in res["methods"].items():
        assert r["matches_vanilla"] == 1.0, m  # lossless: every prompt equals plain decoding
        for key in ("mean_accept_length", "tokens_per_s", "speedup_vs_vanilla"):
            assert r[key] is not None and r[key] > 0
    assert res["methods"]["vanilla"]["mean_accept_length"] == 1.0
    assert "eagle2" in capsys.readouterr().out


def test_bench_total_tokens_auto_tunes_each_method_for_itself(tmp_path, capsys, monkeypatch):
    from eagle2.tools import autotune

    monkeypatch.setattr(autotune, "SIZES", (4, 8, 16))  # a smaller grid than the real one, to keep the test short
    monkeypatch.setattr(autotune, "DEPTHS", (2, 4))
    monkeypatch.setattr(autotune, "TOP_KS", (4, 10))
    monkeypatch.setattr(autotune, "WARMUP_TOKENS", 16)
    monkeypatch.setattr(autotune, "MIN_PROBS", (0.05, 0.1))
    monkeypatch.setattr(autotune, "EXPAND_TIMES", (2,))
    monkeypatch.setattr(autotune, "FLOOR_CAPS", (8, 16, 26))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Name three rivers."}) + "\n")
    out = tmp_path / "res.json"
    assert main(["bench", "--prompts", str(prompts), "--methods", "vanilla,eagle2,eagle2_sized,eagle1",
                 "--max-new-tokens", "12", "--total-tokens", "auto", "--no-equal-budgets", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    tuned = {m: [autotune.Option(**{k: v for k, v in o.items() if k != "tokens_per_s"}) for o in opts]
             for m, opts in res["tuned"].items() if m != "near_ties"}
    assert set(res["tuned"]["near_ties"]) == {"eagle2", "eagle2_sized", "eagle1"}  # how close the runners-up were
    assert all(t["vs_chosen"] >= 0.9 for ties in res["tuned"]["near_ties"].values() for t in ties)
    # each draft vocabulary (the head's 24,576 tokens, 0: all, and its first 8,192): sizes x depths x top-k for
    # eagle2; floors at caps 8 and 16 at depth 4 for eagle2_sized; EAGLE-1's tree cut to each size
    assert len(tuned["eagle2"]) == 2 * 3 * 2 * 2 and len(tuned["eagle2_sized"]) == 2 * 2 * 2
    assert sorted(o.total_tokens for o in tuned["eagle1"]) == [4, 8, 16]
    vocab = max((0, autotune.NARROW_DRAFT), key=lambda v: autotune.choose(
        [o for o in tuned["eagle2"] if o.draft_tokens == v]).tokens_per_s)  # the tuner's own rule
    for m in ("eagle2", "eagle2_sized"):
        best = autotune.choose([o for o in tuned[m] if o.draft_tokens == vocab])
        got = res["methods"][m]["settings"]
        assert (got["total_tokens"], got["depth"], got["top_k"], got["draft_tokens"]) == \
            (best.total_tokens, best.depth, best.top_k, vocab), m
        assert (got.get("min_prob", 0.0), got.get("expand_prob", 0.0)) == (best.min_prob, best.expand_prob)
    best = autotune.choose(tuned["eagle1"])
    got = res["methods"]["eagle1"]["settings"]
    assert got["total_tokens"] == best.total_tokens == len(got["tree"]) + 1 and got["draft_tokens"] == vocab
    assert "min_prob" not in res["methods"]["eagle2"]["settings"]  # the paper's EAGLE-2 stays unfloored
    assert all(r["matches_vanilla"] == 1.0 for r in res["methods"].values())
    assert "tuned for this machine" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--methods", "vanilla,eagle1", "--max-new-tokens", "4",
                 "--tree", "mc_sim_7b_63", "--total-tokens", "auto", "--no-equal-budgets", "--json", str(out)]) == 0
    assert "tuned" not in capsys.readouterr().err  # nothing to tune: EAGLE-1's tree was given
    assert json.loads(out.read_text())["methods"]["eagle1"]["settings"]["total_tokens"] == 26
    with pytest.raises(SystemExit):
        main(["bench", "--prompts", str(prompts), "--total-tokens", "lots"])
    assert main(["bench", "--prompts", str(prompts), "--methods", "eagle2_sized", "--total-tokens", "auto",
                 "--min-prob", "0.05"]) == 2
    assert "chooses eagle2_sized" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--sweep", "--expand-prob", "0.2"]) == 2
    assert "fixed tree sizes" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--sweep", "--total-tokens", "auto"]) == 2
    assert "--sweep" in capsys.readouterr().err


def test_bench_reports_the_equal_budget_replay(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Name three rivers."}) + "\n")
    out = tmp_path / "res.json"
    assert main(["bench", "--prompts", str(prompts), "--methods", "eagle2,eagle1", "--max-new-tokens", "16",
                 "--total-tokens", "6", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    eq = res["equal_budgets"]
    assert eq["nodes"] == list(range(2, 27))
    for m in ("eagle2", "eagle1"):
        assert len(eq[m]) == 25 and eq[m] == sorted(eq[m]) and eq[m][0] >= 1.0
    assert res["methods"]["eagle1"]["settings"]["total_tokens"] == res["methods"]["eagle2"]["settings"][
        "total_tokens"] == 6  # equal budgets by default


def test_train_rejects_a_soft_label_temperature_that_is_not_above_zero(capsys):
    for bad in ("0", "-1", "warm"):
        with pytest.raises(SystemExit):
            main(["train", "fit", "--data", "x", "--out", "y", "--ce-temperature", bad])
        assert "--ce-temperature" in capsys.readouterr().err


def test_every_tree_method_drafts_over_the_same_vocabulary():
    import argparse

    from eagle2.tools.cli_common import config_from, decode_args, shared_from
    from eagle2.decode.methods import config_for

    p = argparse.ArgumentParser()
    decode_args(p)
    args = p.parse_args([])
    assert args.draft_tokens is None and config_from(args, "eagle2").draft_tokens == 0  # default: all
    args = p.parse_args(["--draft-tokens", "4096"])
    assert {config_from(args, m).draft_tokens for m in ("eagle2", "eagle2_sized", "eagle2_lookup", "eagle1")} == {4096}
    tuned = dataclasses.replace(shared_from(p.parse_args([])), draft_tokens=8192,
                                tuned={"eagle2": {"total_tokens": 5, "depth": 3, "top_k": 4, "draft_tokens": 8192},
                                       "eagle1": {"total_tokens": 9, "draft_tokens": 8192}})
    cfgs = {m: config_for(m, tuned) for m in ("eagle2", "eagle2_lookup", "eagle1", "eagle2_sized")}
    assert {c.draft_tokens for c in cfgs.values()} == {8192}
    assert (cfgs["eagle2_lookup"].total_tokens, cfgs["eagle2_lookup"].depth, cfgs["eagle2_lookup"].top_k) == (5, 3, 4)
    assert len(cfgs["eagle1"].tree) == 8 and cfgs["eagle2_sized"].total_tokens == 26  # untuned: the shared budget


def test_a_broken_training_import_says_so_instead_of_dropping_the_command(monkeypatch, capsys):
    import sys

    from eagle2.__main__ import main

    import eagle2.train

    monkeypatch.setitem(sys.modules, "eagle2.train.cli", None)  # importing it now raises ImportError
    monkeypatch.delattr(eagle2.train, "cli", raising=False)  # (an earlier import left it on the package)
    assert main(["train", "eagle3", "--minutes", "1"]) == 2
    err = capsys.readouterr().err
    assert "python -m eagle2 train` is unavailable" in err and "eagle2.train.cli" in err
