"""Serving engines' settings as input: each engine's example parses to its policy, runs losslessly, and a setting
the engine would refuse is refused with the engine, the flag and the constraint."""
from __future__ import annotations

import json

import pytest

from eagle2.decode.engine import Decoder
from eagle2.decode.methods import Shared
from eagle2.tools.engines import EXAMPLES, ConstraintError, engine_config, parse_engine_flags, which_engine
from tests.test_engine import PROMPT, reference, tokens

WANT = {
    "sglang": ("eagle2", {"total_tokens": 8, "depth": 3, "top_k": 4},
               "SGLang: steps 3, topk 4, 8 draft tokens (root counted)"),
    "vllm": ("chain", {"chain_tokens": 3, "p_min": 0.0}, "vLLM: num_speculative_tokens 3, method eagle (a chain)"),
    "tensorrt_llm": ("eagle2", {"total_tokens": 9, "depth": 3, "top_k": 4}, None),
    "openvino": ("eagle2", {"total_tokens": 9, "depth": 3, "top_k": 3}, None),
    "llama.cpp": ("chain", {"chain_tokens": 4, "p_min": 0.75},
                  "llama.cpp: --spec-draft-n-max 4, --spec-draft-p-min 0.75 (a chain)"),
}


@pytest.mark.parametrize("engine", list(EXAMPLES))
def test_each_engines_example_maps_to_its_policy(engine):
    run = parse_engine_flags(EXAMPLES[engine])
    policy, settings, terms = WANT[engine]
    assert (run.engine, run.policy, run.settings) == (engine, policy, settings)
    if terms:
        assert run.terms == terms
    assert (run.reading is not None) == (engine in ("tensorrt_llm", "openvino")), "readings are labelled as ours"


@pytest.mark.parametrize("engine", list(EXAMPLES))
def test_each_engines_example_runs_and_equals_greedy(tiny, engine):
    target, head, tok = tiny
    run, cfg = engine_config(EXAMPLES[engine], Shared(max_new_tokens=24, total_tokens=40, depth=6, top_k=2))
    assert cfg.name == run.policy and cfg.method != "vanilla"
    if run.policy == "eagle2":  # the engine's tree, not the shared settings'
        assert (cfg.total_tokens, cfg.depth, cfg.top_k) == tuple(run.settings[k] for k in ("total_tokens", "depth",
                                                                                           "top_k"))
    recs = list(Decoder(target, head, tok).run(PROMPT, cfg))
    assert tokens(recs) == reference(target, PROMPT, 24)


@pytest.mark.parametrize("text, words", [
    ("--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 8",
     ["sglang", "--speculative-eagle-topk 1", "--speculative-num-draft-tokens must equal", "(4)"]),
    ("--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 9",
     ["sglang", "--speculative-num-draft-tokens - 1 must be <=", "= 6"]),
    ("--speculative-num-steps 3 --speculative-eagle-topk 4", ["sglang", "--speculative-num-draft-tokens"]),
    ("--speculative-num-steps three --speculative-eagle-topk 4 --speculative-num-draft-tokens 8",
     ["sglang", "--speculative-num-steps must be a whole number"]),
    ('{"method": "eagle", "num_speculative_tokens": 0}', ["vllm", "num_speculative_tokens must be at least 1"]),
    ('--speculative-config {"method": "eagle"}', ["vllm", "needs num_speculative_tokens"]),
    ("max_draft_len=2, max_total_draft_tokens=20, use_dynamic_tree=True, dynamic_tree_max_topK=3",
     ["tensorrt_llm", "max_total_draft_tokens (20) must be <="]),
    ("max_draft_len=4, max_total_draft_tokens=3, use_dynamic_tree=True, dynamic_tree_max_topK=3",
     ["tensorrt_llm", "must be at least max_draft_len"]),
    ("num_assistant_tokens=2, branching_factor=2, tree_depth=3", ["openvino", "must be at least tree_depth"]),
    ("--spec-draft-n-max 4 --spec-draft-p-min 1.5", ["llama.cpp", "--spec-draft-p-min is a probability"]),
    ("--spec-draft-n-max 40", ["llama.cpp", "at most 12"]),
    ("--speculative-num-steps 3 --spec-draft-n-max 4", ["mix engines", "llama.cpp, sglang"]),
    ("--temperature 0.7", ["no engine's speculative-decoding settings", "sglang:"]),
])
def test_settings_an_engine_would_refuse_name_the_engine_flag_and_constraint(text, words):
    with pytest.raises(ConstraintError) as e:
        parse_engine_flags(text)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_flag_forms_and_extra_flags_are_read_as_the_engine_does():
    run = parse_engine_flags("python -m sglang.launch_server --model m --speculative-algorithm EAGLE "
                             "--speculative-num-steps=5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 6")
    assert (run.policy, run.settings["chain_tokens"]) == ("chain", 5)
    assert which_engine("vllm serve m --speculative-config '{\"num_speculative_tokens\": 2}'") == "vllm"
    run = parse_engine_flags("speculative_config:\n  decoding_type: Eagle\n  max_draft_len: 2\n")
    assert (run.policy, run.settings["chain_tokens"]) == ("chain", 2)


def test_diagnose_judges_an_engines_own_settings_by_their_replayed_shape(tiny):
    from eagle2.tools import diagnose
    from tests.test_diagnose import PROMPTS, RECORD

    target, head, tok = tiny
    dec = Decoder(target, head, tok, eos_ids=set())
    runs = [list(dec.run(ids, RECORD)) for ids in PROMPTS]
    rows = [{"id": i, "category": "c"} for i in range(1, len(runs) + 1)]
    verify, draft = {1: 30.0, 8: 40.0, 64: 120.0}, {d: 8.0 * d for d in range(1, 8)}
    sglang = parse_engine_flags(EXAMPLES["sglang"])
    out = diagnose.report(rows, runs, verify, draft, engine=sglang)
    e = out["engine"]
    assert e["replayed_as"] == "eagle2 8,3,4" and e["terms"] == sglang.terms
    runs_curves = [(s, diagnose.wl.curves(s, top_ks=diagnose.TOP_KS)) for s in map(diagnose.wl.steps_of, runs)]
    assert e["tau"] == pytest.approx(diagnose.wl.pooled_tau([(s, c.tokens["eagle2 8,3,4"]) for s, c in runs_curves]),
                                     abs=1e-4)
    step_ms = 40.0 + 3 * 8.0  # 8 rows verified, 3 levels drafted
    assert e["cpu_vs_plain"] == pytest.approx(e["tau"] * 30.0 / step_ms, abs=1e-3)
    chain = diagnose.report(rows, runs, verify, draft, engine=parse_engine_flags("--spec-draft-n-max 3"))["engine"]
    assert chain["replayed_as"] == "chain 3"
    assert chain["tau"] == pytest.approx(out["overall"]["tau"]["chain"]["3"], abs=1e-3)
    odd = diagnose.report(rows, runs, verify, draft, engine=parse_engine_flags(EXAMPLES["openvino"]))["engine"]
    assert "not replayable" in odd["note"] and "tau" not in odd  # top-k 3 is not among the replayed widths


def test_the_recommendation_is_given_in_each_engines_terms_and_parses_back(tiny):
    from app_parts.workload import flags_text
    from eagle2.tools import diagnose
    from tests.test_diagnose import PROMPTS, RECORD

    target, head, tok = tiny
    dec = Decoder(target, head, tok, eos_ids=set())
    runs = [list(dec.run(ids, RECORD)) for ids in PROMPTS[:3]]
    out = diagnose.report([{"id": i, "category": "c"} for i in range(1, 4)], runs)
    rec, text = out["recommended"], flags_text(out)
    for words in ("# SGLang", "# vLLM", "# TensorRT-LLM", "# OpenVINO GenAI", "# llama.cpp"):
        assert words in text
    gpu = rec["gpu"]
    ov = parse_engine_flags(json.dumps(rec["openvino"]))  # each engine's line runs the shape recommended
    assert (ov.settings.get("total_tokens"), ov.settings.get("depth")) == (gpu["num_draft_tokens"], gpu["steps"]) \
        or (ov.policy == "chain" and gpu["topk"] == 1)
    assert parse_engine_flags(rec["llama.cpp"]).settings["chain_tokens"] == rec["vllm"]["num_speculative_tokens"]
    sg = parse_engine_flags(rec["sglang"])
    assert sg.engine == "sglang" and (sg.policy == "chain") == (gpu["topk"] == 1)
