"""One visitor's runs (kept in gr.State, never in a module global) and their trace file export / import.

A Session holds every step record of the last run per method, the run's metadata and which steps the
page shows. Exported traces are eagle2.decode.records.Trace JSON; imported ones are checked field by field
so that a malformed or foreign file is refused with a message instead of breaking a figure later.
A session's size is bounded: past MAX_FADED_NODES pruned or never-expanded draft nodes, the oldest steps
lose theirs (`bound_faded`), and the page expires a session left unused for `session_ttl_s()`.
"""
from __future__ import annotations

import ctypes
import functools
import math
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from app_parts.meta import RunMeta
from app_parts.settings import env_seconds
from eagle2.config import METHODS
from eagle2.decode.records import PRUNED, SOURCES, UNEXPANDED, StepRecord, Trace
from eagle2.files import write_atomic
from eagle2.inputs import shown
from eagle2.policies import PANELS

TREE_METHODS = PANELS
MAX_TRACE_BYTES = 200 * 1024 * 1024
# Pruned and never-expanded draft nodes one session keeps (about 350 bytes each in memory, so about 7 MB): the
# paper's tree drafts 510 a step, so a long run at its settings would otherwise keep tens of MB per visitor.
MAX_FADED_NODES = 20_000
SESSION_TTL_S = 1800.0  # a session unused for this long is freed (EAGLE2_SESSION_TTL_S overrides)


def session_ttl_s() -> float:
    """Seconds a visitor's session is kept without use: EAGLE2_SESSION_TTL_S, else SESSION_TTL_S."""
    return env_seconds("EAGLE2_SESSION_TTL_S", SESSION_TTL_S)


@dataclass
class Session:
    """Per-visitor state: the records of the last run (or loaded trace) and the page's view of them."""

    runs: dict[str, list[StepRecord]] = field(default_factory=dict)
    meta: RunMeta = field(default_factory=RunMeta)
    follow: dict[str, bool] = field(default_factory=lambda: {m: True for m in TREE_METHODS})
    decode_s: dict[str, float] = field(default_factory=dict)  # wall time spent inside each decoder
    overhead_s: float = 0.0   # time spent building and sending views between decoder resumes
    source: str = ""          # "live" or the name of a loaded trace file
    shown: dict[str, int] = field(default_factory=dict)  # the step each tree shows when it does not follow
    play: int | None = None   # the step Play, Pause and the step buttons stand on (both trees together)
    playing: bool = False
    unfold_step: dict[str, int] | None = None  # the step of each method the unfold view replays

    def records(self, method: str) -> list[StepRecord]:
        """The records of one method (empty when it has not run)."""
        return self.runs.get(method, [])

    def record(self, method: str, step: int | None = None) -> StepRecord | None:
        """One step's record (the latest when `step` is None), clamped to the steps that exist."""
        recs = self.records(method)
        if not recs:
            return None
        if step is None:
            return recs[-1]
        return recs[min(max(int(step), 0), len(recs) - 1)]

    def last_step(self, method: str) -> int:
        """Index of the latest step of a method (0 when only the prefill or nothing is there)."""
        return max(len(self.records(method)) - 1, 0)

    def dropped(self, method: str, step: int) -> int:
        """Pruned or never-expanded nodes of one step that `bound_faded` did not keep (0 when none)."""
        return self.meta.dropped.get(method, {}).get(str(step), 0)


@dataclass
class RunControl:
    """Per-visitor switch (its own gr.State): Generate marks a run, Stop asks it to end after the current step.

    A click on Generate first counts a run as waiting (the queue holds it until the model is free); Stop
    while runs wait marks them to be skipped, and each ends at once when its turn comes (`take_turn`).
    """

    running: bool = False
    stop_requested: bool = False
    waiting: int = 0   # runs this visitor has queued that have not started
    skip: int = 0      # of those, how many Stop took back (the oldest first: a session's runs start in order)

    def take_turn(self) -> bool:
        """A queued run starts: True when it should decode, False when Stop took it out while it waited."""
        self.waiting = max(self.waiting - 1, 0)
        if self.skip > 0:
            self.skip -= 1
            return False
        self.running, self.stop_requested = True, False
        return True


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_freed_memory() -> None:
    """Give the memory Python has freed back to the system. glibc keeps freed heap pages in its arenas (one per
    thread that allocated; Gradio decodes in a pool of threads), so without this a server's resident size stays
    near its highest even once every session is gone. A no-op where the C library is not glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def free_session(session: Session) -> None:
    """A session's state is being dropped (its lifetime ran out): empty it now and give its memory back."""
    session.runs.clear()
    session.meta = RunMeta()
    release_freed_memory()


def _without_faded(r: StepRecord) -> StepRecord | None:
    """The record with only its root and verified nodes (ids renumbered in order), or None when a verified
    node hangs from a faded one (then the record stays whole)."""
    keep = [n for n in r.nodes if n.status not in (PRUNED, UNEXPANDED)]
    new_id = {n.id: i for i, n in enumerate(keep)}
    if any(n.parent >= 0 and n.parent not in new_id for n in keep):
        return None
    nodes = tuple(replace(n, id=new_id[n.id], parent=new_id.get(n.parent, -1)) for n in keep)
    return replace(r, nodes=nodes, accepted=tuple(new_id[a] for a in r.accepted))


def bound_faded(session: Session, limit: int | None = None) -> int:
    """Keep at most `limit` (MAX_FADED_NODES) pruned or never-expanded nodes: the oldest steps (of either tree) lose theirs
    first. Roots, verified nodes, verdicts and accepted paths all stay, and the relative order of the
    verified nodes too, so the text, the metrics and every analysis chart are unchanged; the steps that
    lost nodes are listed in `session.meta.dropped` (step -> nodes dropped) for the page to say so.
    Returns the number of nodes dropped."""
    faded = [(r.step, m, i, len(r.nodes) - len(r.verified)) for m, recs in session.runs.items()
             for i, r in enumerate(recs) if len(r.nodes) > len(r.verified)]
    excess = sum(n for *_, n in faded) - (MAX_FADED_NODES if limit is None else limit)
    dropped = 0
    for step, m, i, n in sorted(faded):
        if dropped >= excess:
            break
        trimmed = _without_faded(session.runs[m][i])
        if trimmed is None:
            continue
        session.runs[m][i] = trimmed
        book = session.meta.dropped
        if not isinstance(book.get(m), dict):
            book[m] = {}
        book[m][str(step)] = n
        dropped += n
    return dropped


def export_trace(session: Session, directory: str | Path | None = None) -> Path:
    """Write the session's runs as a Trace JSON file and return its path; ValueError when there is nothing."""
    if not any(session.runs.values()):
        raise ValueError("there is no run to export yet: press Generate first")
    trace = Trace(meta=session.meta.to_dict(), runs={m: list(r) for m, r in session.runs.items() if r})
    folder = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="eagle2-trace-"))
    path = folder / f"eagle2-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
    return write_atomic(path, trace.to_json())  # a visitor never downloads half a trace


def _fail(where: str, what: str) -> None:
    raise ValueError(f"malformed trace: {where}: {what}")


def _finite(x: object) -> bool:
    """A finite number of a size a float holds (a huge integer from a file is not one)."""
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < 1e300
            and math.isfinite(x))


def _check_record(method: str, i: int, r: StepRecord) -> None:
    """Refuse records whose fields a figure could not draw (wrong types, dangling ids)."""
    where = f"{method} record {i}"
    if r.method != method:
        _fail(where, f"its method is {shown(r.method)}")
    for name in ("step", "prefix_len", "bonus_token"):
        if not isinstance(getattr(r, name), int):
            _fail(where, f"{name} is not an integer")
    for name in ("draft_ms", "verify_ms", "commit_ms"):
        v = getattr(r, name)
        if not _finite(v) or v < 0:
            _fail(where, f"{name} is not a non-negative number")
    if len(r.new_texts) != len(r.new_tokens) or len(r.new_sources) != len(r.new_tokens):
        _fail(where, "new_tokens, new_texts and new_sources differ in length")
    if not all(isinstance(t, str) for t in (*r.new_texts, *r.new_sources)):
        _fail(where, "a token text or source is not a string")
    for j, n in enumerate(r.nodes):
        if n.id != j or not isinstance(n.parent, int) or not (-1 <= n.parent < j) or (j > 0) == (n.parent < 0):
            _fail(where, f"node {j} has id {shown(n.id)} and parent {shown(n.parent)}")
        if not isinstance(n.text, str) or not all(isinstance(x, int) for x in (n.token, n.depth, n.rank)):
            _fail(where, f"node {j} has a field of the wrong type")
        if not all(_finite(x) for x in (n.prob, n.score)):
            _fail(where, f"node {j} has a non-numeric probability or score")
        if n.source not in SOURCES:
            _fail(where, f"node {j} has an unknown source {shown(n.source)}")
    if any(not isinstance(a, int) or not 0 < a < len(r.nodes) for a in r.accepted):
        _fail(where, "an accepted node id is not in the tree")


def import_trace(text: str | bytes, name: str = "trace") -> Session:
    """A Session replaying a trace file; raises ValueError naming what is wrong with it."""
    if len(text) > MAX_TRACE_BYTES:
        raise ValueError(f"trace file is larger than {MAX_TRACE_BYTES // 2**20} MB: export a shorter run")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("trace file is not UTF-8 text (is it a JSON trace?)") from None
    trace = Trace.from_json(text)
    meta = RunMeta.from_dict(trace.meta)  # checked once, here: the page then reads typed fields
    unknown = [m for m in trace.runs if m not in METHODS]
    if unknown:
        raise ValueError(f"trace has runs of unknown methods {shown(unknown)}; expected {', '.join(METHODS)}")
    if not any(trace.runs.get(m) for m in TREE_METHODS):
        raise ValueError("trace has no EAGLE-2 or EAGLE-1 records to replay")
    for method, recs in trace.runs.items():
        for i, r in enumerate(recs):
            _check_record(method, i, r)
    session = Session(runs={m: list(r) for m, r in trace.runs.items()}, meta=meta, source=name)
    bound_faded(session)
    return session
