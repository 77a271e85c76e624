"""The page's workload tab: diagnose an uploaded prompt file as `python -m eagle2 diagnose` does, within bounds.

Each prompt is decoded greedily once with the large recorded tree (eagle2/tools/diagnose.py's RECORD), every smaller
shape replayed from those records, and the report drawn from its JSON alone. The machine's costs come from
the page's profile (eagle2/tools/profile.py) when it has been measured, so no extra timing runs here. Bounded for a
public page: a small file, few prompts, short answers; Stop ends it after the current step and keeps what
was decoded.
"""
from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from app_parts.presets import ModelPreset, load_presets
from app_parts.session import RunControl
from eagle2.api import encode_prompt, stream
from eagle2.config import DecodeConfig
from eagle2.inputs import check_number, check_text
from eagle2.tools.diagnose import RECORD, report, write
from eagle2.loading import Bundle
from eagle2.tools.prompts import read_rows
from viz.empty import note_figure
from viz.workload import curves_figure, position_figure

MAX_BYTES = 200_000
MAX_PROMPTS = 20
MAX_NEW_TOKENS = 64


@dataclass
class WorkloadUpdate:
    status: str
    curves: go.Figure | None = None
    positions: go.Figure | None = None
    summary: str | None = None
    flags: str | None = None
    files: list[str] | None = None
    error: str | None = None


def empty_views() -> tuple[go.Figure, go.Figure]:
    return (note_figure("Upload a prompt file and press Diagnose.", "τ by verified nodes, replayed"),
            note_figure("acceptance by depth and sibling rank appears here", "Acceptance by position"))


def read_file(path: str | None, limit: int) -> list:
    """The rows of an uploaded prompt file, or a ValueError saying what is wrong with it."""
    if not path or not isinstance(path, str):
        raise ValueError("upload a .jsonl (or JSON list) of prompts first: rows with `turns`, `prompt` or "
                         "`instruction`, optionally `category`")
    size = Path(path).stat().st_size
    if size > MAX_BYTES:
        raise ValueError(f"the file has {size:,} bytes; the page takes up to {MAX_BYTES:,} (the command line "
                         "`python -m eagle2 diagnose` has no limit)")
    rows = read_rows(path)
    if not rows:
        raise ValueError("the file has no prompts")
    if len(rows) > MAX_PROMPTS:
        raise ValueError(f"the file has {len(rows)} prompts; the page takes up to {MAX_PROMPTS} (use --limit on "
                         "the command line for more)")
    return rows[:limit]


def summary_markdown(out: dict) -> str:
    """The recommendation, the conformance checks and the worst collapses, as markdown."""
    rec, lines = out["recommended"], []
    if "cpu" in rec:
        c = rec["cpu"]
        lines.append(f"**Fastest here** (costs measured on this machine): {c['num_draft_tokens']} nodes, depth "
                     f"{c['steps']}, top-k {c['topk']}, predicted τ {c['tau']:.2f}, {c['tokens_per_s']:.1f} tokens/s.")
    g = rec["gpu"]
    lines.append(f"**GPU profile** (verify flat up to {rec['gpu_profile']['verify_flat_up_to_rows']} rows): "
                 f"{g['num_draft_tokens']} nodes, depth {g['steps']}, top-k {g['topk']}, predicted τ {g['tau']:.2f}.")
    lines.append("**Conformance**: " + ", ".join(f"{k} {'passed' if v['passed'] else 'FAILED'}"
                                                  for k, v in out["conformance"].items()) + ".")
    for p in out["per_prompt"]:
        worst = p["collapses"]["worst"][:2]
        where = "; ".join(f"after {c['context']!r} the draft said {c['draft']!r}, the target {c['target']!r}"
                          for c in worst)
        lines.append(f"- prompt {p['id']} ({p['category']}): {p['tokens']} tokens, "
                     f"{p['collapses']['count']} collapsed steps" + (f": {where}" if where else ""))
    lines.append(f"\n*τ*: {out['definitions']['tau']}. *Conditional*: {out['definitions']['conditional']}. "
                 f"*Mean*: {out['definitions']['mean']}.")
    return "\n".join(lines)


def flags_text(out: dict) -> str:
    rec = out["recommended"]
    return (f"# SGLang\n{rec['sglang']}\n# vLLM speculative_config\n{json.dumps(rec['vllm'])}\n"
            f"# TensorRT-LLM (see the report's 'assumed')\n{json.dumps(rec['tensorrt_llm'])}\n"
            f"# OpenVINO GenAI (this project's reading of its tree fields)\n{json.dumps(rec['openvino'])}\n"
            f"# llama.cpp (a chain, as vLLM's)\n{rec['llama.cpp']}")


def diagnose(path: str | None, max_new_tokens: float, preset_name: str,
             get_bundle: Callable[[ModelPreset], Bundle], get_profile: Callable[[ModelPreset, Bundle], dict | None],
             control: RunControl) -> Iterator[WorkloadUpdate]:
    """The Diagnose button as a stream of updates; bad input yields one update with `error`."""
    control.running, control.stop_requested = True, False
    try:
        if isinstance(max_new_tokens, float) and max_new_tokens.is_integer():
            max_new_tokens = int(max_new_tokens)  # a slider's value
        check_number("max new tokens", max_new_tokens, 1, MAX_NEW_TOKENS, whole=True)
        n = int(max_new_tokens)
        presets = load_presets()
        preset = presets[check_text("model preset", preset_name, 1000, presets)]
        rows = read_file(path, MAX_PROMPTS)
    except (ValueError, OSError) as e:
        yield WorkloadUpdate(status=f"⚠ {e}", error=str(e))
        return
    try:
        yield WorkloadUpdate(status=f"Preparing {preset.name}…")
        bundle = get_bundle(preset)
        profile = get_profile(preset, bundle)
        cfg = DecodeConfig(max_new_tokens=n, **RECORD)
        prompts, decodes = [], []
        for i, row in enumerate(rows, 1):
            if control.stop_requested:
                break
            yield WorkloadUpdate(status=f"Decoding prompt {i} of {len(rows)} with a {RECORD['total_tokens']}-node "
                                        f"tree (depth {RECORD['depth']}, top-k {RECORD['top_k']})…")
            ids = encode_prompt(bundle.tokenizer, row.prompt)
            decodes.append(list(stream(bundle, ids, cfg, should_stop=lambda: control.stop_requested)))
            prompts.append({"id": i, "category": row.category or "uncategorised"})
        if not decodes:
            yield WorkloadUpdate(status="Stopped before any prompt was decoded.")
            return
        verify = {int(k): v for k, v in profile["verify_ms"].items()} if profile else None
        rest = {int(k): v for k, v in profile["rest_ms"].items()} if profile else None
        kind = bundle.head_kind
        out = report(prompts, decodes, verify, rest, interrupted=control.stop_requested, head_kind=kind)
        out.update(device=bundle.describe(), head_kind=kind, created=time.strftime("%Y-%m-%d %H:%M:%S"))
        folder = Path(tempfile.mkdtemp(prefix="eagle2-workload-"))
        files = [str(folder / "workload.json"), str(folder / "workload.html")]
        write(out, files[0], files[1])
        stopped = " (stopped: the prompts decoded so far)" if control.stop_requested else ""
        yield WorkloadUpdate(status=f"Done{stopped}: {len(decodes)} prompt(s) diagnosed.",
                             curves=curves_figure(out["overall"]["tau"], "τ by verified nodes, all prompts, replayed"),
                             positions=position_figure(out["position"], "conditional"),
                             summary=summary_markdown(out), flags=flags_text(out), files=files)
    except (ValueError, RuntimeError) as e:
        yield WorkloadUpdate(status=f"⚠ diagnosis failed: {e}", error=f"diagnosis failed: {e}")
    finally:
        control.running = False
