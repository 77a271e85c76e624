"""Prompt files for the bench, the tuner's callers and training: a JSON list or JSONL of rows in the formats
benchmarks and instruction sets use (MT-bench / Spec-Bench `turns`, `prompt`, Alpaca `instruction` + `input`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..inputs import load_json, shown


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
        extra = r.get("input") or ""
        if not isinstance(r["instruction"], str) or not isinstance(extra, str):
            raise ValueError(f"{where}: `instruction` and `input` must be text")
        extra = extra.strip()
        return PromptRow(r["instruction"].strip() + ("\n\n" + extra if extra else ""), cat, _text(r.get("output")))
    text = r["turns"][0] if isinstance(r.get("turns"), list) and r["turns"] else r.get("prompt")
    if not isinstance(text, str):
        keys = ", ".join(shown(k, 20) for k in sorted(r)[:5])
        raise ValueError(f"{where}: a row has none of instruction, turns, prompt with text (it has: {keys})")
    return PromptRow(text, cat, _text(r.get("response")))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def read_rows(path: str | Path, limit: int | None = None) -> list[PromptRow]:
    """Every row of a prompt file (the first `limit`); raises ValueError naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{Path(path).name} is not UTF-8 text: save the prompts as UTF-8 JSON lines") from None
    try:  # one JSON value: a list of rows, or one row
        data = load_json(text, Path(path).name)
    except ValueError:
        if text.lstrip().startswith("[") or len(text.strip().splitlines()) < 2:
            raise
    else:
        rows = [_row(r, f"{path}: row {i}") for i, r in enumerate(data if isinstance(data, list) else [data], 1)]
        return rows[:limit] if limit else rows
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            rows.append(_row(load_json(line, f"{path}:{n}"), f"{path}:{n}"))
            if limit and len(rows) >= limit:
                break
    return rows


def read_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """The user prompts of a prompt file (see read_rows)."""
    return [r.prompt for r in read_rows(path, limit)]
