"""Prompt files for the bench, the tuner's callers and training: a JSON list or JSONL of rows in the formats
benchmarks and instruction sets use (MT-bench / Spec-Bench `turns`, `prompt`, Alpaca `instruction` + `input`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PromptRow:
    prompt: str                    # the user's message (a multi-turn row's first turn)
    category: str | None = None    # MT-bench's category, where a row has one
    reference: str | None = None   # a reference answer (Alpaca's `output`, a row's `response`), where given


def _row(r: object, where: str) -> PromptRow:
    if not isinstance(r, dict):
        raise ValueError(f"{where}: a row must be a JSON object")
    cat = r.get("category") if isinstance(r.get("category"), str) else None
    if "instruction" in r:
        extra = (r.get("input") or "").strip()
        return PromptRow(r["instruction"].strip() + ("\n\n" + extra if extra else ""), cat, r.get("output"))
    text = r["turns"][0] if isinstance(r.get("turns"), list) and r["turns"] else r.get("prompt")
    if not isinstance(text, str):
        raise ValueError(f"{where}: a row has none of instruction, turns, prompt ({', '.join(sorted(r)[:5])})")
    return PromptRow(text, cat, r.get("response"))


def read_rows(path: str | Path, limit: int | None = None) -> list[PromptRow]:
    """Every row of a prompt file (the first `limit`); raises ValueError naming the file and line."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
        rows = [_row(r, f"{path}: row {i}") for i, r in enumerate(data if isinstance(data, list) else [data], 1)]
    except json.JSONDecodeError:
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(_row(json.loads(line), f"{path}:{n}"))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON: {e}") from None
    return rows[:limit] if limit else rows


def read_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """The user prompts of a prompt file (see read_rows)."""
    return [r.prompt for r in read_rows(path, limit)]
