"""One colour per method on every chart, so that EAGLE-2 reads the same everywhere."""
from __future__ import annotations

from eagle2.policies import CHAIN, DYNAMIC, PLAIN, REGISTRY, STATIC, growth_of

METHOD_COLOURS = {DYNAMIC: "#1f77b4", STATIC: "#d62728", PLAIN: "#7f7f7f", CHAIN: "#2ca02c"}


def colour(method: str) -> str:
    """A method's colour; EAGLE-2's variants share EAGLE-2's."""
    return METHOD_COLOURS.get(growth_of(method) if method in REGISTRY else method, "#555555")
