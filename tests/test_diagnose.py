"""The workload diagnosis: replayed shapes against real decoding, conformance, engine constraints, the JSON contract."""
from __future__ import annotations

import json
import random
import re

import pytest

from eagle2.tools import diagnose
from eagle2.tools import workload as wl
from eagle2.config import DecodeConfig, cut_tree
from eagle2.decode.engine import Decoder
from eagle2.tools.serving import (ConstraintError, Shape, check_sglang, sglang_flags, tensorrt_llm_config,
                            vllm_config)

_rng = random.Random(3)
PROMPTS = [[_rng.randrange(1, 16) for _ in range(_rng.randrange(3, 9))] for _ in range(6)]
RECORD = DecodeConfig(max_new_tokens=10, **diagnose.RECORD)


@pytest.fixture
def decodes(tiny):
    target, head, tok = tiny
    dec = Decoder(target, head, tok, eos_ids=set())
    return dec, [list(dec.run(ids, RECORD)) for ids in PROMPTS]


def _first_step(dec, ids, cfg) -> int:
    """Tokens the first drafted step of a real decode commits (its context equals the recording's)."""
    return len([r for r in dec.run(ids, cfg) if r.nodes][0].new_tokens)


def _agrees(replayed: tuple[int, bool], real: int) -> bool:
    tokens, exact = replayed
    return tokens == real if exact else tokens <= real


def test_replayed_shapes_equal_decoding_them_for_real_on_the_first_step(decodes):
    dec, runs = decodes
    exact = 0
    for ids, records in zip(PROMPTS, runs):
        s = wl.steps_of(records)[0]
        for length in (1, 2, 4, 7):
            got = wl.chain(s, length)
            exact += got[1]
            assert _agrees(got, _first_step(dec, ids, DecodeConfig(total_tokens=length + 1, depth=length, top_k=1,
                                                                      max_new_tokens=10)))
        for n in (2, 5, 12, 26):
            cfg = DecodeConfig(method="eagle1", tree=cut_tree(wl.STATIC_TREE, n), max_new_tokens=10)
            assert _agrees(wl.eagle1(s, n), _first_step(dec, ids, cfg))
        for n, d, k in ((4, 2, 10), (8, 3, 10), (16, 5, 10), (60, 7, 10), (8, 3, 4), (16, 4, 2)):
            tokens, ok = wl.eagle2_by_budget(s, d, k, n)
            real = _first_step(dec, ids, DecodeConfig(total_tokens=n, depth=d, top_k=k, max_new_tokens=10))
            assert tokens[-1] == real if ok else tokens[-1] <= real
    assert exact  # some chains were replayed exactly, not only bounded
    assert max(len(r.accepted) for records in runs for r in records) >= 2  # paths accepted beyond one level


def test_curves_match_the_recorded_run_at_its_own_shape(decodes):
    _, runs = decodes
    for records in runs:
        steps = wl.steps_of(records)
        c = wl.curves(steps)
        assert c.tokens["eagle2 60,7"] == [len(s.record.new_tokens) for s in steps]
        assert c.inexact["eagle2 60,7"] == 0 and c.inexact["eagle1 26"] >= 0


def test_conformance_checks_pass_on_a_workload(decodes):
    _, runs = decodes
    got = wl.conformance([s for records in runs for s in wl.steps_of(records)])
    assert got["top1_is_chain"]["passed"] and got["top1_is_chain"]["checked"] > 0
    assert got["sibling_never_shortens"]["passed"] and got["sibling_never_shortens"]["checked"] > 0


def test_sglang_constraints_are_enforced_and_named():
    assert "--speculative-num-draft-tokens 8" in sglang_flags(Shape(3, 4, 8))
    with pytest.raises(ConstraintError, match=r"topk \+ \(steps - 1\) \* topk\^2 = 6"):
        check_sglang(Shape(2, 2, 8))  # 7 draft tokens; two levels of top-2 hold 2 + 4
    with pytest.raises(ConstraintError, match="must equal --speculative-num-steps \\+ 1"):
        check_sglang(Shape(3, 1, 6))
    check_sglang(Shape(3, 1, 4))
    with pytest.raises(ConstraintError, match="at least 2"):
        check_sglang(Shape(1, 4, 1))


def test_vllm_and_tensorrt_llm_constraints():
    assert vllm_config(Shape(4, 1, 5))["num_speculative_tokens"] == 4
    with pytest.raises(ConstraintError, match="vllm: .*chain"):
        vllm_config(Shape(3, 4, 8))
    trt = tensorrt_llm_config(Shape(3, 4, 8))
    assert trt["max_total_draft_tokens"] == 7 and trt["use_dynamic_tree"] and trt["dynamic_tree_max_topK"] == 4
    with pytest.raises(ConstraintError, match="tensorrt_llm: max_total_draft_tokens \\(2\\) must be at least"):
        tensorrt_llm_config(Shape(3, 4, 3))
    with pytest.raises(ConstraintError, match="tensorrt_llm: .*<= dynamic_tree_max_topK"):
        tensorrt_llm_config(Shape(2, 2, 8))


def _flags(text: str) -> Shape:
    def get(name: str) -> int:
        return int(re.search(rf"--speculative-{name} (\d+)", text).group(1))

    return Shape(get("num-steps"), get("eagle-topk"), get("num-draft-tokens"))


def test_report_follows_the_json_contract(decodes):
    _, runs = decodes
    rows = [{"id": i, "category": "even" if i % 2 else "odd"} for i in range(1, len(runs) + 1)]
    out = json.loads(json.dumps(diagnose.report(rows, runs, {1: 30.0, 8: 40.0, 64: 120.0},
                                                {d: 8.0 * d for d in range(1, 8)})))
    assert set(out) >= {"per_prompt", "by_category", "position", "recommended", "conformance"}
    for p, records in zip(out["per_prompt"], runs):
        assert set(p) >= {"id", "category", "tokens", "tau", "collapses"}
        assert p["tokens"] == sum(len(r.new_tokens) for r in records)
        assert list(p["tau"]["chain"]) == [str(n) for n in range(1, 8)]
        assert list(p["tau"]["eagle1"]) == [str(n) for n in range(2, 27)]
        assert len(p["tau"]["eagle2"]) == 59 * 7 and "60,7" in p["tau"]["eagle2"]
        assert p["tau"]["eagle2"]["60,7"] == pytest.approx(p["recorded"]["tau"], abs=1e-3)
    assert set(out["by_category"]) == {"even", "odd"}
    rec = out["recommended"]
    assert set(rec) >= {"cpu", "gpu", "sglang", "vllm", "tensorrt_llm"}
    shape = _flags(rec["sglang"])
    check_sglang(shape)
    assert (shape.steps, shape.topk, shape.num_draft_tokens) == (rec["gpu"]["steps"], rec["gpu"]["topk"],
                                                                 rec["gpu"]["num_draft_tokens"])
    pos = out["position"]
    assert pos["accepted"][0][0] <= pos["reached"][0][0] <= pos["drafted"][0][0]
    assert set(pos["definitions"]) == {"conditional", "mean"}
    assert all(v["passed"] for v in out["conformance"].values())


@pytest.mark.slow
def test_cli_on_the_real_model(tmp_path):
    from eagle2.__main__ import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"category": "qa", "turns": ["Name three primary colours."]}) + "\n")
    out = tmp_path / "r.json"
    assert main(["diagnose", "--prompts", str(prompts), "--limit", "1", "--max-new-tokens", "24", "--json",
                 str(out), "--html", str(tmp_path / "r.html")]) == 0
    got = json.loads(out.read_text())
    assert len(got["per_prompt"]) == 1 and got["per_prompt"][0]["tau"]["eagle2"]
    check_sglang(_flags(got["recommended"]["sglang"]))
    assert all(v["passed"] for v in got["conformance"].values())
    assert "plotly" in (tmp_path / "r.html").read_text().lower()


def test_html_report_has_the_curves_and_heatmaps(decodes):
    from viz.workload import report_html

    _, runs = decodes
    out = diagnose.report([{"id": 1, "category": "a"}], runs[:1])
    page = report_html(json.loads(json.dumps(out)))
    assert page.count("plotly-graph-div") >= 3 and "EAGLE-1 cut" in page and "accepted / reached" in page
    assert "cpu" not in out["recommended"]  # no costs measured: no CPU pick, the GPU profile still
