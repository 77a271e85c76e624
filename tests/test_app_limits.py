"""The page's bounds without a model: a run's time limit, Stop while waiting in the queue, a session's size and
lifetime, and the visitor who leaves."""
from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app_parts import actions  # noqa: E402
from app_parts.meta import RunMeta, TimeLimit  # noqa: E402
from app_parts.presets import load_presets  # noqa: E402
from app_parts.runner import Budget, generate  # noqa: E402
from app_parts.session import (RunControl, Session, bound_faded, export_trace, free_session,  # noqa: E402
                               import_trace, session_ttl_s)
from app_parts.settings import RunRequest, run_budget_s  # noqa: E402
from app_parts.views import metrics_markdown, session_caption, tree_view  # noqa: E402
from eagle2.decode.records import (ACCEPTED, KEPT, PRUNED, REJECTED, ROOT, UNEXPANDED, UNREACHED, Node,  # noqa: E402
                                   StepRecord)
from viz.tree_size import tree_size_table  # noqa: E402

PRESET = next(iter(load_presets()))
PROMPT = "Count from 1 to 20, separated by commas."


def _step(method: str, step: int, faded: int = 3) -> StepRecord:
    """A drafted step: root, two kept children (the first accepted), and `faded` pruned / unexpanded nodes
    drafted between them, so that dropping them renumbers the kept ones."""
    if step == 0:
        return StepRecord(step=0, method=method, prefix_len=3, nodes=(), accepted=(), bonus_token=1, new_tokens=(1,),
                          new_texts=("a",), new_sources=("target",), draft_ms=0.0, verify_ms=1.0, commit_ms=0.0)
    nodes = [Node(0, -1, 1, "a", 0, 0, 1.0, 0.0, ROOT, True, ACCEPTED, 2, "b")]
    nodes.append(Node(1, 0, 2, "b", 1, 0, 0.6, -0.51, KEPT, True, ACCEPTED, 3, "c"))
    for j in range(faded):
        nodes.append(Node(len(nodes), 1, 5 + j, "x", 2, j + 1, 0.1, -2.8 - j, PRUNED if j % 2 else UNEXPANDED,
                          False))
    nodes.append(Node(len(nodes), 0, 4, "d", 1, 1, 0.3, -1.2, KEPT, False, REJECTED))
    nodes.append(Node(len(nodes), len(nodes) - 1, 6, "e", 2, 0, 0.5, -1.9, KEPT, False, UNREACHED))
    return StepRecord(step=step, method=method, prefix_len=3 + 2 * step, nodes=tuple(nodes), accepted=(1,),
                      bonus_token=3, new_tokens=(2, 3), new_texts=("b", "c"), new_sources=("draft", "target"),
                      draft_ms=1.0, verify_ms=2.0, commit_ms=0.1)


class FakeClock:
    """Seconds that pass only when a decoder step runs (each method's own step time)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fake_decoding(monkeypatch, clock: FakeClock, step_s: dict[str, float],
                   differ: str | None = None) -> tuple[dict[str, list[int]], object]:
    """Replace the model with a stream of `_step` records, each advancing the clock by its method's step time;
    returns (the steps each decode of each method ran, filled in as they run; a bundle to decode with).
    `differ`: that method's second decode commits other tokens (as if the live and timed passes disagreed)."""
    import app_parts.runner as runner

    ran: dict[str, list[int]] = {}

    def stream(bundle, ids, cfg, should_stop=None):
        m = cfg.method
        ran.setdefault(m, []).append(0)
        second = len(ran[m]) > 1
        for step in range(cfg.max_new_tokens):
            made = 0 if step == 0 else 1 + 2 * (step - 1)  # the prefill makes one token, each step two
            if made >= cfg.max_new_tokens or (should_stop and should_stop()):
                return
            clock.now += step_s[m]
            ran[m][-1] = step + 1
            rec = _step(m, step)
            if 1 + 2 * step >= cfg.max_new_tokens:  # the engine's last record says why it stopped
                rec = replace(rec, stop="max_new_tokens")
            if differ == m and second and step == 2:
                rec = replace(rec, new_tokens=(9, 9))
            yield rec

    class FakeDecoder:
        eos: set[int] = set()

        def check_prompt(self, ids, cfg):
            return None

    bundle = SimpleNamespace(tokenizer=None, model_name="fake", head_name="fake head", head_kind="eagle1",
                             describe=lambda: "fake, cpu")
    monkeypatch.setattr(runner, "encode_prompt", lambda tok, text: [1, 2, 3])
    monkeypatch.setattr(runner, "decoder_for", lambda b: FakeDecoder())
    monkeypatch.setattr(runner, "stream", stream)
    monkeypatch.setattr(runner, "STATUS_EVERY_S", 1e9)
    monkeypatch.setattr(runner, "SETTLE_S", 0.0)
    return ran, bundle


def _steps_shown(u) -> dict[str, int]:
    return {m: int(re.search(r"step (\d+)", fig.layout.title.text).group(1)) for m, fig in u.trees.items()}


def test_the_live_pass_draws_step_k_beside_step_k_then_the_timed_pass_draws_nothing(monkeypatch):
    clock = FakeClock()
    ran, bundle = _fake_decoding(monkeypatch, clock, {"eagle2": 1.0, "eagle1": 1.0, "vanilla": 0.5})
    updates = list(generate(RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=22),
                            lambda p, say=None: bundle, clock=clock))
    timed_from = next(i for i, u in enumerate(updates) if u.status.startswith("Timed pass"))
    live = [u for u in updates[:timed_from] if u.trees]
    assert len(live) >= 10 and all(u.status.startswith("Live pass") for u in live)
    shown = [_steps_shown(u) for u in live]
    assert all(s["eagle2"] == s["eagle1"] for s in shown)  # EAGLE-2's step k beside EAGLE-1's step k
    assert [s["eagle2"] for s in shown] == sorted({s["eagle2"] for s in shown})  # newest steps, in order
    assert not any(u.trees for u in updates[timed_from:-1]), "nothing is drawn while the decoders are timed"
    last = updates[-1]
    assert last.done and last.error is None and last.trees and last.analysis and last.status.startswith("Done.")
    assert ran == {"eagle2": [12, 12], "eagle1": [12, 12], "vanilla": [12]}  # live pass: the trees only
    timing = last.session.meta.timing
    assert timing.decode_s == {"eagle2": 12.0, "eagle1": 12.0, "vanilla": 6.0}  # each method's own steps
    assert timing.same_tokens == {"eagle2": True, "eagle1": True}
    assert "the same tokens" in last.metrics and "taking turns step by step" in last.metrics


def test_the_page_says_when_the_two_passes_disagree(monkeypatch):
    clock = FakeClock()
    ran, bundle = _fake_decoding(monkeypatch, clock, {"eagle2": 1.0, "eagle1": 1.0, "vanilla": 0.5},
                                 differ="eagle1")
    last = list(generate(RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=22), lambda p, say=None: bundle,
                         clock=clock))[-1]
    assert last.session.meta.timing.same_tokens == {"eagle2": True, "eagle1": 3}
    said = "⚠ The live pass and the timed pass gave different tokens: EAGLE-1 (static tree) from token 3. Under greedy"
    assert said in last.status and said in last.metrics


def test_the_time_limit_covers_both_passes_and_keeps_what_was_made(monkeypatch):
    clock = FakeClock()
    # 50 s: the live pass (2 of the 5 decodes) may use 20 s, 8 rounds of 2.5 s; the timed pass the 30 s left,
    # 10 rounds of 3 s, and it ends before the 11th with every method two steps short of its 12
    ran, bundle = _fake_decoding(monkeypatch, clock, {"eagle2": 2.0, "eagle1": 0.5, "vanilla": 0.5})
    updates = list(generate(RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=22),
                            lambda p, say=None: bundle, budget_s=50.0, clock=clock))
    last = updates[-1]
    assert last.done and last.error is None and last.trees and last.analysis
    s = last.session
    assert ran == {"eagle2": [8, 10], "eagle1": [8, 10], "vanilla": [10]}
    assert s.meta.limit == TimeLimit(seconds=50.0, cut={"eagle2": 30.0, "eagle1": 30.0, "vanilla": 30.0})
    assert [len(s.records(m)) for m in ("eagle2", "eagle1", "vanilla")] == [10, 10, 10]  # output kept
    assert last.status.startswith("Stopped at the time limit: a Generate may decode for 50 s, both passes together")
    assert "EAGLE-2 (dynamic tree) 19 tokens" in last.status
    assert "The time limit (50 s a Generate, both passes together)" in last.metrics
    assert "yes" in last.metrics  # the cut text is plain decoding's, as far as it goes


def test_without_a_time_limit_every_method_runs_to_the_end(monkeypatch):
    clock = FakeClock()
    ran, bundle = _fake_decoding(monkeypatch, clock, {"eagle2": 2.0, "eagle1": 0.5, "vanilla": 0.5})
    last = list(generate(RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=22), lambda p, say=None: bundle,
                         clock=clock))[-1]
    assert ran == {"eagle2": [12, 12], "eagle1": [12, 12], "vanilla": [12]} and last.status.startswith("Done.")
    assert last.session.meta.limit is None and "time limit" not in last.metrics


def test_a_method_that_ends_exactly_at_its_deadline_is_not_called_cut(monkeypatch):
    clock = FakeClock()
    ran, bundle = _fake_decoding(monkeypatch, clock, {"eagle2": 1.0, "eagle1": 1.0, "vanilla": 1.0})
    # 6 steps make 11 tokens; the live pass takes 12 s of its 12 (2/5 of 30), the timed pass 18 s of 18
    last = list(generate(RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=10), lambda p, say=None: bundle,
                         budget_s=30.0, clock=clock))[-1]
    assert ran == {"eagle2": [6, 6], "eagle1": [6, 6], "vanilla": [6]}
    assert last.session.meta.limit.cut == {} and last.status.startswith("Done.")


def test_the_timed_pass_rotates_which_method_goes_first(monkeypatch):
    import app_parts.runner as runner

    order: list[str] = []
    clock = FakeClock()
    ran, bundle = _fake_decoding(monkeypatch, clock, {"eagle2": 1.0, "eagle1": 1.0, "vanilla": 1.0})
    inner = runner.stream

    def spy(bundle, ids, cfg, should_stop=None):
        for rec in inner(bundle, ids, cfg, should_stop):
            order.append(cfg.method)
            yield rec

    monkeypatch.setattr(runner, "stream", spy)
    list(generate(RunRequest(prompt=PROMPT, preset=PRESET, max_new_tokens=10), lambda p, say=None: bundle,
                  clock=clock))
    timed = order[12:]  # after the live pass's 6 + 6 steps
    firsts = [timed[i] for i in range(0, 18, 3)]
    assert firsts == ["eagle2", "eagle1", "vanilla"] * 2 and sorted(timed) == sorted(["eagle2", "eagle1", "vanilla"] * 6)


def test_budget_shares_what_is_left_between_the_passes():
    clock = FakeClock()
    b = Budget(90.0, clock)
    assert b.start(0.4) == 36.0 and not b.over()
    clock.now = 12.0  # the live pass ended early: the timed pass has the 78 s left
    assert b.start() == 78.0
    clock.now = 90.0
    assert b.over()


def test_budget_and_lifetime_settings(monkeypatch):
    monkeypatch.delenv("EAGLE2_RUN_BUDGET_S", raising=False)
    monkeypatch.delenv("EAGLE2_SESSION_TTL_S", raising=False)
    assert run_budget_s() == 120.0 and run_budget_s(slot_s=180) == 120.0 and run_budget_s(slot_s=120) == 60.0
    assert session_ttl_s() == 1800.0
    monkeypatch.setenv("EAGLE2_RUN_BUDGET_S", "300")
    assert run_budget_s() == 300.0 and run_budget_s(slot_s=180) == 120.0  # the GPU slot still rules
    monkeypatch.setenv("EAGLE2_SESSION_TTL_S", "45")
    assert session_ttl_s() == 45.0
    for name, fn in (("EAGLE2_RUN_BUDGET_S", run_budget_s), ("EAGLE2_SESSION_TTL_S", session_ttl_s)):
        for bad in ("soon", "0", "-5"):
            monkeypatch.setenv(name, bad)
            with pytest.raises(ValueError, match=name):
                fn()


def _no_model(preset):
    raise AssertionError("a run taken out of the queue must not load anything")


def test_stop_while_waiting_takes_the_run_out_of_the_queue():
    control = RunControl()
    assert "Stop takes you out" in actions.enqueue(control) and control.waiting == 1
    assert actions.request_stop(control) == "Taken out of the queue: nothing was decoded. Generate again at any time."
    updates = list(generate(RunRequest(prompt=PROMPT, preset=PRESET), _no_model, control=control))
    assert len(updates) == 1 and updates[0].status.startswith("Stopped before it started") and updates[0].done
    assert updates[0].session is None and updates[0].error is None and not control.running
    assert (control.waiting, control.skip) == (0, 0)
    # the next click runs (here it is refused for its empty prompt, before anything loads)
    actions.enqueue(control)
    updates = list(generate(RunRequest(prompt="", preset=PRESET), _no_model, control=control))
    assert "prompt is empty" in updates[-1].error and not control.running
    assert actions.request_stop(control) == "Nothing is running."


def test_stop_takes_out_only_the_runs_waiting_when_it_is_pressed():
    control = RunControl()
    actions.enqueue(control)
    actions.enqueue(control)
    actions.request_stop(control)
    actions.enqueue(control)  # a third click after Stop
    starts = [control.take_turn() for _ in range(3)]
    assert starts == [False, False, True] and control.running


def test_stop_during_a_run_also_empties_the_visitors_queue():
    control = RunControl()
    actions.enqueue(control)
    assert control.take_turn() and control.running
    actions.enqueue(control)  # clicked again while running
    assert actions.request_stop(control) == "Stopping after the current step…" and control.stop_requested
    assert control.take_turn() is False


def _session(steps: int = 6, faded: int = 3) -> Session:
    runs = {m: [_step(m, k, faded) for k in range(steps)] for m in ("eagle2", "eagle1")}
    return Session(runs=runs, meta=RunMeta(settings={"temperature": 0.0, "total_tokens": 4}), source="live")


def test_a_session_keeps_a_bounded_number_of_pruned_nodes_the_newest_steps_first():
    s = _session()
    before = {m: [(r.nodes, r.verified, r.accepted) for r in s.runs[m]] for m in s.runs}
    table = tree_size_table(s.records("eagle2"), s.meta.to_dict(), s.records("eagle1"))
    assert bound_faded(s, limit=100) == 0 and not s.meta.dropped  # under the bound: nothing changes
    assert bound_faded(s, limit=13) == 18  # 30 faded nodes; steps 1-3 of both trees lose theirs
    assert s.meta.dropped == {m: {"1": 3, "2": 3, "3": 3} for m in ("eagle2", "eagle1")}
    for m in s.runs:
        for r, (nodes, verified, accepted) in zip(s.runs[m], before[m]):
            assert [(n.token, n.status, n.verdict) for n in r.verified] == [(n.token, n.status, n.verdict)
                                                                            for n in verified]
            assert [r.nodes[a].token for a in r.accepted] == [nodes[a].token for a in accepted]
            assert all(n.id == i and (n.parent < n.id) for i, n in enumerate(r.nodes))
            assert len(r.nodes) == (len(verified) if 1 <= r.step <= 3 else len(nodes))
    assert tree_size_table(s.records("eagle2"), s.meta.to_dict(), s.records("eagle1")) == table  # the analysis is the same
    assert s.dropped("eagle2", 2) == 3 and s.dropped("eagle2", 4) == 0
    fig = tree_view(s, "eagle2", 2)
    assert "3 verified of 6 drafted (3 pruned not kept)" in fig.layout.title.text
    assert "its 3 pruned nodes were not kept" in session_caption(s, "eagle2", 2)
    assert "not kept" not in session_caption(s, "eagle2", 5)
    assert "steps 1-3 keep their verified trees only (9 pruned nodes not kept" in metrics_markdown(s)


def test_a_loaded_trace_is_bounded_too_and_says_so(tmp_path, monkeypatch):
    import app_parts.session as session

    path = export_trace(_session(steps=8), tmp_path)
    monkeypatch.setattr(session, "MAX_FADED_NODES", 9)
    loaded = import_trace(path.read_text())  # 42 pruned nodes: the oldest 33 go, EAGLE-1's step 6 last
    assert loaded.meta.dropped["eagle2"] == {str(k): 3 for k in range(1, 6)}
    assert loaded.meta.dropped["eagle1"] == {str(k): 3 for k in range(1, 7)}
    (tmp_path / "again").mkdir()
    again = import_trace(export_trace(loaded, tmp_path / "again").read_text())  # re-exported: still says so
    assert again.meta.dropped == loaded.meta.dropped
    bad = json.loads(path.read_text())
    bad["meta"]["dropped"] = "lots"
    with pytest.raises(ValueError, match="meta 'dropped' is not an object"):  # checked once, at load
        import_trace(json.dumps(bad))


def test_an_empty_session_says_runs_are_freed(monkeypatch):
    monkeypatch.setenv("EAGLE2_SESSION_TTL_S", "600")
    assert "freed when its page closes or after 10 minutes without use" in session_caption(Session(), "eagle2", 3)
    fig, text, caption = actions.scrub(Session(), "eagle2", 3)
    assert "10 minutes" in caption


def test_the_page_wires_its_bounds(monkeypatch):
    """Session lifetime from the environment, the token slider's device limit, the pending step before Generate,
    and the handler that frees a closed page's session."""
    from gradio.state_holder import StateHolder

    import app

    monkeypatch.setenv("EAGLE2_SESSION_TTL_S", "77")
    demo = app.build_demo()
    state = next(b for b in demo.blocks.values() if getattr(b, "time_to_live", None) == 77.0)
    assert state.delete_callback is free_session
    slider = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "max-new")
    assert slider.maximum == 512 and "120 s" in slider.label  # this machine has no GPU
    fns = list(demo.fns.values())
    gen = next(f for f in fns if f.api_name == "generate")
    assert gen.concurrency_id == "decode" and gen.concurrency_limit == 1 and gen.show_progress == "minimal"
    pending = [f for f in fns if f.name == "enqueue"]
    assert len(pending) == 2 and all(not f.queue for f in pending)  # the button and the prompt's Enter
    unload = next(f for f in fns if any(t[1] == "unload" for t in f.targets))
    holder = StateHolder()
    holder.set_blocks(demo)
    control = RunControl(running=True, waiting=1)
    holder["visitor"][state._id] = _session()
    control_id = next(b._id for b in demo.blocks.values() if b is not state and type(b).__name__ == "State")
    holder["visitor"][control_id] = control
    unload.fn(SimpleNamespace(session_hash="visitor"))
    assert "visitor" not in holder.session_data and control.stop_requested and control.skip == 1
    unload.fn(SimpleNamespace(session_hash="visitor"))  # a second close is harmless


def test_an_expired_session_is_emptied():
    s = _session()
    free_session(s)
    assert s.runs == {} and s.meta == RunMeta() and "No run to show" in session_caption(s, "eagle2")
