"""One colour per method on every chart, so that EAGLE-2 reads the same everywhere."""
from __future__ import annotations

METHOD_COLOURS = {"eagle2": "#1f77b4", "eagle1": "#d62728", "vanilla": "#7f7f7f"}


def colour(method: str) -> str:
    """A method's colour; EAGLE-2's variants share EAGLE-2's."""
    return METHOD_COLOURS.get("eagle2" if method.startswith("eagle2") else method, "#555555")
