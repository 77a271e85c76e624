"""Serving engines' speculative-decoding settings as input: pasted as the engine takes them, parsed, checked
against that engine's constraints and mapped to the registered policy that engine runs (no torch).

What each engine's text looks like here (the engine is recognised from its own option names):
- SGLang's launch flags: `--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16`
  (num-draft-tokens counts the root). topk 1 is a chain; anything wider is EAGLE-2's tree, which SGLang grows.
- vLLM's `speculative_config` (JSON, alone or after `--speculative-config`): `num_speculative_tokens` drafts a
  chain (vLLM's EAGLE tree path is unfinished).
- TensorRT-LLM's `EagleDecodingConfig` fields, `name=value` or `name: value`: `max_draft_len`,
  `max_total_draft_tokens` (root not counted), `use_dynamic_tree`, `dynamic_tree_max_topK`.
- OpenVINO GenAI's `num_assistant_tokens` (non-root nodes), `branching_factor`, `tree_depth`.
- llama.cpp's `--spec-draft-n-max` and `--spec-draft-p-min`: a chain that stops when the draft is unsure.
Where a mapping is this project's reading rather than the engine's documentation, `EngineRun.reading` says so.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field, replace

from ..config import LIMITS, DecodeConfig
from ..decode.methods import Shared, config_for
from ..policies import CHAIN, DYNAMIC
from .serving import ASSUMED, ConstraintError, Shape, check_sglang, tensorrt_llm_config

ENGINES = ("sglang", "vllm", "tensorrt_llm", "openvino", "llama.cpp")
EXAMPLES = {
    "sglang": "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8",
    "vllm": '{"method": "eagle", "num_speculative_tokens": 3}',
    "tensorrt_llm": "max_draft_len=3, max_total_draft_tokens=8, use_dynamic_tree=True, dynamic_tree_max_topK=4",
    "openvino": "num_assistant_tokens=8, branching_factor=3, tree_depth=3",
    "llama.cpp": "--spec-draft-n-max 4 --spec-draft-p-min 0.75",
}
READINGS = {
    "tensorrt_llm": ASSUMED + "; without use_dynamic_tree (and without eagle_choices) a chain of max_draft_len",
    "openvino": ("openvino: tree_depth = drafted levels, branching_factor = children per expanded node, "
                 "num_assistant_tokens = verified nodes without the root, grown as EAGLE-2's tree; a branching "
                 "factor of 1 (or none) is a chain of num_assistant_tokens; the constraints checked are the tree's "
                 "own, not quoted from OpenVINO GenAI"),
}


@dataclass(frozen=True)
class EngineRun:
    """What an engine's settings run here: the policy, its settings (methods.Shared fields) and the engine's terms."""

    engine: str
    policy: str                 # a registered policy's name (eagle2/policies.py)
    settings: dict = field(default_factory=dict)  # total_tokens, depth, top_k; or chain_tokens, p_min
    terms: str = ""             # the settings in the engine's own words
    reading: str | None = None  # where the mapping is this project's reading, not the engine's documentation

    def to_dict(self) -> dict:
        return {"engine": self.engine, "policy": self.policy, "settings": dict(self.settings), "terms": self.terms,
                **({"reading": self.reading} if self.reading else {})}


def _whole(engine: str, flag: str, value, low: int = 1, high: int | None = None) -> int:
    """An engine's whole-number setting, refused in the engine's terms when it is not one or out of range."""
    try:
        n = int(str(value).strip())
        if str(value).strip() not in (str(n), f"+{n}"):
            raise ValueError
    except (TypeError, ValueError):
        raise ConstraintError(f"{engine}: {flag} must be a whole number, not {value!r}") from None
    if n < low:
        raise ConstraintError(f"{engine}: {flag} must be at least {low}, not {n}")
    if high is not None and n > high:
        raise ConstraintError(f"{engine}: {flag} {n} is more than this page runs (at most {high})")
    return n


def _flags(text: str, engine: str) -> dict[str, str]:
    """`--name value` / `--name=value` pairs from a command line."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ConstraintError(f"{engine}: cannot read the flags: {e}") from None
    out, i = {}, 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            name, eq, value = w.partition("=")
            if not eq:
                value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else ""
                i += 1 if value == "" else 2
            else:
                i += 1
            out[name] = value
        else:
            i += 1
    return out


def _fields(text: str) -> dict[str, str]:
    """`name=value` / `name: value` / JSON fields, for config classes pasted as text."""
    obj = _json_object(text)
    if obj is not None:
        return {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in obj.items()}
    return {m.group(1): m.group(2).strip().strip("\"'") for m in
            re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)\s*[:=]\s*(\[[^\]]*\]|[^,\s)]+)", text)}


def _json_object(text: str) -> dict | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        obj = json.loads(text[start:end + 1])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _tree(engine: str, steps: int, topk: int, nodes: int, terms: str, reading: str | None) -> EngineRun:
    """EAGLE-2's tree of `nodes` verified (root counted), or a chain where only one child is drafted a level."""
    if topk == 1:
        return _chain(engine, steps, 0.0, terms, reading)
    for name, value in (("total_tokens", nodes), ("depth", steps), ("top_k", topk)):
        lo, hi = LIMITS[name]
        if not lo <= value <= hi:
            raise ConstraintError(f"{engine}: {terms} needs {name.replace('_', ' ')} {value}; this page runs "
                                  f"{lo} to {hi}")
    return EngineRun(engine, DYNAMIC, {"total_tokens": nodes, "depth": steps, "top_k": topk}, terms, reading)


def _chain(engine: str, n: int, p_min: float, terms: str, reading: str | None = None) -> EngineRun:
    hi = LIMITS["depth"][1]
    if n > hi:
        raise ConstraintError(f"{engine}: {terms} drafts {n} tokens a step; this page drafts chains of at most {hi}")
    return EngineRun(engine, CHAIN, {"chain_tokens": n, "p_min": p_min}, terms, reading)


def _sglang(text: str) -> EngineRun:
    f = _flags(text, "sglang")
    names = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    missing = [n for n in names if n not in f]
    if missing:
        raise ConstraintError(f"sglang: give {', '.join(missing)} as well (SGLang chooses defaults per model when "
                              "they are left out; here all three are needed to grow its tree)")
    steps, topk, nodes = (_whole("sglang", n, f[n]) for n in names)
    check_sglang(Shape(steps, topk, nodes))
    terms = f"SGLang: steps {steps}, topk {topk}, {nodes} draft tokens (root counted)"
    return _tree("sglang", steps, topk, nodes, terms, None)


def _vllm(text: str) -> EngineRun:
    obj = _json_object(text)
    if obj is None:
        raise ConstraintError("vllm: speculative_config must be a JSON object such as " + EXAMPLES["vllm"])
    if "num_speculative_tokens" not in obj:
        raise ConstraintError("vllm: speculative_config needs num_speculative_tokens (the chain's length)")
    n = _whole("vllm", "num_speculative_tokens", obj["num_speculative_tokens"])
    method = obj.get("method")
    terms = f"vLLM: num_speculative_tokens {n}" + (f", method {method}" if method else "") + " (a chain)"
    return _chain("vllm", n, 0.0, terms)


def _truth(engine: str, name: str, value: str) -> bool:
    v = value.strip().lower()
    if v not in ("true", "false", "1", "0"):
        raise ConstraintError(f"{engine}: {name} must be True or False, not {value!r}")
    return v in ("true", "1")


def _tensorrt_llm(text: str) -> EngineRun:
    f = _fields(text)
    if "max_draft_len" not in f:
        raise ConstraintError("tensorrt_llm: EagleDecodingConfig needs max_draft_len (the drafted levels)")
    steps = _whole("tensorrt_llm", "max_draft_len", f["max_draft_len"], low=0)
    if steps == 0:
        raise ConstraintError("tensorrt_llm: max_draft_len 0 drafts nothing: give at least 1")
    dynamic = _truth("tensorrt_llm", "use_dynamic_tree", f.get("use_dynamic_tree", "False"))
    if not dynamic:
        if "eagle_choices" in f:
            raise ConstraintError("tensorrt_llm: a static tree from eagle_choices runs here as policy eagle1 with "
                                  "--tree (paste the choices there); these flags take the chain or dynamic tree")
        return _chain("tensorrt_llm", steps, 0.0, f"TensorRT-LLM: max_draft_len {steps}, static (a chain)",
                      READINGS["tensorrt_llm"])
    for need in ("max_total_draft_tokens", "dynamic_tree_max_topK"):
        if need not in f:
            raise ConstraintError(f"tensorrt_llm: use_dynamic_tree=True needs {need} as well")
    drafts = _whole("tensorrt_llm", "max_total_draft_tokens", f["max_total_draft_tokens"])
    topk = _whole("tensorrt_llm", "dynamic_tree_max_topK", f["dynamic_tree_max_topK"])
    tensorrt_llm_config(Shape(steps, topk, drafts + 1))  # raises with TensorRT-LLM's terms
    terms = (f"TensorRT-LLM: max_draft_len {steps}, max_total_draft_tokens {drafts} (root not counted), "
             f"dynamic tree, dynamic_tree_max_topK {topk}")
    return _tree("tensorrt_llm", steps, topk, drafts + 1, terms, READINGS["tensorrt_llm"])


def _openvino(text: str) -> EngineRun:
    f = _fields(text)
    if "num_assistant_tokens" not in f:
        raise ConstraintError("openvino: give num_assistant_tokens (the draft tokens verified a step)")
    n = _whole("openvino", "num_assistant_tokens", f["num_assistant_tokens"])
    width = _whole("openvino", "branching_factor", f.get("branching_factor", "1"))
    if width == 1:
        return _chain("openvino", n, 0.0, f"OpenVINO GenAI: num_assistant_tokens {n} (a chain)", READINGS["openvino"])
    if "tree_depth" not in f:
        raise ConstraintError("openvino: branching_factor above 1 grows a tree: give tree_depth as well")
    depth = _whole("openvino", "tree_depth", f["tree_depth"])
    shape = Shape(depth, width, n + 1)
    if n < depth:
        raise ConstraintError(f"openvino: num_assistant_tokens ({n}) must be at least tree_depth ({depth}): a tree "
                              "that deep needs a node on every level")
    if n > shape.capacity:
        raise ConstraintError(f"openvino: num_assistant_tokens ({n}) must be <= branching_factor + (tree_depth - 1) "
                              f"* branching_factor^2 = {shape.capacity}")
    terms = (f"OpenVINO GenAI: num_assistant_tokens {n} (root not counted), branching_factor {width}, "
             f"tree_depth {depth}")
    return _tree("openvino", depth, width, n + 1, terms, READINGS["openvino"])


def _llama_cpp(text: str) -> EngineRun:
    f = _flags(text, "llama.cpp")
    if "--spec-draft-n-max" not in f:
        raise ConstraintError("llama.cpp: give --spec-draft-n-max (the most tokens drafted a step)")
    n = _whole("llama.cpp", "--spec-draft-n-max", f["--spec-draft-n-max"])
    p_min = 0.0
    if "--spec-draft-p-min" in f:
        raw = f["--spec-draft-p-min"]
        try:
            p_min = float(raw)
        except ValueError:
            raise ConstraintError(f"llama.cpp: --spec-draft-p-min must be a number, not {raw!r}") from None
        if not 0.0 <= p_min <= 1.0:
            raise ConstraintError(f"llama.cpp: --spec-draft-p-min is a probability (0 to 1), not {p_min:g}")
    terms = f"llama.cpp: --spec-draft-n-max {n}" + (f", --spec-draft-p-min {p_min:g}" if p_min else "") + " (a chain)"
    return _chain("llama.cpp", n, p_min, terms)


PARSERS = {"sglang": _sglang, "vllm": _vllm, "tensorrt_llm": _tensorrt_llm, "openvino": _openvino,
           "llama.cpp": _llama_cpp}
MARKERS = (("sglang", "--speculative-num-steps"), ("sglang", "--speculative-eagle-topk"),
           ("sglang", "--speculative-num-draft-tokens"), ("llama.cpp", "--spec-draft-"),
           ("vllm", "num_speculative_tokens"), ("vllm", "--speculative-config"), ("tensorrt_llm", "max_draft_len"),
           ("tensorrt_llm", "max_total_draft_tokens"), ("openvino", "num_assistant_tokens"),
           ("openvino", "branching_factor"), ("openvino", "tree_depth"))


def which_engine(text: str) -> str:
    """The engine whose option names the text uses."""
    found = {engine for engine, marker in MARKERS if marker in text}
    if len(found) == 1:
        return found.pop()
    examples = "; ".join(f"{e}: {x}" for e, x in EXAMPLES.items())
    if not found:
        raise ConstraintError(f"no engine's speculative-decoding settings found in {text[:80]!r}; paste one of "
                              f"these engines' own settings, e.g. {examples}")
    raise ConstraintError(f"these settings mix engines ({', '.join(sorted(found))}): paste one engine's at a time")


def parse_engine_flags(text: str) -> EngineRun:
    """An engine's pasted settings -> the policy and settings it runs here; ConstraintError (a ValueError) names
    the engine, the flag and the constraint when the engine would refuse them."""
    if not isinstance(text, str) or not text.strip():
        raise ConstraintError("the engine settings are empty; e.g. " + EXAMPLES["sglang"])
    if len(text) > 4000:
        raise ConstraintError(f"the engine settings are {len(text):,} characters; at most 4,000 are read")
    return PARSERS[which_engine(text)](text)


def engine_config(text: str, shared: Shared) -> tuple[EngineRun, DecodeConfig]:
    """(what an engine's settings run here, its DecodeConfig) on top of the command line's or the page's shared
    settings: the engine's tree replaces any tuned or given size."""
    run = parse_engine_flags(text)
    return run, config_for(run.policy, replace(shared, tuned={}, **run.settings))
