"""Shared fixtures: a tiny random Llama target with a random head, and the real embedded model (loaded once)."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from checks.serve import served_app  # noqa: F401  (the tests' name for it)

# The suite's own cache, never the user's: the converted model, the row kernel's build, the machine profile and
# anything else written to a cache folder go under the checkout's .cache/test-suite (ignored by git), whatever
# the environment says, so that a profile measured while tests and a browser share the cores never sizes the
# user's page.
SUITE_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-suite"
os.environ["EAGLE2_CACHE"] = str(SUITE_CACHE / "eagle2-viz")
os.environ["TORCH_EXTENSIONS_DIR"] = str(SUITE_CACHE / "torch_extensions")
os.environ["XDG_CACHE_HOME"] = str(SUITE_CACHE)
os.environ["HF_HOME"] = str(SUITE_CACHE / "huggingface")
os.environ["HF_HUB_OFFLINE"] = "1"


class CharTokenizer:
    """A minimal tokenizer for tiny test models: token i is the letter chr(97 + i)."""

    chat_template = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + int(i) % 26) for i in ids)

    def __call__(self, text: str) -> dict:
        return {"input_ids": [(ord(c) - 97) % 26 for c in text]}


def tiny_target(vocab: int = 16, seed: int = 0, std: float = 0.02, heads: int = 4, kv_heads: int = 2
                ) -> LlamaForCausalLM:
    """A 2-layer random Llama (float32, sdpa) small enough to run thousands of times (head size 64 / heads)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      initializer_range=std, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def first_step(dec, ids, cfg, **kw):
    """The first drafted step of a run, whole: the run stops after it (`should_stop`) instead of being cut by a
    token limit, which would keep only part of what the step accepted."""
    asked = iter([False])
    return list(dec.run(ids, replace(cfg, max_new_tokens=64), should_stop=lambda: next(asked, True), **kw))[1]


@pytest.fixture
def tiny():
    from eagle2.heads.eagle import new_head

    target = tiny_target()
    return target, new_head(target, seed=1), CharTokenizer()


@pytest.fixture(scope="session")
def embedded():
    """The real SmolLM2-135M-Instruct bundle with its default head; loaded once per test session."""
    from eagle2.loading import load

    return load("embedded", device="cpu")
