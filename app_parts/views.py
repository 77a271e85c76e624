"""What the page shows, built from a Session's records only: trees, coloured text, metrics, analysis.

Nothing here touches a model, so a loaded trace replays exactly like a live run.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

from app_parts.session import MAX_FADED_NODES, TREE_METHODS, Session, session_ttl_s
from eagle2.decode.methods import LABELS as METHOD_LABELS
from eagle2.decode.records import ACCEPTED, KEPT, ROOT, TAU_DEFINITION, Node, StepRecord
from eagle2.policies import DYNAMIC, PLAIN
from eagle2.tools.device_profiles import stored_profiles
from viz.empty import note_figure
from viz.labels import counted, label_md
from viz.sampling import step_sentences
from viz import (accept_length_figure, bonus_entry, calibration_figure, cost_figure, metrics_rows, position_heatmap,
                 tokens_html, tree_figure, tree_size_figure)

TREE_HEIGHT = 600
LABELS = {"eagle2": "EAGLE-2 (dynamic tree)", "eagle1": "EAGLE-1 (static tree)", "vanilla": "plain decoding"}


def label(session: Session, method: str) -> str:
    """A run's name as it ran: the EAGLE-2 column says when it was one of this project's variants."""
    panel = session.meta.settings.get("panels", {}).get(method)
    if panel:  # what the panel ran: its own terms (a chain, an engine's flags), else its policy's label
        return panel["label"] or (LABELS.get(panel["policy"]) if panel["policy"] == method else None) or \
            METHOD_LABELS.get(panel["policy"], panel["policy"])
    name = session.meta.settings.get("eagle2_method", DYNAMIC) if method == DYNAMIC else method
    return LABELS[method] if name == method else METHOD_LABELS.get(name, name)


def warm_up() -> None:
    """Draw one tiny tree and chart so Plotly's first-use imports happen at startup, not during a decode."""
    nodes = (Node(0, -1, 0, "a", 0, 0, 1.0, 0.0, ROOT, True, ACCEPTED),
             Node(1, 0, 1, "b", 1, 0, 0.5, -0.7, KEPT, False, ACCEPTED))
    rec = StepRecord(step=1, method="eagle2", prefix_len=1, nodes=nodes, accepted=(1,), bonus_token=2,
                     new_tokens=(1, 2), new_texts=("b", "c"), new_sources=("draft", "target"),
                     draft_ms=1.0, verify_ms=1.0, commit_ms=1.0)
    tree_figure(rec).to_json()
    analysis_views(Session(runs={"eagle2": [rec]}))[1].to_json()


def tree_view(session: Session, method: str, step: int | None = None, show_pruned: bool = True) -> go.Figure:
    """One method's draft tree at `step` (the latest when None)."""
    rec = session.record(method, step)
    if rec is None:
        fig = note_figure("Press Generate (or load a trace) to see the draft trees.", f"<b>{LABELS[method]}</b>")
        fig.update_layout(height=TREE_HEIGHT)
        return fig
    fig = tree_figure(rec, show_pruned=show_pruned, dropped=session.dropped(method, rec.step))
    fig.update_layout(title=dict(text=f"<b>{label(session, method)}</b><br>{fig.layout.title.text}"), height=TREE_HEIGHT,
                      margin=dict(t=60))
    return fig


def text_view(session: Session, method: str, highlight: int | None = None) -> str:
    """One method's output as coloured tokens, with one step outlined when `highlight` is set."""
    recs = session.records(method)
    if not recs:
        return f'<div class="out-empty">{html.escape(label(session, method))}: no output yet.</div>'
    return tokens_html(recs, highlight_step=highlight)


def _wall_s(session: Session) -> dict[str, float] | None:
    """Each method's decode wall time as the page measured it (None for traces recorded before it did)."""
    timing = session.meta.timing
    return dict(timing.decode_s) if timing and timing.decode_s else None


def _vanilla_tps(session: Session) -> float | None:
    recs = session.records("vanilla")
    rows = metrics_rows({"vanilla": recs}, wall_s=_wall_s(session)) if recs else []
    return rows[0]["tokens_per_s"] if rows and rows[0]["tokens_per_s"] > 0 else None


def _same_output(session: Session, method: str) -> str:
    """Whether a method's tokens equal plain decoding's (greedy), as a short table cell."""
    ref, recs = session.records("vanilla"), session.records(method)
    if not ref or not recs or method == PLAIN:
        return "—"
    if not session.meta.greedy:
        return "sampled"
    a = [t for r in recs for t in r.new_tokens]
    b = [t for r in ref for t in r.new_tokens]
    n = min(len(a), len(b))
    diff = next((i for i in range(n) if a[i] != b[i]), None)
    if diff is None:
        return "yes" if len(a) == len(b) else f"yes (first {n} tokens)"
    return f"no: differs at token {diff}"


def metrics_markdown(session: Session) -> str:
    """A table of tokens, target forwards, mean accept length, tokens/s and speedup per method."""
    runs = {m: session.records(m) for m in (*TREE_METHODS, PLAIN) if session.records(m)}
    if not runs:
        return "No run yet."
    wall = _wall_s(session)
    rows = metrics_rows(runs, _vanilla_tps(session), wall_s=wall)
    lines = ["| method | nodes a step | tokens | target forwards | τ | tokens/s | speedup | "
             "same text as plain |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    settings = session.meta.settings
    budget = {"eagle2": (f"up to {settings['total_tokens']}" if settings.get("min_prob") or settings.get("expand_prob")
                         else settings.get("total_tokens", "—")),
              "eagle1": settings.get("static_nodes", len(settings.get("static_paths", [])) + 1), "vanilla": 1}
    budget.update({m: p["nodes"] for m, p in settings.get("panels", {}).items()})  # older traces: the above
    for r in rows:
        speed = f"{r['speedup']:.2f}×" if r["speedup"] is not None else "—"
        lines.append(f"| {label(session, r['method'])} | {budget[r['method']]} | {r['tokens']} | "
                     f"{r['target_forwards']} | {r['mean_accept_length']:.2f} | {r['tokens_per_s']:.1f} | {speed} | "
                     f"{_same_output(session, r['method'])} |")
    when = "in this run" if session.source == "live" else "when the trace was recorded"
    how = ("from the timed pass: after the live pass drew the trees, each method decoded again with nothing drawn "
           "meanwhile, the methods taking turns step by step so that none is favoured by its place, each timed as "
           "`python -m eagle2 bench` times it (its decode's own wall time, prefill included)" if wall else
           "from the engine's own phase timings (prefill included)")
    # τ is defined here, once on the page; the charts' τ comes from the same function (records.tau)
    note = (f"{TAU_DEFINITION}. The tokens and target forwards columns count the "
            "whole run, the prefill included. "
            f"Tokens/s: {how}, measured on this machine {when} ({session.meta.device or 'setup unknown'}). "
            "Speedup = tokens/s over plain decoding of the same prompt in the same run.")
    if settings and budget["eagle2"] != budget["eagle1"]:
        note += " ⚠ The two trees did not share a node budget, so their τ is not a like-for-like comparison."
    note += _limits_note(session)
    if "vanilla" not in runs:
        note += " Plain decoding has not run (yet), so there is no speedup."
    for r in rows:
        if r["lookup_accepted"]:
            note += (f" {label(session, r['method'])} accepted {r['lookup_accepted']} tokens that only its "
                     "prompt-lookup branch proposed.")
    return "\n".join(lines) + "\n\n" + note


def _limits_note(session: Session) -> str:
    """What the page's bounds did to this run: methods the time limit cut, steps whose pruned nodes were dropped."""
    note = ""
    limit = session.meta.limit
    if limit and limit.cut:
        cut = ", ".join(f"{label(session, m)} after {s:g} s" for m, s in limit.cut.items() if m in LABELS)
        note += (f" ⏱ The time limit ({limit.seconds:g} s a Generate, both passes together) ended "
                 f"{cut}: its output is kept, and its tokens/s counts only the tokens it made.")
    note += passes_note(session) + profile_note(session)
    for m in TREE_METHODS:
        steps = sorted(int(k) for k in session.meta.dropped.get(m, {}))
        if steps:
            nodes = sum(session.dropped(m, k) for k in steps)
            note += (f" To bound memory, {label(session, m)} steps {steps[0]}-{steps[-1]} keep their verified "
                     f"trees only ({nodes:,} pruned nodes not kept; the newest steps keep theirs). The text, "
                     "metrics and analysis are unchanged.")
    return note


def profile_note(session: Session) -> str:
    """How this machine's profile, which sized the trees, compares with the verify cost this run timed."""
    costs = session.meta.costs
    check = costs.check if costs else None
    if not check:
        return ""
    when = f" (measured {costs.measured})" if costs.measured else ""
    said = (f" The machine profile that sized the trees{when} predicted {check['predicted_ms']:.1f} ms to verify "
            f"{check['rows']} rows; this run's median was {check['measured_ms']:.1f} ms")
    off = abs(check["ratio"] - 1)
    if "shape" in check:  # judged against plain decoding's one-row step in the same run
        said += (f", and plain decoding's one-row step {check['plain_ms']:.1f} ms against "
                 f"{check['predicted_plain_ms']:.1f} predicted")
        shape = abs(check["shape"] - 1)
        if check.get("ok"):
            return said + f": the tree's cost against a step is within {shape:.0%} of the profile's."
        return said + (f": the tree's cost against a step is {shape:.0%} off the profile's, so the profile is "
                       "measured again on the next Generate.")
    if check.get("ok"):
        return said + f" (within {off:.0%})."
    return said + f", {off:.0%} off, so the profile is measured again on the next Generate."


def passes_note(session: Session, problems_only: bool = False) -> str:
    """Whether the live pass (drawn) and the timed pass gave the same tokens, as the run recorded it."""
    same = session.meta.timing.same_tokens if session.meta.timing else None
    if not same:
        return ""
    bad = {m: i for m, i in same.items() if i is not True and m in LABELS}
    if not bad:
        return "" if problems_only else " The live pass and the timed pass gave the same tokens."
    where = ", ".join(f"{label(session, m)} from token {i}" for m, i in bad.items())
    greedy = session.meta.greedy
    return (f" ⚠ The live pass and the timed pass gave different tokens: {where}" +
            (". Under greedy decoding they must not: please report it." if greedy else "."))


def analysis_views(session: Session) -> tuple[go.Figure, ...]:
    """Calibration, acceptance by position for each tree, accept length per step, accept length by tree size
    (replayed from the runs' records), and what each tree size costs on this machine (its break-even τ), with
    the costs of every profile stored from another device (assets/profiles) beside this machine's."""
    runs = {m: session.records(m) for m in TREE_METHODS if session.records(m)}
    heat = []
    for m in TREE_METHODS:
        fig = position_heatmap(session.records(m))
        fig.update_layout(title=dict(text=f"{label(session, m)}: acceptance by tree position"))
        heat.append(fig)
    meta = session.meta.to_dict()
    stored = stored_profiles()  # a few small files, read again each time so that a newly stored one shows
    size = tree_size_figure(session.records("eagle2"), meta, session.records("eagle1"), stored)
    depth = int(session.meta.settings.get("depth", 1) or 1)
    costs = cost_figure(meta.get("costs"), runs, depth, {m: label(session, m) for m in runs}, stored)
    return calibration_figure(runs), heat[0], heat[1], accept_length_figure(runs), size, costs


def step_caption(rec: StepRecord | None, dropped: int = 0) -> str:
    """A one-line summary of a step: what was drafted, accepted, and the phase times. `dropped`: pruned nodes
    the session did not keep for this step (they are counted as drafted, and the caption says so)."""
    if rec is None:
        return ""
    if rec.step == 0:
        return f"Step 0 is the prefill: the target read the prompt and produced one token ({rec.verify_ms:.0f} ms)."
    drafted, verified = len(rec.nodes) - 1 + dropped, len(rec.verified) - 1
    gone = (f" · its {dropped} pruned nodes were not kept (a session keeps {MAX_FADED_NODES:,}, the newest steps')"
            if dropped else "")
    new, cut = len(rec.new_tokens), len(rec.new_tokens) < len(rec.accepted) + 1
    why = {"eos": "the end-of-text token ended the run", "max_new_tokens": "the token limit ended the run"}
    kept = (f"{len(rec.accepted)} accepted + bonus, of which {counted(new, 'new token')} kept ({why[rec.stop]})"
            if cut and rec.stop in why else f"{len(rec.accepted)} accepted + bonus → {counted(new, 'new token')}")
    said = (f"Step {rec.step}: {drafted} drafted, {verified} verified, {kept} · draft {rec.draft_ms:.0f} ms, "
            f"verify {rec.verify_ms:.0f} ms, commit {rec.commit_ms:.0f} ms{gone}")
    bonus = bonus_entry(rec)
    why = step_sentences(rec, label_md, bonus[1] if bonus else None)
    if why:  # sampling: why each tried child went as it did, and where the bonus came from
        said += "\n\n**Sampling, sibling by sibling:**\n" + "\n".join(f"- {s}" for s in why)
    return said


def session_caption(session: Session, method: str, step: int | None = None) -> str:
    """`step_caption` for a session's step (the latest when None), saying what the session did not keep."""
    rec = session.record(method, step)
    if rec is None and not any(session.runs.values()):
        ttl = session_ttl_s()
        idle = f"{ttl / 60:.0f} minutes" if ttl >= 120 else f"{ttl:.0f} s"
        return ("No run to show: press Generate or load a trace. A session is freed when its page closes or after "
                f"{idle} without use.")
    return step_caption(rec, session.dropped(method, rec.step) if rec else 0)
