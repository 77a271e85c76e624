"""Sampling verification in words, from a step's recorded numbers alone (temperature > 0).

The verifier tries an accepted node's children one after another against the target's residual distribution:
a child is accepted when the draw is below the residual's probability of its token; on rejection that
probability is set to 0 and the rest renormalised, and when every child fails the bonus is drawn from what
remains. These sentences retell that, sibling by sibling, for the tree's hover, the step caption and the
unfold's verdict frame. Greedy records carry no numbers, so every function here returns nothing for them.
"""
from __future__ import annotations

from typing import Callable

from eagle2.decode.records import ACCEPTED, Node, StepRecord

Quote = Callable[[str], str]  # token text -> safe, visible text for the medium (HTML hover or markdown)


def sampled(record: StepRecord) -> bool:
    """Whether the step was verified by sampling and recorded its numbers (not greedy, not an older trace)."""
    return bool(record.residual_top) or any(n.draw is not None for n in record.nodes)


def num(p: float) -> str:
    """A probability or a draw, readable at any size: 0.314, 3.2e-05, 0."""
    return "0" if p == 0 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def tried(record: StepRecord, parent: int) -> list[Node]:
    """The children of `parent` the verifier tried, in its order (parents first, then siblings by pool id)."""
    return sorted((n for n in record.nodes if n.parent == parent and n.draw is not None), key=lambda n: n.id)


def node_sentence(record: StepRecord, node: Node, quote: Quote, sep: str = "; ") -> str:
    """Why a tried child was accepted or rejected, e.g. "target's probability of 'the' after rejecting 'a': 0.31;
    draw 0.57 ≥ 0.31 → rejected; ..."; '' for a node that was not tried."""
    if node.target_prob is None or node.draw is None:
        return ""
    before = [m for m in tried(record, node.parent) if m.id < node.id]
    after = f" after rejecting {', '.join(quote(m.text) for m in before)}" if before else ""
    p, u = node.target_prob, node.draw
    sign = "<" if u < p else "≥"  # from the numbers, so a record that disagrees with its verdict shows it
    said = f"target's probability of {quote(node.text)}{after}: {num(p)}{sep}draw {num(u)} {sign} {num(p)} → "
    if node.verdict == ACCEPTED:
        return said + "accepted"
    return said + f"rejected{sep}its probability is set to 0 and the rest renormalised"


def stop_node(record: StepRecord) -> Node:
    """The node where the accepted path stopped: its last accepted node, or the root."""
    return record.nodes[record.accepted[-1]] if record.accepted else record.nodes[0]


def residual_lines(record: StepRecord, quote: Quote, bonus_text: str | None = None) -> list[str]:
    """Where the bonus came from, in short lines that read as sentences joined by spaces (a hover joins them by
    line breaks): the residual at the stopping node, its top tokens one a line, the bonus drawn from it; [] without
    recorded residual tokens. `bonus_text`: the bonus's text where the record's top tokens lack it."""
    if not record.residual_top:
        return []
    stop = stop_node(record)
    rejected = [m for m in tried(record, stop.id) if m.verdict != ACCEPTED]
    if rejected:
        where = [f"every child of {quote(stop.text)} was rejected,", "so the bonus is drawn from the residual:",
                 f"the target's distribution with {', '.join(quote(m.text) for m in rejected)} set to 0,",
                 "renormalised."]
    else:
        where = [f"{quote(stop.text)} has no verified child to try,",
                 "so the bonus is drawn from the target's own distribution there."]
    last = len(record.residual_top) - 1
    top = [f"{quote(text)} {num(p)}{'.' if i == last else ','}" for i, (_, text, p) in enumerate(record.residual_top)]
    text = {t: s for t, s, _ in record.residual_top}.get(record.bonus_token, bonus_text)
    drawn = quote(text) if text is not None else f"token {record.bonus_token}"
    chance = f" (probability {num(record.bonus_prob)})" if record.bonus_prob is not None else ""
    return [*where, "Its top tokens:", *top, f"Drawn: {drawn}{chance}."]


def residual_sentence(record: StepRecord, quote: Quote, bonus_text: str | None = None) -> str:
    """`residual_lines` as one sentence ('' without them)."""
    return " ".join(residual_lines(record, quote, bonus_text))


def step_sentences(record: StepRecord, quote: Quote, bonus_text: str | None = None) -> list[str]:
    """The whole verdict of a sampled step, sibling by sibling down the accepted path, then the bonus."""
    if not sampled(record):
        return []
    out = []
    for parent in (record.nodes[0].id, *record.accepted):
        at = f"at the root {quote(record.nodes[0].text)}" if parent == record.nodes[0].id else \
            f"at {quote(record.nodes[parent].text)}"
        out += [f"{at}: {node_sentence(record, n, quote)}" for n in tried(record, parent)]
    out.append(residual_sentence(record, quote, bonus_text))
    return [s[0].upper() + s[1:] for s in out if s]
