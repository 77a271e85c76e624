"""EAGLE-3 heads: the official layout, training-time test against drafting, and lossless decoding with them."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from conftest import tiny_target
from eagle2.heads import eagle3 as head3
from eagle2.heads.eagle import head_kind, load_head
from eagle2.train import eagle3
from eagle2.decode.tree import additive_mask

OFFICIAL = {"fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
            "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
            "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
            "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
            "norm.weight", "lm_head.weight", "d2t", "t2d"}


def random_head(target, vocab: list[int] | None = None, seed: int = 3, std: float = 0.3) -> head3.Eagle3Head:
    """An EAGLE-3 head for `target` with random weights large enough to make confident, varied drafts."""
    ids = torch.tensor(vocab if vocab is not None else list(range(target.config.vocab_size)))
    head = eagle3.new_head(target, ids, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith("embed_tokens"):
                p.add_(torch.randn(p.shape, generator=g) * std)
    return head.eval().requires_grad_(False)


def test_unrolled_training_matches_drafting():
    """Step k of the training-time test at base t equals drafting a chain k deep from the root pair at t with a
    cache, as the engine drafts: the head learns exactly what it will be asked."""
    target = tiny_target(vocab=16)
    head = random_head(target)
    torch.manual_seed(0)
    t, steps = 9, 4
    tokens = torch.randint(0, 16, (1, t))
    feats = torch.randn(1, t, 3 * target.config.hidden_size)
    outs = eagle3.unrolled(head, feats, tokens, torch.ones(1, t, dtype=torch.bool), steps)
    for base in (2, 4):
        cache = DynamicCache(config=head.config)
        vis = torch.ones(base + 1, base + 1, dtype=torch.bool).tril()
        out = head(tokens[:, 1:base + 2], feats[:, :base + 1], additive_mask(vis, 0, torch.float32),
                   torch.arange(base + 1)[None], cache)
        assert torch.allclose(out[0, base], outs[0][0, base], rtol=1e-4, atol=1e-4)
        prev = out[:, base:base + 1]
        for k in range(1, steps):  # depth-k node: sees the committed pairs and its own chain
            tok = tokens[:, base + k + 1:base + k + 2]
            mask = additive_mask(torch.ones(1, k, dtype=torch.bool), base + 1, torch.float32)
            prev = head(tok, prev, mask, torch.tensor([[base + k]]), cache)
            assert torch.allclose(prev[0, 0], outs[k][0, base], rtol=1e-4, atol=1e-4), (base, k)


def test_official_layout_round_trip(tmp_path):
    target = tiny_target(vocab=32)
    head = random_head(target, vocab=[1, 3, 4, 7, 9, 10, 11, 12, 15, 20, 21, 30])
    head3.save(head, tmp_path, target.config, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 12
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert set(weights) == OFFICIAL
    assert weights["t2d"].sum() == 12 and weights["t2d"][head.token_ids()].all()
    loaded = load_head(tmp_path, target)
    assert head_kind(loaded) == "eagle3" and torch.equal(loaded.token_ids(), head.token_ids())
    x = torch.randn(1, 5, 3 * target.config.hidden_size)
    mask = additive_mask(torch.ones(5, 5, dtype=torch.bool).tril(), 0, torch.float32)
    ids, pos = torch.tensor([[1, 2, 3, 4, 5]]), torch.arange(5)[None]
    assert torch.allclose(loaded.logits(loaded(ids, x, mask, pos)), head.logits(head(ids, x, mask, pos)), atol=1e-5)


def test_refuses_a_head_for_another_target(tmp_path):
    head3.save(random_head(tiny_target(vocab=32)), tmp_path, tiny_target(vocab=32).config)
    with pytest.raises(ValueError, match="vocab_size"):
        load_head(tmp_path, tiny_target(vocab=16))
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights.pop("norm.weight")
    from safetensors.torch import save_file
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="norm.weight"):
        load_head(tmp_path, tiny_target(vocab=32))


def test_training_learns_a_pattern():
    """A few hundred steps on one repeating sequence drive every unrolled step's top-1 to the target's choice."""
    target = tiny_target(vocab=16, std=0.5)
    g = torch.Generator().manual_seed(0)
    data = eagle3.Answers([torch.randint(0, 16, (24,), generator=g) for _ in range(4)], [4] * 4)
    cfg = eagle3.Fit3Config(steps=3, lr=3e-3, epochs=150, batch_tokens=256, heldout_every=0)
    head = eagle3.new_head(target, torch.arange(16))
    before = eagle3.evaluate(target, head, data, list(range(4)), cfg)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        head, report = eagle3.fit(target, data, torch.arange(16), d, cfg, log=lambda m: None)
    after = eagle3.evaluate(target, head, data, list(range(4)), cfg)
    assert after["step0_top1"] > 0.9 and after["step2_top1"] > 0.8
    assert after["step0_top1"] > before["step0_top1"] + 0.3


def test_training_checkpoints_every_ten_minutes(tmp_path, monkeypatch):
    """A long run writes its checkpoint every ten minutes of wall time, not only at the end, whatever the
    logging does in between (a clock that moves 25 s per reading stands in for a slow machine)."""
    target = tiny_target(vocab=16, std=0.5)
    g = torch.Generator().manual_seed(0)
    data = eagle3.Answers([torch.randint(0, 16, (24,), generator=g) for _ in range(4)], [4] * 4)
    cfg = eagle3.Fit3Config(steps=2, epochs=40, batch_tokens=64, heldout_every=0)
    clock = iter(range(0, 10**9, 25))
    monkeypatch.setattr(eagle3.time, "time", lambda: float(next(clock)))
    saves = []
    real_save = torch.save
    monkeypatch.setattr(eagle3.torch, "save", lambda obj, f: (saves.append(obj["state"]["step"]), real_save(obj, f)))
    _, report = eagle3.fit(target, data, torch.arange(16), tmp_path, cfg, log=lambda m: None)
    mid_run = [s for s in saves if s < report["steps"]]
    assert report["steps"] >= 40 and len(mid_run) >= 2 and saves[-1] == report["steps"]


PROMPT = [1, 5, 2, 7, 3]


def _plain(target, n):
    out = target.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("method", ["eagle2", "eagle1"])
def test_greedy_equals_plain_decoding_with_an_eagle3_head(method):
    from conftest import CharTokenizer
    from eagle2.config import DecodeConfig
    from eagle2.decode.engine import Decoder

    target = tiny_target(vocab=16)
    head = random_head(target, vocab=[0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15])
    head.set_vocab_order(torch.tensor([15, 3, 0, 1, 2, 5, 6, 8, 9, 10, 12, 13]))
    recs = list(Decoder(target, head, CharTokenizer()).run(PROMPT, DecodeConfig(method=method, max_new_tokens=30,
                                                                             top_k=4)))
    assert [t for r in recs for t in r.new_tokens] == _plain(target, 30)
    drafted = {n.token for r in recs[1:] for n in r.nodes if n.depth > 0}
    assert drafted and drafted <= {0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15}  # only the head's own vocabulary


def test_the_draft_is_the_eagle3_heads():
    """The first tree's root children are the head's top-k over its vocabulary, with its probabilities, computed
    independently from a teacher-forced target pass over three layers' hidden states."""
    from conftest import CharTokenizer
    from eagle2.config import DecodeConfig
    from eagle2.decode.engine import Decoder

    target = tiny_target(vocab=16)
    head = random_head(target, vocab=[0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15])
    recs = list(Decoder(target, head, CharTokenizer()).run(PROMPT, DecodeConfig(method="eagle2", max_new_tokens=4,
                                                                             top_k=3, total_tokens=8, depth=3)))
    first = recs[0].new_tokens[0]
    with torch.no_grad():
        hs = target.model(input_ids=torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in head.feature_layers], dim=-1)  # (1, P, 3H)
        p = len(PROMPT)
        out = head(torch.tensor([PROMPT[1:] + [first]]), feats,
                   additive_mask(torch.ones(p, p, dtype=torch.bool).tril(), 0, torch.float32), torch.arange(p)[None])
        probs = torch.softmax(head.logits(out[0, -1]), -1)
    top = probs.topk(3)
    want = [(int(head.token_ids()[i]), float(v)) for v, i in zip(top.values, top.indices)]
    got = sorted(((n.token, n.prob) for n in recs[1].nodes if n.depth == 1), key=lambda x: -x[1])
    assert [t for t, _ in got] == [t for t, _ in want]
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(got, want))


def test_serving_settings_and_describe_line_name_the_head_kind():
    from eagle2.loading import Bundle
    from eagle2.tools.serving import Shape, sglang_flags, tensorrt_llm_config, vllm_config

    assert "--speculative-algorithm EAGLE3 " in sglang_flags(Shape(3, 4, 8), kind="eagle3")
    assert "--speculative-algorithm EAGLE " in sglang_flags(Shape(3, 4, 8))
    assert vllm_config(Shape(4, 1, 5), kind="eagle3")["method"] == "eagle3"
    assert tensorrt_llm_config(Shape(3, 4, 8), kind="eagle3")["decoding_type"] == "Eagle3"
    target = tiny_target(vocab=16)
    b = Bundle(target=target, tokenizer=None, head=random_head(target), device=torch.device("cpu"),
               dtype=torch.float32, model_name="tiny", head_name="h3")
    assert b.head_kind == "eagle3" and "head EAGLE-3 h3" in b.describe()


def test_train_eagle3_end_to_end_and_resumes(tmp_path):
    """`train eagle3` on a tiny target: answers, training, an official-layout head with its card; a rerun
    reuses the stored answers and the finished schedule."""
    import argparse

    from conftest import CharTokenizer
    from eagle2.train import eagle3_pipeline as pipeline3

    class Tok(CharTokenizer):
        pad_token_id = 0

        def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
            return super().__call__(text)

    target = tiny_target(vocab=26)
    target.generation_config.eos_token_id = 25
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": w, "response": w[::-1]}) + "\n" for w in (
        "hello", "world", "speculative", "tree", "draft", "verify", "accept", "bonus")))
    parser = argparse.ArgumentParser()
    pipeline3.add_arguments(parser)
    args = parser.parse_args(["--prompts", str(prompts), "--out", str(tmp_path / "run"), "--minutes", "2",
                              "--max-new-tokens", "12", "--batch-size", "4", "--vocab", "20", "--steps", "2",
                              "--batch-tokens", "64", "--epochs", "3", "--references"])
    report = pipeline3.run(args, target, Tok())
    head_dir = tmp_path / "run" / "head"
    assert {"config.json", "model.safetensors", "draft_vocab.safetensors", "report.json", "README.md"} <= {
        p.name for p in head_dir.iterdir()}
    head = load_head(head_dir, target)
    assert head_kind(head) == "eagle3" and len(head.d2t) == 20 and len(head.draft_vocab) == 20
    assert report["steps"] == report["total_steps"] > 0 and "step1_top1" in report["heldout"]
    assert report["reference_tokens"] == sum(len(w) + 1 for w in ("hello", "world", "speculative", "tree", "draft",
                                                                 "verify", "accept", "bonus"))  # each ends in EOS
    assert report["sequences"] == 7 + 8 and report["heldout_sequences"] == 1  # references are never held out
    assert "EAGLE-3 draft head" in (head_dir / "README.md").read_text()
    stamp = (tmp_path / "run" / eagle3.ANSWERS).stat().st_mtime_ns
    first = json.loads((tmp_path / "run" / "minutes.json").read_text())["minutes"]
    again = pipeline3.run(args, target, Tok())
    assert (tmp_path / "run" / eagle3.ANSWERS).stat().st_mtime_ns == stamp and again["steps"] == report["steps"]
    total = json.loads((tmp_path / "run" / "minutes.json").read_text())["minutes"]
    assert total > first and again["minutes"] == round(total, 1)  # the card's wall time counts both invocations


@pytest.mark.slow
def test_the_page_runs_an_eagle3_head_and_says_so(embedded):
    """The page's Generate with an EAGLE-3 head on the real model: both trees drawn, every method's text equal
    to plain decoding's, and the trace names the head kind."""
    from dataclasses import replace

    from app_parts.presets import load_presets
    from app_parts.runner import generate
    from app_parts.settings import RunRequest

    head = eagle3.new_head(embedded.target, torch.arange(4096)).eval().requires_grad_(False)
    bundle = replace(embedded, head=head, head_name="an untrained EAGLE-3 head")
    req = RunRequest(prompt="Count from 1 to 5.", preset=next(iter(load_presets())), max_new_tokens=8)
    last = list(generate(req, lambda preset, say=None: bundle))[-1]
    assert last.error is None and set(last.trees) == {"eagle2", "eagle1"}
    s = last.session
    assert s.meta.head_kind == "eagle3" and "head EAGLE-3 an untrained EAGLE-3 head" in s.meta.device
    tokens = {m: [t for r in s.runs[m] for t in r.new_tokens] for m in s.runs}
    assert tokens["eagle2"] == tokens["vanilla"] == tokens["eagle1"] and len(tokens["vanilla"]) == 8


def test_interrupted_answers_continue_where_they_stopped():
    from conftest import CharTokenizer

    class Tok(CharTokenizer):
        pad_token_id = 0

    target = tiny_target(vocab=26)
    target.generation_config.eos_token_id = 25
    prompts = [[1, 2, 3, 4, 5, 6][:n] for n in (6, 5, 4, 3, 2, 1)]
    whole = eagle3.write_answers(target, Tok(), prompts, 6, 2, log=lambda m: None)
    saved = []
    first = eagle3.write_answers(target, Tok(), prompts, 6, 2, deadline=0.0, log=lambda m: None)
    assert first.tokens == []  # past its deadline at once: nothing done, nothing lost
    part = eagle3.Answers(whole.tokens[:2], whole.starts[:2])
    rest = eagle3.write_answers(target, Tok(), prompts, 6, 2, log=lambda m: None, done=part,
                                save=saved.append, save_every_s=0.0)
    assert [t.tolist() for t in rest.tokens] == [t.tolist() for t in whole.tokens] and rest.starts == whole.starts
    assert len(saved) == 2 and len(saved[-1].tokens) == 6  # saved after each of the two remaining batches


def test_both_head_kinds_score_their_drafts_through_one_interface():
    """The decoder asks either head kind the same things (`heads.Head`): its draft rows over the first n tokens of
    its draft vocabulary give the head's own logits over those tokens, and its input feature comes from the
    target forward it names (the last hidden state, or three layers' hidden states)."""
    from conftest import CharTokenizer
    from eagle2.decode.engine import Decoder
    from eagle2.heads import Head, head_kind
    from eagle2.heads.eagle import new_head

    target = tiny_target(vocab=16)
    e1 = new_head(target, seed=1)
    e1.draft_vocab = torch.tensor([7, 3, 0, 12, 5, 9, 1, 2, 4, 6, 8, 10])
    e3 = random_head(target, vocab=[0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15])
    e3.set_vocab_order(torch.tensor([15, 3, 0, 1, 2, 5, 6, 8, 9, 10, 12, 13]))
    x = torch.randn(2, target.config.hidden_size)
    with torch.no_grad():
        body = target.model(input_ids=torch.tensor([PROMPT]), output_hidden_states=True)
        for head, want, feats in (
                (e1, target.lm_head(x)[:, e1.draft_vocab[:5]], body.last_hidden_state),
                (e3, e3.logits(x)[:, e3.vocab_rows[:5]],
                 torch.cat([body.hidden_states[i] for i in e3.feature_layers], dim=-1))):
            assert all(hasattr(head, a) for a in Head.__annotations__)
            rows = Decoder(target, head, CharTokenizer()).draft_rows(5)
            assert rows.ids.tolist() == head.draft_vocab[:5].tolist()
            assert torch.allclose(rows.logits(x), want, atol=1e-6)
            assert torch.equal(head.target_features(body), feats)
    assert (head_kind(e1), head_kind(e3)) == ("eagle1", "eagle3")
