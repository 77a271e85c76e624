"""The command-line contract: `generate --json` fields and `bench` output on the embedded model."""
from __future__ import annotations

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
    assert out["mean_accept_length"] == pytest.approx(out["new_tokens"] / out["target_forwards"])
    curve = out["replayed_accept_length_by_nodes"]  # 1 node = plain decoding, then up to the 26-node default
    assert len(curve) == 26 and curve[0] == 1.0 and curve == sorted(curve)
    assert main(["generate", "--prompt", "Name three colours.", "--max-new-tokens", "6", "--json", "--lookup"]) == 0
    assert "replayed_accept_length_by_nodes" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["generate", "--prompt", "Name three colours.", "--max-new-tokens", "6", "--json",
                 "--method", "eagle1"]) == 0
    static = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["replayed_accept_length_by_nodes"]
    assert len(static) == 26 and static[0] == 1.0 and static == sorted(static)


def test_generate_plain_text_and_errors(capsys):
    assert main(["generate", "--prompt", "Say hi.", "--method", "vanilla", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["generate", "--prompt", "   "]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--tree", "[[1, 0]]"]) == 2
    assert "prefix-closed" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--top-k", "99"]) == 2
    assert "top_k" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--lookup", "--lookup-tokens", "0"]) == 2
    assert "lookup_tokens" in capsys.readouterr().err


def test_lookup_tokens_reach_the_lookup_methods_only():
    import argparse

    from eagle2.__main__ import _decode_args, config_from

    p = argparse.ArgumentParser()
    _decode_args(p)
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


def test_bench_total_tokens_auto_tunes_then_measures(tmp_path, capsys, monkeypatch):
    from eagle2 import autotune

    monkeypatch.setattr(autotune, "SIZES", (4, 8, 16))  # a smaller grid than the real one, to keep the test short
    monkeypatch.setattr(autotune, "DEPTHS", (2, 4))
    monkeypatch.setattr(autotune, "WARMUP_TOKENS", 16)
    monkeypatch.setattr(autotune, "MIN_PROBS", (0.05, 0.1))
    monkeypatch.setattr(autotune, "EXPAND_TIMES", (2,))
    monkeypatch.setattr(autotune, "FLOOR_CAPS", (8, 16, 26))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Name three rivers."}) + "\n")
    out = tmp_path / "res.json"
    assert main(["bench", "--prompts", str(prompts), "--methods", "vanilla,eagle2", "--max-new-tokens", "12",
                 "--total-tokens", "auto", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    chosen = res["settings"]
    assert isinstance(chosen["total_tokens"], int) and isinstance(chosen["depth"], int)
    # sizes x depths, and floors at caps 8 and 16 (up to the largest size) at depth 4 (the only one timed), for
    # each draft vocabulary: the head's 24,576 tokens (0: all) and its first 8,192
    assert len(chosen["tuned"]) == 2 * (6 + 2 * 2)
    fields = ("total_tokens", "depth", "tau", "step_ms", "min_prob", "expand_prob", "nodes", "draft_tokens")
    options = [autotune.Option(**{k: o[k] for k in fields}) for o in chosen["tuned"]]
    best = max((autotune.choose([o for o in options if o.draft_tokens == v]) for v in (0, autotune.NARROW_DRAFT)),
               key=lambda o: o.tokens_per_s)  # the tuner's own rule over the options it reported
    assert ((best.total_tokens, best.depth, best.min_prob, best.expand_prob, best.draft_tokens)
            == (chosen["total_tokens"], chosen["depth"], chosen["min_prob"], chosen["expand_prob"],
                chosen["tuned_draft_tokens"]))
    assert res["methods"]["eagle2"]["matches_vanilla"] == 1.0
    assert "tuned for this machine" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--methods", "vanilla,eagle1", "--max-new-tokens", "4",
                 "--total-tokens", "auto", "--json", str(out)]) == 0  # nothing to tune: no EAGLE-2 method
    assert "tuned" not in capsys.readouterr().err and json.loads(out.read_text())["settings"]["total_tokens"] == 26
    with pytest.raises(SystemExit):
        main(["bench", "--prompts", str(prompts), "--total-tokens", "lots"])
    assert main(["bench", "--prompts", str(prompts), "--total-tokens", "auto", "--min-prob", "0.05"]) == 2
    assert "chooses --min-prob" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--sweep", "--expand-prob", "0.2"]) == 2
    assert "fixed tree sizes" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--sweep", "--total-tokens", "auto"]) == 2
    assert "--sweep" in capsys.readouterr().err


def test_train_rejects_a_soft_label_temperature_that_is_not_above_zero(capsys):
    for bad in ("0", "-1", "warm"):
        with pytest.raises(SystemExit):
            main(["train", "fit", "--data", "x", "--out", "y", "--ce-temperature", bad])
        assert "--ce-temperature" in capsys.readouterr().err


def test_a_tuned_draft_vocabulary_applies_to_eagle2_only():
    import argparse

    from eagle2.__main__ import _decode_args, config_from

    p = argparse.ArgumentParser()
    _decode_args(p)
    args = p.parse_args([])
    assert args.draft_tokens is None and config_from(args, "eagle2").draft_tokens == 0  # default: all
    args.tuned_draft_tokens = 8192
    assert [config_from(args, m).draft_tokens for m in ("eagle2", "eagle2_lookup", "eagle1")] == [8192, 8192, 0]
    args = p.parse_args(["--draft-tokens", "4096"])
    args.tuned_draft_tokens = 8192  # (not set by the tuner when asked for one; an explicit choice wins anyway)
    assert [config_from(args, m).draft_tokens for m in ("eagle2", "eagle1")] == [4096, 4096]
