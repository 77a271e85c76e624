"""Step records: the engine's output contract, plain frozen data that serialises to JSON.

Every figure, metric and trace is built from these records and nothing else. A record holds every
draft candidate of one decoding step (kept, pruned or never expanded), the target's verdict on each
verified node, the accepted path, the bonus token and the timings of the phases.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..inputs import load_json, shown

TRACE_VERSION = 1

# Node.status values.
ROOT = "root"              # last committed token; the tree hangs from it
KEPT = "kept"              # drafted and sent to the target for verification
PRUNED = "pruned"          # drafted and expanded, then dropped at the final rerank
UNEXPANDED = "unexpanded"  # drafted, never expanded, dropped at the final rerank

# Node.source values: who proposed the node.
SOURCES = ("draft", "lookup", "both")  # the draft's top-k, prompt lookup only, or both

# Node.verdict values (only for ROOT and KEPT nodes; None otherwise).
ACCEPTED = "accepted"      # on the accepted path
REJECTED = "rejected"      # parent accepted, this token was not
UNREACHED = "unreached"    # parent not accepted (or a sibling won first), so never decided


@dataclass(frozen=True, slots=True)
class Node:
    """One draft candidate. `id` indexes the record's node list; the root is id 0 with parent -1."""

    id: int
    parent: int
    token: int
    text: str
    depth: int
    rank: int          # rank among its siblings in the draft's top-k (0 = most confident)
    prob: float        # draft probability of this token given its parent (1.0 for the root)
    score: float       # cumulative log-probability along the path (0.0 for the root)
    status: str
    expanded: bool     # whether the draft head was run on this node to propose children
    verdict: str | None = None
    target_token: int | None = None  # target's own choice after this node (greedy), if verified
    target_text: str | None = None
    source: str = "draft"  # who proposed it: "draft" (the head's top-k), "lookup" (prompt lookup only) or "both"
    # Sampling (temperature > 0), on each child the target tried: the residual's probability of this token at its
    # turn (after its earlier siblings were rejected) and the uniform draw; accepted exactly when draw < target_prob.
    target_prob: float | None = None
    draw: float | None = None


_SAMPLED_NODE = ("target_prob", "draw")  # set only on the nodes a sampled step tried


def _number(v: Any, name: str, optional: bool = False) -> float | None:
    """A number read from a trace, as a float (None stays None where `optional`); ValueError naming the field."""
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, int) and abs(v) > 2 ** 53):
        raise ValueError(f"{name} must be a number, not {shown(v, 40)}")  # 2^53: past it float() rounds or raises
    return float(v)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One decoding step: draft, verify, accept, commit. Step 0 is the prefill (no tree)."""

    step: int
    method: str
    prefix_len: int                 # tokens committed before this step (prompt included)
    nodes: tuple[Node, ...]         # every candidate; empty for the prefill and plain decoding
    accepted: tuple[int, ...]       # node ids on the accepted path, root excluded
    bonus_token: int                # the token the target itself added after the accepted path
    new_tokens: tuple[int, ...]     # tokens committed by this step (accepted + bonus, cut at EOS/limit)
    new_texts: tuple[str, ...]
    new_sources: tuple[str, ...]    # per new token: "draft" (accepted draft) or "target" (bonus/prefill)
    draft_ms: float
    verify_ms: float
    commit_ms: float
    stop: str | None = None         # on a run's last record, why it stopped: "eos", "max_new_tokens" or "stopped"
    # Sampling: the residual distribution at the node where the path stopped, its likeliest tokens as
    # (token, text, probability), and the bonus token's probability under it (the bonus is drawn from it).
    residual_top: tuple[tuple[int, str, float], ...] = ()
    bonus_prob: float | None = None

    @property
    def target_forwards(self) -> int:
        """Target forwards the step took: one (the prefill, or the verify of the whole tree)."""
        return 1

    @property
    def verified(self) -> tuple[Node, ...]:
        """Root and kept nodes: the tree the target checked in one forward."""
        return tuple(n for n in self.nodes if n.status in (ROOT, KEPT))

    def scored(self, node: Node) -> bool:
        """Whether the draft gave this node its probability: true for every node drafted from its parent's row
        (the parent was expanded), false for the root and for a prompt-lookup branch's tokens past the drafted
        levels, whose `prob` is only a floor."""
        return node.parent >= 0 and self.nodes[node.parent].expanded

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON; the sampling fields only where they hold something, so a greedy trace is as before."""
        d = asdict(self)
        for n in d["nodes"]:
            for k in _SAMPLED_NODE:
                if n[k] is None:
                    del n[k]
        if not self.residual_top:
            del d["residual_top"], d["bonus_prob"]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "StepRecord":
        nodes = tuple(Node(**{**n, **{k: _number(n.get(k), k, True) for k in _SAMPLED_NODE}}) for n in d["nodes"])
        fields = {k: v for k, v in d.items() if k not in ("nodes", "target_forwards")}  # the latter: always 1
        for k in ("accepted", "new_tokens", "new_texts", "new_sources"):
            fields[k] = tuple(fields[k])
        # The sampling fields are checked here, as the page does arithmetic and formatting on them.
        fields["residual_top"] = tuple((int(_number(t, "a residual token")), str(s), _number(p, "a residual p"))
                                       for t, s, p in fields.get("residual_top", ()))
        fields["bonus_prob"] = _number(fields.get("bonus_prob"), "bonus_prob", True)
        return StepRecord(nodes=nodes, **fields)


# The one definition of the mean accept length τ: every table, chart, bench, report and trace computes it with
# `tau_counts` / `tau`. The prefill is left out because it drafts nothing: its forward reads the prompt and yields
# one token whatever the method, so counting it would pull every method's τ toward 1.0 by an amount that depends
# on the run's length, not on its drafts.
TAU_DEFINITION = ("τ (mean accept length) = tokens committed by the drafted steps ÷ their target forwards, one a "
                  "step: the accepted draft tokens plus the target's bonus token, the prefill (its forward and its "
                  "one token) not counted; plain decoding scores 1.0")


def decoding_steps(records: Iterable[StepRecord]) -> list[StepRecord]:
    """Every step after the prefill (step 0): the steps τ counts."""
    return [r for r in records if r.step != 0]


def tau_counts(records: Iterable[StepRecord]) -> tuple[int, int]:
    """(tokens, target forwards) of the steps τ counts; add them over runs to pool τ as a bench does."""
    steps = decoding_steps(records)
    return sum(len(r.new_tokens) for r in steps), sum(r.target_forwards for r in steps)


def tau(records: Iterable[StepRecord]) -> float:
    """The mean accept length τ of one run (TAU_DEFINITION); 0.0 when it took no step after the prefill."""
    tokens, forwards = tau_counts(records)
    return tokens / forwards if forwards else 0.0


@dataclass(frozen=True)
class RunSummary:
    """Totals of one run, derived from its records."""

    method: str
    new_tokens: int
    target_forwards: int
    wall_s: float
    mean_accept_length: float
    tokens_per_s: float


def summarise(method: str, records: list[StepRecord], wall_s: float) -> RunSummary:
    """A run's totals (prefill included) and its τ (`tau`: the prefill left out)."""
    new = sum(len(r.new_tokens) for r in records)
    fwd = sum(r.target_forwards for r in records)
    return RunSummary(
        method=method,
        new_tokens=new,
        target_forwards=fwd,
        wall_s=wall_s,
        mean_accept_length=tau(records),
        tokens_per_s=new / wall_s if wall_s > 0 else 0.0,
    )


PHASES = ("draft", "verify", "commit", "rest")  # a drafted step's phases, in the order they run


def phase_totals(records: list[StepRecord], wall_s: float) -> dict[str, float]:
    """Where a run's time went, from its records' own timers, as sums that add over runs: `runs` (1), `steps` (the
    drafted steps), the prefill's ms, and the drafted steps' ms of drafting, of verifying (the target's forward
    over the tree and its verdicts), of committing, and of the rest (building the record, the loop), which is
    the wall time those leave."""
    steps = decoding_steps(records)
    prefill = sum(r.draft_ms + r.verify_ms + r.commit_ms for r in records if r.step == 0)
    totals = {f"{k}_ms": sum(getattr(r, f"{k}_ms") for r in steps) for k in PHASES[:3]}
    totals["rest_ms"] = max(wall_s * 1e3 - prefill - sum(totals.values()), 0.0)
    return {"runs": 1, "steps": len(steps), "prefill_ms": prefill, **totals}


def per_step(totals: dict[str, float]) -> dict[str, float]:
    """`phase_totals` (of one run, or added over runs) as the prefill's mean ms a run and each phase's mean ms a
    drafted step."""
    n = totals["steps"]
    return {"prefill_ms": totals["prefill_ms"] / totals["runs"],
            **{f"{k}_ms_per_step": totals[f"{k}_ms"] / n if n else 0.0 for k in PHASES}}


def step_phases(records: list[StepRecord], wall_s: float) -> dict[str, float]:
    """Where one run's time went (`phase_totals`): the prefill's ms, and per drafted step the mean ms of each
    phase."""
    return per_step(phase_totals(records, wall_s))


NODE_FIELDS = frozenset(Node.__dataclass_fields__)
RECORD_FIELDS = frozenset(StepRecord.__dataclass_fields__) | {"target_forwards"}
LIST_FIELDS = ("nodes", "accepted", "new_tokens", "new_texts", "new_sources")


def _check_shape(where: str, d: object, known: frozenset, lists: tuple[str, ...]) -> None:
    """A record or node from a file: an object with the dataclass's fields (lists where lists belong)."""
    if not isinstance(d, dict):
        raise ValueError(f"malformed step record in trace: {where} is not an object")
    # Fields later than the first traces (they load with their defaults).
    optional = {"target_forwards", "verdict", "target_token", "target_text", "source", "stop", "target_prob", "draw",
                "residual_top", "bonus_prob"}
    missing, unknown = known - optional - set(d), set(d) - known
    if missing or unknown:
        what = "; ".join(x for x in (f"missing {', '.join(sorted(missing))}" if missing else "",
                                     f"unknown {shown(sorted(unknown))}" if unknown else "") if x)
        raise ValueError(f"malformed step record in trace: {where}: {what}")
    bad = [k for k in lists if not isinstance(d[k], list)]
    if bad:
        raise ValueError(f"malformed step record in trace: {where}: {', '.join(bad)} must be lists")


@dataclass(frozen=True)
class Trace:
    """A whole session's runs, exportable as JSON and replayable without a model."""

    meta: dict[str, Any]
    runs: dict[str, list[StepRecord]] = field(default_factory=dict)
    version: int = TRACE_VERSION

    def to_json(self) -> str:
        """The trace as JSON; `tau` is derived from the runs for a reader without this code (ignored on load)."""
        return json.dumps({
            "version": self.version,
            "meta": self.meta,
            "tau": {"definition": TAU_DEFINITION, **{m: round(tau(recs), 4) for m, recs in self.runs.items()}},
            "runs": {m: [r.to_dict() for r in recs] for m, recs in self.runs.items()},
        })

    @staticmethod
    def from_json(text: str) -> "Trace":
        """Parse a trace; raises ValueError naming what is wrong."""
        d = load_json(text, "not a JSON trace: the file")
        if not isinstance(d, dict) or "runs" not in d:
            raise ValueError("not an eagle2-viz trace: no 'runs' field (export one with the page's Export button)")
        if d.get("version") != TRACE_VERSION:
            raise ValueError(f"trace version {shown(d.get('version'))} is not supported (this build reads "
                             f"{TRACE_VERSION}): export the trace again with this version")
        if not isinstance(d["runs"], dict) or not all(isinstance(v, list) for v in d["runs"].values()):
            raise ValueError("malformed step record in trace: 'runs' must map each method to a list of records")
        for m, recs in d["runs"].items():
            for i, r in enumerate(recs):
                _check_shape(f"{shown(m, 20)} record {i}", r, RECORD_FIELDS, LIST_FIELDS)
                for j, n in enumerate(r["nodes"]):
                    _check_shape(f"{shown(m, 20)} record {i} node {j}", n, NODE_FIELDS, ())
        try:
            runs = {m: [StepRecord.from_dict(r) for r in recs] for m, recs in d["runs"].items()}
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise ValueError(f"malformed step record in trace: {shown(str(e), 160)}") from None
        return Trace(meta=d.get("meta", {}), runs=runs)
