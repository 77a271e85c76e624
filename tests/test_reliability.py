"""Reliability cases of a public page not covered elsewhere: any script in the prompt, broken model files, and the
security rules (no pickle outside weights_only, no remote code) checked on the source itself."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("eagle2", "viz", "app_parts", "checks") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]

PROMPTS = {
    "emoji": "Reply with three emoji about the sea 🌊🐟",
    "code": "Fix this: def f(x):\n    return x +* 1",
    "right-to-left": "ترجم إلى الإنجليزية: مرحبا بالعالم",
    "cjk": "用一句话介绍你自己。",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(PROMPTS))
def test_any_script_runs_and_shows_without_replacement_characters(embedded, kind):
    from app_parts.presets import CACHE, load_presets
    from app_parts.runner import generate
    from app_parts.settings import RunRequest

    preset = next(iter(load_presets()))
    CACHE.put(preset, embedded)
    req = RunRequest(prompt=PROMPTS[kind], preset=preset, max_new_tokens=10, with_vanilla=True)
    updates = list(generate(req, CACHE.get))
    last = updates[-1]
    assert last.status.startswith("Done."), last.status
    s = last.session
    ids = {m: [t for r in s.records(m) for t in r.new_tokens] for m in ("eagle2", "eagle1", "vanilla")}
    assert ids["eagle2"] == ids["eagle1"] == ids["vanilla"] and len(ids["vanilla"]) == 10  # still lossless
    for m in ("eagle2", "eagle1"):
        texts = [n.text for r in s.records(m) for n in r.nodes] + [t for r in s.records(m) for t in r.new_texts]
        assert not any("\ufffd" in t for t in texts)
        assert "\ufffd" not in last.texts[m]


def _tiny_model_dir(tmp_path: Path, tokenizer) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path / "model"
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.mark.slow
def test_missing_or_corrupt_model_files_are_named(embedded, tmp_path):
    from eagle2.loading import load_target

    cpu = torch.device("cpu")
    with pytest.raises(RuntimeError, match="no such directory"):
        load_target(str(tmp_path / "nowhere"), cpu, torch.float32)
    d = _tiny_model_dir(tmp_path, embedded.tokenizer)
    target, _ = load_target(str(d), cpu, torch.float32)  # the intact directory loads
    assert target.config.hidden_size == 16
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated download
    with pytest.raises(RuntimeError, match=r"weights of model .*model.* SafetensorError"):
        load_target(str(d), cpu, torch.float32)
    weights.unlink()
    with pytest.raises(RuntimeError, match="weights of model"):
        load_target(str(d), cpu, torch.float32)
    (d / "tokenizer.json").write_text("{ not json")
    with pytest.raises(RuntimeError, match="tokenizer of model"):
        load_target(str(d), cpu, torch.float32)


def _call_text(text: str, open_paren: int) -> str:
    """The text of a call from its opening parenthesis to the matching closing one."""
    depth = 0
    for i in range(open_paren, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_paren: i + 1]
    return text[open_paren:]


def test_every_torch_load_is_weights_only_and_nothing_unpickles():
    calls = 0
    for path in SOURCES:
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(", text):
            call = _call_text(text, m.end() - 1)
            assert "weights_only=True" in call, f"{path.relative_to(ROOT)}: {call}"
            calls += 1
        assert not re.search(r"^\s*(import pickle|from pickle|import dill|import joblib)", text, flags=re.M), path
        assert not re.search(r"pickle\.loads?\(", text), path
    assert calls >= 2  # the .bin head loader and training checkpoints: the scan did find them


def test_no_remote_code_anywhere():
    for path in SOURCES + [ROOT / "tests" / "conftest.py"]:
        assert not re.search(r"trust_remote_code\s*=\s*True", path.read_text()), path.relative_to(ROOT)


def test_the_page_offers_operator_presets_only():
    """No textbox on the page names a model or head: the dropdown lists the operator's presets."""
    text = (ROOT / "app.py").read_text() + (ROOT / "app_parts" / "settings.py").read_text()
    boxes = [_call_text(text, m.end() - 1) for m in re.finditer(r"gr\.Textbox\(", text)]
    assert len(boxes) >= 2  # the prompt and the custom tree: the scan found the page's text boxes
    for call in boxes:  # each whole call, nested parentheses and all
        assert not re.search(r"\b(model|head)\b", call, flags=re.I), call
    dropdown = _call_text(text, re.search(r'r\["preset"\] = gr\.Dropdown\(', text).end() - 1)
    assert "names" in dropdown and "names = list(presets)" in text  # its choices are the presets' names


def test_two_processes_converting_the_gguf_at_once_both_succeed(tmp_path, monkeypatch):
    """The first-run conversion writes into a folder of its own; the one that finishes second keeps the
    other's copy instead of failing (two `train generate` jobs started together once crashed here)."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle2 import loading

    class _Tok:
        def save_pretrained(self, d):
            (Path(d) / "tokenizer.json").write_text("{}")

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Tok())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: LlamaForCausalLM(cfg))
    out = tmp_path / "cache" / "model-f32"
    loading._convert_gguf(tmp_path / "x.gguf", out)   # the winner
    first = (out / "model.safetensors").read_bytes()
    loading._convert_gguf(tmp_path / "x.gguf", out)   # finishes second: keeps the winner's copy
    assert (out / "model.safetensors").read_bytes() == first
    assert sorted(p.name for p in out.parent.iterdir()) == ["model-f32"]  # no temporary folder left behind
