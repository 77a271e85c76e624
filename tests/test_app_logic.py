"""The page's logic without a browser: streaming both trees, scrubbing, trace round trips and error messages."""
from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app_parts import actions  # noqa: E402
from app_parts.presets import CACHE, ModelPreset, load_presets, unavailable_reason  # noqa: E402
from app_parts.runner import generate  # noqa: E402
from app_parts.session import RunControl, Session, export_trace, import_trace  # noqa: E402
from app_parts.settings import CUT, RunRequest, budget_markdown, configs, page_flags  # noqa: E402
from eagle2.tools.serving import Shape  # noqa: E402
from eagle2.tools.serving import sglang_flags as diagnose_flags  # noqa: E402
from eagle2.config import DecodeConfig  # noqa: E402
from eagle2.decode.records import Trace  # noqa: E402

PRESET = next(iter(load_presets()))
PROMPT = "Count from 1 to 20, separated by commas."


def _no_model(preset):
    raise AssertionError("bad input must be refused before any model is loaded")


def _trace_nodes(fig) -> int:
    """Drafted and root nodes drawn in a tree figure (node traces only, bonus excluded)."""
    return sum(len(t.x) for t in fig.data if (t.meta or {}).get("nodes") not in (None, "bonus"))


@pytest.fixture(scope="module")
def bundle(embedded):
    CACHE.put(PRESET, embedded)
    return embedded


@pytest.fixture(scope="module")
def finished(bundle) -> list:
    """All updates of one short live run (EAGLE-2, EAGLE-1 and plain decoding)."""
    req = RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=12)
    return list(generate(req, CACHE.get))


@pytest.mark.slow
def test_run_draws_the_live_pass_then_times_each_method_undrawn(finished):
    timed_from = next(i for i, u in enumerate(finished) if u.status.startswith("Timed pass"))
    assert any(u.trees for u in finished[:timed_from]), "the live pass draws the trees as they grow"
    assert not any(u.trees for u in finished[timed_from:-1]), "nothing is drawn while the decoders are timed"
    last = finished[-1]
    assert last.done and last.error is None and last.analysis is not None and len(last.analysis) == 6
    assert set(last.trees) == {"eagle2", "eagle1"}
    s = last.session
    assert set(s.runs) == {"eagle2", "eagle1", "vanilla"}
    for m in ("eagle2", "eagle1"):
        assert s.runs[m][0].step == 0 and all(r.method == m for r in s.runs[m])
        for r in s.runs[m][1:]:
            assert len(r.verified) == 26  # same node budget: 25 drafted + root for both trees
    assert _trace_nodes(last.trees["eagle2"]) == len(s.runs["eagle2"][-1].nodes)
    # Greedy verification is lossless: every method commits plain decoding's tokens.
    tokens = {m: [t for r in s.runs[m] for t in r.new_tokens] for m in s.runs}
    assert tokens["eagle2"] == tokens["vanilla"] == tokens["eagle1"] and len(tokens["vanilla"]) == 12
    assert "plain decoding" in last.metrics and "1.00×" in last.metrics and "| yes |" in last.metrics
    assert s.meta.prompt == PROMPT and s.meta.settings["total_tokens"] == 26 and "cpu" in s.meta.device
    assert s.meta.settings["eagle2_method"] == "eagle2" and s.meta.settings["static_nodes"] == 26
    # tokens/s is each decode's wall time, as the bench measures it, not the sum of the records' phases
    wall = s.meta.timing.decode_s
    assert set(wall) == {"eagle2", "eagle1", "vanilla"} and all(t > 0 for t in wall.values())
    phases = sum(r.draft_ms + r.verify_ms + r.commit_ms for r in s.runs["eagle2"]) / 1e3
    assert phases <= wall["eagle2"]
    assert f"| {12 / wall['eagle2']:.1f} |" in last.metrics and "wall time" in last.metrics


@pytest.mark.slow
def test_scrubber_draws_the_chosen_step(finished):
    s = finished[-1].session
    fig, text, caption = actions.scrub(s, "eagle2", 1)
    assert "step 1:" in fig.layout.title.text and s.follow["eagle2"] is False
    assert _trace_nodes(fig) == len(s.runs["eagle2"][1].nodes)
    assert 'data-step="1"' in text and "outline:2px" in text and caption.startswith("Step 1:")
    fig0, _, caption0 = actions.scrub(s, "eagle1", 0)
    assert "prefill" in caption0 and _trace_nodes(fig0) == 0
    fig_far, _, _ = actions.scrub(s, "eagle1", 10_000)  # clamped to the last step
    assert f"step {s.last_step('eagle1')}:" in fig_far.layout.title.text
    back = actions.follow_latest(s)
    assert s.follow == {"eagle2": True, "eagle1": True} and set(back.trees) == {"eagle2", "eagle1"}


@pytest.mark.slow
def test_trace_export_import_round_trip(finished, tmp_path):
    s = finished[-1].session
    path, err = actions.export(s)
    assert err is None
    replay = actions.load_trace(path)
    assert replay.error is None and replay.done and set(replay.trees) == {"eagle2", "eagle1"}
    r = replay.session
    assert r.meta == s.meta and r.meta.to_dict() == json.loads(json.dumps(s.meta.to_dict()))
    assert r.source.endswith(".json")
    for m in s.runs:
        assert [x.to_dict() for x in r.runs[m]] == [x.to_dict() for x in s.runs[m]]
    fig, _, _ = actions.scrub(r, "eagle1", 1)
    assert "step 1:" in fig.layout.title.text
    assert replay.metrics == finished[-1].metrics.replace("in this run", "when the trace was recorded")


@pytest.mark.slow
def test_stop_ends_the_run_after_one_step_and_keeps_its_output(bundle, monkeypatch):
    import app_parts.runner as runner

    monkeypatch.setattr(runner, "STATUS_EVERY_S", 0.0)  # a status line after every step
    control = RunControl()
    req = RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=24)
    updates, kept = [], None
    for u in generate(req, CACHE.get, control=control):
        updates.append(u)
        if kept is None and u.session and len(u.session.records("eagle2")) >= 3:
            assert control.running and actions.request_stop(control) == "Stopping after the current step…"
            kept = {m: len(u.session.records(m)) for m in ("eagle2", "eagle1")}
    last = updates[-1]
    assert last.status.startswith("Stopped. Kept what was produced") and last.done and last.trees and last.analysis
    now = {m: len(last.session.records(m)) for m in ("eagle2", "eagle1")}
    assert all(kept[m] <= now[m] <= kept[m] + 1 for m in now)  # within one step of the request
    assert "vanilla" not in last.session.runs and not control.running and control.stop_requested
    assert actions.request_stop(control) == "Nothing is running."


@pytest.mark.slow
def test_sessions_do_not_share_state(finished, bundle):
    first = finished[-1].session
    before = [len(first.records(m)) for m in first.runs]
    req = RunRequest(prompt="Say hi.", preset=PRESET, max_new_tokens=4, with_vanilla=False)
    other = list(generate(req, CACHE.get))[-1].session
    assert other is not first and other.meta.prompt == "Say hi."
    assert [len(first.records(m)) for m in first.runs] == before and first.meta.prompt == PROMPT


@pytest.mark.parametrize("change, words", [
    ({"prompt": ""}, "prompt is empty"),
    ({"prompt": "   \n\t"}, "prompt is empty"),
    ({"prompt": "x" * 20_001}, "characters"),
    ({"max_new_tokens": 0}, "max_new_tokens=0 is outside"),
    ({"max_new_tokens": 5000}, "max_new_tokens=5000 is outside"),
    ({"temperature": 3.0}, "temperature=3.0 is outside"),
    ({"top_p": 0.0}, "top_p=0.0 is outside"),
    ({"total_tokens": 1}, "total_tokens=1 is outside"),
    ({"depth": 40}, "depth=40 is outside"),
    ({"top_k": 0}, "top_k=0 is outside"),
    ({"top_k": float("nan")}, "top-k must be a finite number"),
    ({"seed": "abc"}, "seed must be a number"),
    ({"max_new_tokens": 2.5}, "whole number"),
    ({"tree_choice": "custom", "tree_json": "[[0], [1"}, "not valid JSON"),
    ({"tree_choice": "custom", "tree_json": ""}, "enter a JSON list"),
    ({"tree_choice": "custom", "tree_json": "[[0], [0, 0, 0]]"}, "not prefix-closed"),
    ({"tree_choice": "custom", "tree_json": "[[0], [25]]"}, "rank outside"),
    ({"tree_choice": "custom", "tree_json": json.dumps([[0] * k for k in range(1, 14)])}, "deeper than"),
    ({"tree_choice": "custom", "tree_json": '{"a": 1}'}, "non-empty list of paths"),
    ({"tree_choice": "nope"}, "unknown static tree"),
    ({"preset": "someone/else"}, "unknown model preset"),
    ({"lookup": "yes"}, "prompt-lookup branch must be true or false"),
    ({"min_prob": 2.0}, "min_prob=2.0 is outside"),
    ({"expand_prob": "lots"}, "expand floor must be a number"),
    ({"sizing": "huge"}, "sizing must be one of"),
])
def test_bad_input_gives_one_message_and_loads_nothing(change, words):
    req = RunRequest(**{**RunRequest(prompt=PROMPT, preset=PRESET).__dict__, **change})
    updates = list(generate(req, _no_model))
    assert len(updates) == 1 and updates[0].error and words in updates[0].error
    assert updates[0].status.startswith("⚠") and updates[0].session is None  # the page keeps its last run


def test_unavailable_preset_is_refused_with_a_reason(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = ModelPreset(name="hub pair", model="org/model", head="org/head", needs=("hub",))
    assert "hub" in unavailable_reason(hub)
    with pytest.raises(RuntimeError, match="hub"):
        CACHE.get(hub)
    shipped = load_presets()
    official = [p for p in shipped.values() if "cuda" in p.needs and p.head]
    assert official and official[0].model == "lmsys/vicuna-7b-v1.3"
    assert unavailable_reason(shipped[PRESET]) is None


def test_preset_file_from_the_environment(tmp_path, monkeypatch):
    f = tmp_path / "models.json"
    f.write_text(json.dumps({"presets": [{"name": "mine", "model": "embedded", "head": None}]}))
    monkeypatch.setenv("EAGLE2_MODELS", str(f))
    assert list(load_presets()) == ["mine"]
    f.write_text(json.dumps({"presets": [{"name": "bad", "model": "x", "needs": ["tpu"]}]}))
    with pytest.raises(ValueError, match="needs"):
        load_presets()
    f.write_text("{")
    with pytest.raises(ValueError, match="unreadable"):
        load_presets()


@pytest.mark.parametrize("text, words", [
    ("{not json", "not a JSON trace"),
    ('{"version": 1}', "no 'runs' field"),
    ('{"version": 99, "runs": {}}', "version 99 is not supported"),
    ('{"version": 1, "runs": {"eagle2": [{"step": 0}]}}', "malformed step record"),
    ('{"version": 1, "runs": []}', "malformed step record"),
    ('{"version": 1, "runs": {"medusa": []}}', "unknown methods"),
    ('{"version": 1, "runs": {"vanilla": []}}', "no EAGLE-2 or EAGLE-1 records"),
])
def test_bad_trace_files_are_refused(tmp_path, text, words):
    f = tmp_path / "t.json"
    f.write_text(text)
    u = actions.load_trace(str(f))
    assert u.error and words in u.error and "t.json" in u.error and u.session is None


@pytest.mark.slow
def test_tampered_trace_record_is_refused(finished, tmp_path):
    d = json.loads(Trace(meta={}, runs=finished[-1].session.runs).to_json())
    d["runs"]["eagle2"][1]["nodes"][3]["parent"] = 99
    with pytest.raises(ValueError, match="eagle2 record 1: node 3"):
        import_trace(json.dumps(d))
    d = json.loads(Trace(meta={}, runs=finished[-1].session.runs).to_json())
    d["runs"]["eagle1"][1]["nodes"][1]["text"] = 7
    with pytest.raises(ValueError, match="wrong type"):
        import_trace(json.dumps(d))
    with pytest.raises(ValueError, match="not UTF-8"):
        import_trace(b"\xff\xfe\x00")


def test_export_without_a_run_says_so():
    path, err = actions.export(Session())
    assert path is None and "Generate" in err
    with pytest.raises(ValueError):
        export_trace(Session())


@pytest.mark.slow
def test_prompt_longer_than_the_context_is_refused(bundle):
    req = RunRequest(prompt="9 " * 7000, preset=PRESET, max_new_tokens=1024, total_tokens=128)
    updates = list(generate(req, CACHE.get))
    limit = bundle.target.config.max_position_embeddings
    assert len(updates) == 2 and updates[0].status.startswith("Preparing")  # refused before any decoding
    assert updates[1].error and f"context is {limit}" in updates[1].error and updates[1].session is None


def test_prompt_lookup_branch_goes_to_eagle2_only():
    from app_parts.settings import configs, settings_meta

    req = RunRequest(prompt=PROMPT, preset=PRESET, lookup=True)
    cfgs = configs(req)
    assert cfgs["eagle2"].lookup and not cfgs["eagle1"].lookup and not cfgs["vanilla"].lookup
    assert settings_meta(cfgs, req)["lookup"] is True
    assert not configs(RunRequest(prompt=PROMPT, preset=PRESET))["eagle2"].lookup  # off by default


def test_tree_sized_by_confidence_goes_to_eagle2_only():
    from app_parts.settings import configs, settings_meta
    from viz.tree_size import tree_size_table

    req = RunRequest(prompt=PROMPT, preset=PRESET, min_prob=0.05, expand_prob=0.15)
    cfgs = configs(req)
    assert (cfgs["eagle2"].min_prob, cfgs["eagle2"].expand_prob) == (0.05, 0.15)
    assert cfgs["eagle1"].min_prob == cfgs["vanilla"].min_prob == 0.0
    meta = {"settings": settings_meta(cfgs, req)}
    assert meta["settings"]["min_prob"] == 0.05
    text = budget_markdown(26, "mc_sim_7b_63", "", min_prob=0.05)
    assert "up to 26" in text and "0.05" in text and "not like for like" in text and "confidence sizing (ours)" in text
    assert "up to" not in budget_markdown(26, "mc_sim_7b_63", "", min_prob=0)
    # the tree-size replay cuts fixed trees; a tree sized per step is not one, so the chart says why not
    rows, why = tree_size_table([_fake_step()], meta)
    assert rows == [] and "sized" in why
    # an expand floor alone sizes the tree too
    alone = configs(RunRequest(prompt=PROMPT, preset=PRESET, expand_prob=0.2))["eagle2"]
    assert alone.sized and not configs(RunRequest(prompt=PROMPT, preset=PRESET))["eagle2"].sized
    assert "up to 26" in budget_markdown(26, "mc_sim_7b_63", "", expand_prob=0.2)
    assert "sized" in tree_size_table([_fake_step()], {"settings": {"expand_prob": 0.2}})[1]
    # the page nests the temperature under settings: a sampled run gets no replay
    assert "greedy" in tree_size_table([_fake_step()], {"settings": {"temperature": 0.7}})[1]
    assert tree_size_table([_fake_step()], {"settings": {"temperature": 0.0}})[0]


def _fake_step():
    from eagle2.decode.records import KEPT, ROOT, Node, StepRecord

    nodes = (Node(0, -1, 1, "a", 0, 0, 1.0, 0.0, ROOT, True, "accepted", 2, "b"),
             Node(1, 0, 2, "b", 1, 0, 0.5, -0.69, KEPT, False, "accepted", 3, "c"))
    return StepRecord(step=1, method="eagle2", prefix_len=3, nodes=nodes, accepted=(1,), bonus_token=3,
                      new_tokens=(2, 3), new_texts=("b", "c"), new_sources=("draft", "target"), draft_ms=1.0,
                      verify_ms=1.0, commit_ms=0.1)


def test_settings_helpers():
    presets = list(load_presets().values())
    embedded, llama3 = presets[0], next(p for p in presets if p.head_kind == "eagle3")
    assert page_flags(embedded, 6, 10, 60) == diagnose_flags(Shape(6, 10, 60))  # the tools' one copy
    assert page_flags(llama3, 6, 10, 60).startswith("--speculative-algorithm EAGLE3 ")  # the head kind that runs
    assert llama3.head in page_flags(llama3, 6, 10, 60)
    assert page_flags(embedded, 3, 1, 8).startswith("# no SGLang flags") and "must equal" in page_flags(embedded, 3, 1, 8)
    assert "EAGLE-2 **26** nodes verified per step, depth 6, top-k 10 · EAGLE-1 **26**" in \
        budget_markdown(26, "mc_sim_7b_63", "")
    assert "differ" in budget_markdown(30, "mc_sim_7b_63", "") and "differ" not in budget_markdown(20, CUT, "")
    assert "differ" in budget_markdown(30, CUT, "")  # the whole tree has 26 nodes
    assert "EAGLE-1 **6**" in budget_markdown(6, "chain_5", "") and "EAGLE-1 **8**" in budget_markdown(8, CUT, "")
    assert "⚠" in budget_markdown(26, "custom", "[[1], [")
    assert "lookup" not in budget_markdown(26, "mc_sim_7b_63", "")
    with_lookup = budget_markdown(26, "mc_sim_7b_63", "", lookup=True, depth=5)
    n = DecodeConfig().lookup_tokens
    assert f"up to {n} tokens" in with_lookup and "first 5 scored" in with_lookup and "verified on top" in with_lookup
    assert "prompt-lookup branch (ours)" in with_lookup
    # the page's defaults are the engine's
    d, r = DecodeConfig(), RunRequest(prompt="", preset="")
    assert (r.total_tokens, r.depth, r.top_k, r.temperature, r.top_p) == (d.total_tokens, d.depth, d.top_k,
                                                                          d.temperature, d.top_p)


PROFILE = {"measured": "2026-01-01 00:00", "eagle2": {"total_tokens": 5, "depth": 3, "top_k": 4, "draft_tokens": 8192},
           "verify_ms": {"1": 30.0, "2": 31.0, "4": 33.0, "8": 40.0, "26": 70.0}, "rest_ms": {"1": 3.0, "3": 6.0}}


def test_each_sizing_says_which_comparison_it_shows():
    base = RunRequest(prompt=PROMPT, preset=PRESET, total_tokens=12, depth=4, top_k=5, tree_choice="chain_5")
    tuned = configs(RunRequest(**{**base.__dict__, "sizing": "tuned"}), PROFILE)
    assert (tuned["eagle2"].total_tokens, tuned["eagle2"].depth, tuned["eagle2"].top_k) == (5, 3, 4)
    assert len(tuned["eagle1"].tree) == 4 and tuned["eagle1"].tree == ((0,), (1,), (2,), (3,))  # cut to 5 nodes
    assert tuned["eagle2"].draft_tokens == tuned["eagle1"].draft_tokens == 8192  # the same draft vocabulary
    paper = configs(RunRequest(**{**base.__dict__, "sizing": "paper"}), PROFILE)
    assert (paper["eagle2"].total_tokens, paper["eagle2"].depth, paper["eagle2"].top_k) == (60, 6, 10)
    assert len(paper["eagle1"].tree) == 25 and paper["eagle1"].draft_tokens == 0
    assert configs(RunRequest(**{**base.__dict__, "sizing": "tuned"}))["eagle2"].total_tokens == 60  # no profile
    mine = configs(base, PROFILE)
    assert mine["eagle2"].total_tokens == 12 and len(mine["eagle1"].tree) == 5  # the sliders and chain_5
    assert "budget tuned for this machine (measured 2026-01-01" in budget_markdown(12, CUT, "", sizing="tuned",
                                                                               profile=PROFILE)
    assert "paper's settings" in budget_markdown(12, CUT, "", sizing="paper") and \
        "not like for like" in budget_markdown(12, CUT, "", sizing="paper")


def test_labels_name_the_variant_that_ran():
    from app_parts.meta import RunMeta
    from app_parts.views import label

    s = Session(meta=RunMeta(settings={"eagle2_method": "eagle2_sized_lookup"}))
    assert label(s, "eagle2") == "EAGLE-2 + confidence sizing + prompt-lookup branch (ours)"
    assert label(Session(), "eagle2") == "EAGLE-2 (dynamic tree)" and label(s, "eagle1") == "EAGLE-1 (static tree)"


def test_stop_with_nothing_running_says_so():
    assert actions.request_stop(RunControl()) == "Nothing is running."
    assert actions.request_stop(None) == "Nothing is running."


def test_bundle_cache_loads_once_reports_progress_and_evicts(monkeypatch):
    import app_parts.presets as presets

    calls, steps = [], []

    def fake_load(model, head, device, dtype="float32"):
        calls.append(model)
        if model == "broken":
            raise OSError("no such file")
        return f"bundle:{model}"

    warmed = []
    monkeypatch.setattr(presets, "load", fake_load)
    monkeypatch.setattr(presets, "warm_up", warmed.append)
    cache = presets.BundleCache()
    a, b = ModelPreset(name="a", model="m1"), ModelPreset(name="b", model="m2")
    assert cache.get(a, lambda f, msg: steps.append((f, msg))) == "bundle:m1"
    assert cache.get(a) == "bundle:m1" and calls == ["m1"] and warmed == ["bundle:m1"]  # warmed up once
    assert steps[0][0] < steps[-1][0] == 1.0 and "Loading a" in steps[0][1]
    assert cache.get(b) == "bundle:m2" and cache.loaded("a") is None  # one model at a time
    with pytest.raises(RuntimeError, match="could not load “c”: no such file"):
        cache.get(ModelPreset(name="c", model="broken"))
    assert presets.model_info(a, cache).endswith("Loads on the first Generate.")


def test_a_decoder_failure_becomes_a_message(monkeypatch):
    import app_parts.runner as runner

    class Broken:
        def check_prompt(self, ids, cfg):
            raise RuntimeError("head does not fit the target")

    class FakeBundle:
        tokenizer = None

    monkeypatch.setattr(runner, "encode_prompt", lambda tok, text: [1, 2, 3])
    monkeypatch.setattr(runner, "decoder_for", lambda bundle: Broken())
    updates = list(generate(RunRequest(prompt=PROMPT, preset=PRESET), lambda preset, say=None: FakeBundle()))
    assert updates[-1].error == "decoding failed: head does not fit the target" and updates[-1].session is None


def test_the_workload_tab_refuses_bad_files_with_a_reason(tmp_path):
    from app_parts import workload

    with pytest.raises(ValueError, match="upload"):
        workload.read_file(None, 5)
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"prompt": "x" * (workload.MAX_BYTES + 1)}) + "\n")
    with pytest.raises(ValueError, match="bytes"):
        workload.read_file(str(big), 5)
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(workload.MAX_PROMPTS + 1)))
    with pytest.raises(ValueError, match="prompts"):
        workload.read_file(str(many), 5)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(ValueError, match="none of instruction, turns, prompt"):
        workload.read_file(str(bad), 5)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"turns": ["b"], "category": "c"}) + "\n")
    assert [r.prompt for r in workload.read_file(str(ok), 5)] == ["a", "b"]
    updates = list(workload.diagnose(str(ok), 999, PRESET, _no_model, _no_model, RunControl()))
    assert len(updates) == 1 and "max new tokens" in updates[0].error  # refused before any model loads


def test_a_step_cut_by_the_end_of_the_run_says_so_in_its_caption():
    from dataclasses import replace as dc_replace

    from app_parts.views import step_caption

    whole = _fake_step()
    assert "1 accepted + bonus → 2 new tokens" in step_caption(whole)
    cut = dc_replace(whole, new_tokens=(2,), new_texts=("b",), new_sources=("draft",), stop="max_new_tokens")
    text = step_caption(cut)
    assert "1 accepted + bonus, of which 1 new token kept (the token limit ended the run)" in text
    assert "end-of-text" in step_caption(dc_replace(cut, stop="eos"))


def test_before_anything_is_measured_the_tuned_budget_line_does_not_warn_of_a_budget_it_will_not_run():
    line = budget_markdown(26, CUT, "", sizing="tuned", profile=None)
    assert "same number of nodes" in line and "not like for like" not in line
    assert "not like for like" in budget_markdown(26, CUT, "", sizing="paper")  # where it will run, it says so


def test_a_link_s_token_limit_is_the_page_s_in_the_page_s_words():
    from app_parts.link import read_link
    from app_parts.presets import page_token_limit

    limit = page_token_limit()
    for value in (str(limit + 1), "99999"):
        kept, ignored = read_link({"max_new_tokens": value}, RunRequest(prompt="", preset=""))
        assert not kept and f"is outside 1..{limit}: choose a value from 1 to {limit}" in ignored[0]
    assert read_link({"max_new_tokens": str(limit)}, RunRequest(prompt="", preset=""))[0] == {"max_new_tokens": limit}
