"""Tests for eagle2/train: loss goes down, shards round-trip, checkpoints resume, batches are built right."""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from eagle2.heads.eagle import load_head, save_head
from eagle2.tools.prompts import read_prompts
from eagle2.train.data import (GREEDY, SAMPLED, TEACHER, Sequence, load_sequences, read_shard,
                               generate_responses, target_features, target_features_argmax, write_shard)
from eagle2.train.checkpoint import latest_checkpoint, load_latest_head, trainable_head
from eagle2.train.batches import collate, load_split, make_batches
from eagle2.train.card import write_card
from eagle2.train.eagle import TrainConfig, _remap, data_vocab, evaluate_checkpoint, head_forward, losses, train

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _sequences(target, n: int = 12, seed: int = 0) -> list[Sequence]:
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        toks = torch.randint(0, 256, (8 + 3 * (i % 5),), generator=g).tolist()
        (feats,) = target_features(target, [toks])
        kind = SAMPLED if i % 4 == 3 else GREEDY
        seqs.append(Sequence(tokens=torch.tensor(toks), features=feats, start=3, kind=kind))
    return seqs


def _write_data(target, directory: Path, seqs: list[Sequence]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_shard(directory / "shard_00000.safetensors", seqs)
    (directory / "manifest.json").write_text(json.dumps({"shards": {"shard_00000.safetensors": {
        "sequences": len(seqs), "tokens": sum(len(s.tokens) for s in seqs),
        "response_tokens": sum(len(s.tokens) - s.start for s in seqs), "seconds": 0.0}}}))


def test_features_are_post_norm_and_unaffected_by_padding(target):
    a, b = [5, 6, 7, 8, 9], [1, 2, 3]
    fa, fb = target_features(target, [a, b])
    (fb_alone,) = target_features(target, [b])
    torch.testing.assert_close(fb, fb_alone, atol=1e-5, rtol=1e-5)
    full = target(input_ids=torch.tensor([a]), output_hidden_states=False).logits[0]
    torch.testing.assert_close(target.lm_head(fa), full, atol=1e-4, rtol=1e-4)  # lm_head(feature) = logits


def test_shard_round_trip(target, tmp_path):
    seqs = _sequences(target, 5)
    write_shard(tmp_path / "s.safetensors", seqs)
    back = read_shard(tmp_path / "s.safetensors")
    assert len(back) == 5
    for s, r in zip(seqs, back):
        assert r.tokens.tolist() == s.tokens.tolist() and r.start == s.start and r.kind == s.kind
        assert r.features.dtype == torch.float16
        torch.testing.assert_close(r.features.float(), s.features, atol=2e-3, rtol=2e-3)


def test_read_prompts_formats(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": "Add", "input": "1 2", "output": "3"},
                                                 {"instruction": "Hi", "input": ""}]))
    (tmp_path / "b.jsonl").write_text('{"turns": ["first", "second"]}\n{"prompt": "p"}\n')
    assert read_prompts(tmp_path / "a.json") == ["Add\n\n1 2", "Hi"]
    assert read_prompts(tmp_path / "b.jsonl") == ["first", "p"]


def test_collate_labels_and_mask(target):
    s = _sequences(target, 1)[0]
    batch = collate([s, Sequence(s.tokens[:5], s.features[:5], start=2)])
    n = len(s.tokens)
    # input i is (x_{i+1}, f_i); target f_{i+1}; label x_{i+2}, only from the last prompt position on
    assert batch["in_tokens"][0].tolist() == s.tokens[1:].tolist()
    torch.testing.assert_close(batch["target"][0], s.features[1:].float())
    assert batch["labels"][0, s.start - 1].item() == s.tokens[s.start + 1].item()
    assert (batch["labels"][0, : s.start - 1] == -100).all() and batch["labels"][0, n - 2].item() == -100
    assert batch["train_pos"][1].tolist() == [False, True, True, True] + [False] * (n - 5)


def test_make_batches_cover_everything_within_budget(target):
    seqs = _sequences(target, 12)
    batches = make_batches(seqs, 40, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(12))
    assert all(len(b) == 1 or len(b) * max(len(seqs[i].tokens) for i in b) <= 40 for b in batches)


def test_steps_reduce_loss_on_fixed_batch(target):
    cfg = TrainConfig(ce_vocab="full")
    head, params = trainable_head(target)
    assert not any(p.requires_grad for p in target.parameters())
    opt = torch.optim.AdamW(params, lr=3e-3)
    batch = collate(_sequences(target, 6))
    lm = target.lm_head.weight
    embed_before = target.model.embed_tokens.weight.clone()
    history = []
    for _ in range(30):
        ((pred, tgt, m, labels),) = head_forward(head, batch)
        reg, ce = losses(pred, tgt, m, labels, lm, cfg, None)
        loss = reg + cfg.ce_weight * ce
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
    assert history[-1] < 0.7 * history[0]
    assert torch.equal(target.model.embed_tokens.weight, embed_before)  # the shared embedding stays frozen


def test_soft_labels_sharpen_to_the_greedy_token_as_temperature_falls(target):
    batch = collate(_sequences(target, 6))
    tgt, m = batch["target"], batch["train_pos"]
    pred = tgt + torch.randn(tgt.shape, generator=torch.Generator().manual_seed(0))  # a draft near the target
    lm = target.lm_head.weight
    with torch.no_grad():
        greedy = (tgt @ lm.T).argmax(-1)  # the target's own next token at every position
        _, hard = losses(pred, tgt, m, greedy, lm, TrainConfig(ce_vocab="full"), None)
        ce = {t: losses(pred, tgt, m, greedy, lm, TrainConfig(ce_vocab="full", ce_target="soft", ce_temperature=t),
                        None)[1].item() for t in (1.0, 0.01)}
    assert ce[0.01] == pytest.approx(hard.item(), rel=1e-3)  # nearly one-hot on the greedy token
    assert abs(ce[1.0] - hard.item()) > 0.01  # the full distribution is a different target


def test_train_resume_and_export(target, tmp_path):
    seqs = _sequences(target, 30)
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    _write_data(target, data, seqs)
    assert len(load_sequences(data)) == 30
    cfg = TrainConfig(epochs=2, batch_tokens=64, save_every=1000, max_minutes=1e-9, heldout_every=5)
    first = train(target, data, ckpt, cfg)  # stops after one step on the time limit, checkpointing
    assert first["steps"] == 1 and latest_checkpoint(ckpt).name == "step_0000001.pt"
    head1, _ = load_latest_head(target, ckpt)
    full = train(target, data, ckpt, TrainConfig(epochs=2, batch_tokens=64, save_every=1000, heldout_every=5))
    assert full["steps"] == full["total_steps"] > 1
    assert latest_checkpoint(ckpt).name == f"step_{full['steps']:07d}.pt"
    head2, state = load_latest_head(target, ckpt)
    assert state["step"] == full["steps"]
    assert not torch.equal(head1.fc.weight, head2.fc.weight)
    straight = train(target, data, tmp_path / "ckpt2", TrainConfig(epochs=2, batch_tokens=64, save_every=1000,
                                                                    heldout_every=5))
    head3, _ = load_latest_head(target, tmp_path / "ckpt2")  # an uninterrupted run ends at the same weights
    assert straight["steps"] == full["steps"]
    torch.testing.assert_close(head3.fc.weight, head2.fc.weight, atol=1e-6, rtol=1e-5)
    assert 0.0 <= full["heldout"]["top1"] <= full["heldout"]["top3"] <= full["heldout"]["top10"] <= 1.0
    assert full["heldout"]["positions"] > 0
    save_head(head2, tmp_path / "head")
    write_card(tmp_path / "head", [data], state, full)
    card = (tmp_path / "head" / "README.md").read_text()
    assert "CC BY-NC 4.0" in card and f"{full['heldout']['top1']:.3f}" in card and f"{state['step']} steps" in card
    row = " | ".join(f"{full['heldout'][k]:.3f}" for k in ("top1", "top3", "top10", "depth2_top1", "depth3_top1"))
    assert "| depth-2 top-1 | depth-3 top-1 |" in card and f"| {row} |" in card  # the held-out table
    assert "depth 1 only" in card and card.startswith("---\nlicense: cc-by-nc-4.0\nbase_model: ")
    assert not any(w.startswith("/") for w in card.split("## How to reproduce")[1].split())  # no machine paths
    soft = {**state, "config": {**state["config"], "ce_target": "soft", "ce_temperature": 0.5, "unroll": 3,
                                "unroll_weight": 0.5}}
    (tmp_path / "soft").mkdir()
    write_card(tmp_path / "soft", [data], soft, full)
    soft_card = (tmp_path / "soft" / "README.md").read_text()
    assert "soft labels at temperature 0.5" in soft_card and "depths 2 to 3 unrolled" in soft_card
    loaded = load_head(tmp_path / "head", target)
    torch.testing.assert_close(loaded.fc.weight, head2.fc.weight.half().float())


def test_warm_start_and_evaluate_from_an_exported_head(target, tmp_path):
    """`fit --init` and `evaluate --ckpt` take a shipped head directory: training starts from its (fp16) weights,
    and evaluating the directory itself scores exactly those weights."""
    seqs = _sequences(target, 30)
    data = tmp_path / "data"
    _write_data(target, data, seqs)
    cfg = TrainConfig(epochs=2, batch_tokens=64, save_every=1000, heldout_every=5)
    train(target, data, tmp_path / "a", cfg)
    trained, _ = load_latest_head(target, tmp_path / "a")
    save_head(trained, tmp_path / "head")
    shipped, state = load_latest_head(target, tmp_path / "head")
    assert state["step"] == 0 and state["init"] == {"head": "head"}
    torch.testing.assert_close(shipped.fc.weight, trained.fc.weight.half().float(), atol=0, rtol=0)
    scored = evaluate_checkpoint(target, data, tmp_path / "head", cfg)["heldout"]
    fresh = evaluate_checkpoint(target, data, tmp_path / "a", cfg)["heldout"]
    assert scored["positions"] == fresh["positions"] > 0
    stopped = train(target, data, tmp_path / "b", TrainConfig(epochs=2, batch_tokens=64, save_every=1000,
                                                                 heldout_every=5, lr=0.0),
                    init=tmp_path / "head")  # lr 0: the warm start is all there is
    again, state_b = load_latest_head(target, tmp_path / "b")
    assert stopped["steps"] > 1 and state_b["init"] == {"head": "head"}
    torch.testing.assert_close(again.fc.weight, shipped.fc.weight, atol=0, rtol=0)
    assert stopped["heldout"]["top1"] == pytest.approx(scored["top1"])
    cold = train(target, data, tmp_path / "c", TrainConfig(epochs=2, batch_tokens=64, save_every=1000,
                                                             heldout_every=5, lr=0.0))
    cold_head, _ = load_latest_head(target, tmp_path / "c")
    assert not torch.allclose(cold_head.fc.weight, shipped.fc.weight)  # without --init it starts elsewhere
    save_head(again, tmp_path / "head2")
    write_card(tmp_path / "head2", [data], state_b, stopped)
    assert "Warm-started from the exported head `head`" in (tmp_path / "head2" / "README.md").read_text()


def test_teacher_labels_come_from_target_argmax(target, tmp_path):
    toks = [3, 17, 42, 99, 5, 8, 250, 1]
    ((feats, top),) = target_features_argmax(target, [toks])
    torch.testing.assert_close(top, target.lm_head(feats).argmax(-1))
    s = Sequence(tokens=torch.tensor(toks), features=feats, start=3, kind=TEACHER, argmax=top)
    write_shard(tmp_path / "t.safetensors", [s])
    (back,) = read_shard(tmp_path / "t.safetensors")
    batch = collate([back])
    # input i predicts f_{i+1}; its label is the target's own greedy choice there, not the text's next token
    assert batch["labels"][0, 2:7].tolist() == top[3:8].tolist()
    assert (batch["labels"][0, :2] == -100).all()


def test_data_vocab_keeps_most_frequent_labels_and_remaps(target):
    s = Sequence(tokens=torch.tensor([1, 2, 3, 4, 5, 6]), features=torch.zeros(6, 64), start=1, kind=TEACHER,
                 argmax=torch.tensor([7, 7, 9, 7, 9, 11]))
    vocab = data_vocab([s], 2)
    assert vocab.tolist() == [7, 9]
    assert _remap(torch.tensor([9, 11, -100, 7]), vocab, 256).tolist() == [1, -100, -100, 0]


def test_generate_responses_match_plain_greedy(target):
    class Tok:
        pad_token_id = 0

    prompts = [[5, 9, 11, 200, 3], [17, 4], [1, 2, 3, 250, 251, 252, 40]]

    def plain(p: list[int], eos: int) -> list[int]:
        ids = torch.tensor([p])
        return target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                               do_sample=False, pad_token_id=0, eos_token_id=eos)[0, len(p):].tolist()

    eos = plain(prompts[0], -1)[2]  # a token the first prompt emits early: rows finish at different steps
    target.generation_config.eos_token_id = eos
    got = generate_responses(target, Tok(), prompts, max_new_tokens=12, context=4)
    for p, s in zip(prompts, got):
        ref = plain(p, eos)
        ref = ref[: ref.index(eos) + 1 if eos in ref else len(ref)]
        c = min(len(p), 4)
        assert s.start == c and s.tokens.tolist() == p[-c:] + ref[:-1]  # the final token is never fed back
        assert s.argmax[c - 1:].tolist() == ref  # greedy: the target's choice after each position
        (full,) = target_features(target, [p + ref[:-1]])  # features gathered while decoding = a fresh pass
        torch.testing.assert_close(s.features, full[len(p) - c:], atol=1e-4, rtol=1e-4)
    assert got[0].argmax[-1] == eos and len({len(s.tokens) - s.start for s in got}) > 1


def test_unrolled_depths_match_drafting_with_a_cache(target):
    head, _ = trainable_head(target, seed=1)
    head.eval()
    s = _sequences(target, 1)[0]
    batch = collate([s])
    with torch.no_grad():
        (p1, *_), (p2, *_), (p3, *_) = head_forward(head, batch, depth=3)
        j = 4  # as drafting does: commit real pairs 0..j, then feed (x_{j+2}, own p_{j+1}) at position j+1, ...
        cache = DynamicCache(config=head.config)
        causal = torch.zeros(1, 1, j + 1, j + 1).masked_fill(~torch.ones(j + 1, j + 1, dtype=torch.bool).tril(),
                                                              torch.finfo(torch.float32).min)
        first = head(batch["in_tokens"][:, : j + 1], batch["in_feats"][:, : j + 1], causal,
                     torch.arange(j + 1)[None], cache)
        second = head(batch["in_tokens"][:, j + 1: j + 2], first[:, j: j + 1], torch.zeros(1, 1, 1, j + 2),
                      torch.tensor([[j + 1]]), cache)
        # ... and (x_{j+3}, own depth-2 output) at position j+2, seeing the real pairs, its parent and itself
        third = head(batch["in_tokens"][:, j + 2: j + 3], second, torch.zeros(1, 1, 1, j + 3),
                     torch.tensor([[j + 2]]), cache)
    torch.testing.assert_close(first[0], p1[0, : j + 1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(second[0, 0], p2[0, j], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(third[0, 0], p3[0, j], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(p3[0, j], p2[0, j + 1], atol=1e-3)  # depth 3 is not depth 2 at the next position


def test_each_unrolled_depth_adds_its_own_loss(target, tmp_path):
    data = tmp_path / "data"
    _write_data(target, data, _sequences(target, 10))

    def one_step(name: str, unroll: int, weight: float) -> torch.Tensor:
        cfg = TrainConfig(epochs=1, batch_tokens=64, save_every=1000, max_minutes=1e-9, heldout_every=5,
                          unroll=unroll, unroll_weight=weight)
        assert train(target, data, tmp_path / name, cfg)["steps"] == 1
        return load_latest_head(target, tmp_path / name)[0].fc.weight

    torch.testing.assert_close(one_step("d3w0", 3, 0.0), one_step("d1", 1, 0.5), atol=0, rtol=0)
    assert not torch.allclose(one_step("d3", 3, 0.5), one_step("d2", 2, 0.5), atol=1e-7)


def test_sampled_responses_record_the_targets_greedy_choice(target):
    class Tok:
        pad_token_id = 0

    target.generation_config.eos_token_id = 255
    prompts = [[5, 9, 11, 200, 3], [17, 4]]
    got = generate_responses(target, Tok(), prompts, max_new_tokens=10, temperature=0.7, seed=3, context=8)
    for p, s in zip(prompts, got):
        assert s.kind == SAMPLED and s.tokens[: s.start].tolist() == p
        ((_, top),) = target_features_argmax(target, [s.tokens.tolist()])
        assert s.argmax[s.start - 1:].tolist() == top[s.start - 1:].tolist()


def test_export_draft_vocab_is_the_most_frequent_target_tokens(target, tmp_path):
    import argparse

    from eagle2.train.cli import _draft_vocab

    seqs = _sequences(target, 20)
    data = tmp_path / "data"
    _write_data(target, data, seqs)
    save_head(trainable_head(target, 0)[0], tmp_path / "head")
    _draft_vocab(argparse.Namespace(data=[str(data)], train_only=None, draft_vocab=24), str(tmp_path / "head"))
    head = load_head(tmp_path / "head", target)
    train_set, _ = load_split([data], TrainConfig().heldout_every)
    labels = torch.cat([s.next_argmax()[max(s.start - 1, 0):] for s in train_set])
    ids, counts = torch.unique(labels[labels >= 0], return_counts=True)
    last = counts.sort(descending=True).values[23]
    assert head.draft_vocab is not None and len(head.draft_vocab) == 24
    assert all(int(counts[ids == t]) >= last for t in head.draft_vocab)  # nothing rarer than the 24th


def test_held_out_prompts_are_not_trained_through_another_directory(target, tmp_path):
    greedy = _sequences(target, 20, seed=1)
    # other responses to the same prompts, as a sampled run over the same prompts would store them elsewhere
    others = [Sequence(tokens=torch.cat([s.tokens[:s.start], (s.tokens[s.start:] + 1) % 256]),
                       features=s.features, start=s.start, kind=SAMPLED) for s in greedy]
    _write_data(target, tmp_path / "a", greedy)
    _write_data(target, tmp_path / "b", others)
    train_set, held = load_split([tmp_path / "a"], 5, train_only=[tmp_path / "b"])
    assert held, "the split must hold some prompts out"
    held_prompts = {tuple(s.tokens[:s.start].tolist()) for s in held}
    trained_prompts = [tuple(s.tokens[:s.start].tolist()) for s in train_set]
    assert not held_prompts & set(trained_prompts)
    assert len(train_set) == 2 * len(greedy) - 2 * len(held)  # only those prompts' sequences were dropped


def test_manifest_finds_the_prompts_behind_held_out_sequences(target, tmp_path, capsys):
    """Shards store sequences sorted by prompt length, not in the file's order; the manifest's rows must still
    name the prompt behind every stored sequence, so `train heldout` lists the prompts `split` held out."""
    import argparse

    from eagle2.train.batches import heldout_rows, split
    from eagle2.train.cli import _read_row_list, cmd_heldout
    from eagle2.train.data import GenConfig, generate_dataset

    class ByteTok:
        chat_template, pad_token_id = None, 0

        def __call__(self, text, **_):
            return {"input_ids": [1 + b % 255 for b in text.encode()]}

    texts = ["x" * n + str(n) for n in (9, 3, 14, 5, 1, 12, 7, 2, 10, 4, 6, 11, 8)]
    rows = [(t, None) for t in texts]
    row_ids = [100 + 3 * i for i in range(len(rows))]  # as `generate --rows` passes them
    cfg = GenConfig(max_new_tokens=3, batch_size=2, shard_prompts=5, sample_every=4)
    manifest = generate_dataset(target, ByteTok(), rows, tmp_path / "d", cfg, source={"prompts": "p.json"},
                                row_ids=row_ids)
    seqs = load_sequences(tmp_path / "d")
    stored = [r for name in sorted(manifest["shards"]) for r in manifest["shards"][name]["rows"]]
    assert sorted(stored) == row_ids and stored != row_ids  # every row once, not in the file's order
    for s, r in zip(seqs, stored):  # each stored sequence's prompt is the row the manifest names
        assert s.tokens[:s.start].tolist() == ByteTok()(texts[row_ids.index(r)])["input_ids"]
    assert {s.kind for s in seqs} == {GREEDY, SAMPLED}
    _, held = split(seqs, 3)
    want = [stored[i] for i, s in enumerate(seqs) if any(s is h for h in held)]
    assert heldout_rows(tmp_path / "d", 3) == want and want
    out = tmp_path / "held.json"
    cmd_heldout(argparse.Namespace(data=[str(tmp_path / "d")], heldout_every=3, out=str(out)))
    assert json.loads(out.read_text()) == {"prompts": "p.json", "heldout_every": 3, "rows": want}
    assert _read_row_list(str(out), 200) == want
    with pytest.raises(SystemExit, match="row numbers in 0..99"):
        _read_row_list(str(out), 100)
    old = tmp_path / "old"  # data written before rows were recorded: a clear error, not a wrong list
    _write_data(target, old, seqs[:4])
    with pytest.raises(SystemExit, match="does not list the rows"):
        cmd_heldout(argparse.Namespace(data=[str(old)], heldout_every=3, out=str(out)))


def test_shipped_heldout_rows_are_the_cards_held_out_prompts():
    """The shipped head's held-out rows: 161 Alpaca rows, none repeated, each inside the greedy ranges the card
    names (256-2499 and 3250-4999), as many as its held-out sequences."""
    data = json.loads(Path("assets/smollm2-135m-eagle/heldout_rows.json").read_text())
    rows = data["rows"]
    assert len(rows) == len(set(rows)) == 161 and data["heldout_every"] == 25
    assert all(256 <= r < 2500 or 3250 <= r < 5000 for r in rows)
    assert "161 held-out answers" in Path("assets/smollm2-135m-eagle/README.md").read_text()


def test_generation_dtype_is_the_devices_unless_bf16_is_asked_for_and_native():
    from eagle2.cpu.onednn import native_bf16
    from eagle2.train.cli import _generation_dtype

    cpu = torch.device("cpu")
    assert _generation_dtype("auto", cpu, torch.float32) is torch.float32
    assert _generation_dtype("float32", cpu, torch.bfloat16) is torch.float32
    if native_bf16():
        assert _generation_dtype("bfloat16", cpu, torch.float32) is torch.bfloat16
    else:
        with pytest.raises(SystemExit, match="emulated"):
            _generation_dtype("bfloat16", cpu, torch.float32)


def test_a_bf16_writer_stores_its_own_greedy_answers_in_the_usual_format(target, tmp_path):
    class Tok:
        pad_token_id = 0

    half = copy.deepcopy(target).to(torch.bfloat16)
    prompts = [[5, 9, 11, 200, 3], [17, 4, 8]]
    got = generate_responses(half, Tok(), prompts, max_new_tokens=6, context=4)
    write_shard(tmp_path / "s.safetensors", got)
    back = read_shard(tmp_path / "s.safetensors")
    for p, s, r in zip(prompts, got, back):
        ids = torch.tensor([p])
        ref = half.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                            pad_token_id=0, eos_token_id=-1)[0, len(p):].tolist()
        assert s.argmax[s.start - 1:].tolist() == ref  # the bf16 target's own greedy choices
        assert s.features.dtype == torch.float32 and r.features.dtype == torch.float16
        assert r.tokens.tolist() == s.tokens.tolist() and torch.isfinite(r.features.float()).all()
