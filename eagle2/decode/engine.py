"""The decode loop: prefill, then per step draft -> verify -> accept -> commit, yielding a StepRecord.

One loop serves EAGLE-2 (dynamic tree), EAGLE-1 (static tree) and plain decoding (an empty tree); the trees
grow in draft.py. The target is a stock transformers causal LM driven with a 4D additive mask, explicit
position ids and its own DynamicCache (with layers that have room to grow, eagle2/decode/cache.py); after each
verify only the prefix and the accepted path stay in that cache. The draft head's cache likewise keeps
committed positions only. The head is any kind with the `heads.Head` interface: it says which target features
it reads and which rows score its drafts. Faster kernels, where the machine has them, come in through the
constructor (`draft_linear`, `greedy`); the loop is the same without them.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch
from transformers import DynamicCache

from .cache import keep_positions, new_cache
from ..config import DecodeConfig
from ..heads import Head
from ..policies import CHAIN, DYNAMIC, PLAIN, STATIC
from .draft import LOG_FLOOR, DraftTree
from .lookup import continuation
from .records import KEPT, PRUNED, ROOT, UNEXPANDED, Node, StepRecord
from .tokens import TokenText, encode_prompt  # noqa: F401  (encode_prompt: part of the engine's API)
from .tree import additive_mask, tree_inputs
from .verify import Decision, accept_greedy, accept_sampling, sample_token


def truncate(cache: DynamicCache, length: int) -> None:
    """Drop everything after the first `length` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass
class DraftRows:
    """The lm_head rows the draft scores: their vocabulary ids (None = all in order) and the layer scoring them."""

    ids: torch.Tensor | None
    col: dict[int, int]
    logits: Callable[[torch.Tensor], torch.Tensor]
    level: Callable | None = None  # the head and these rows in one call per level (eagle2/cpu/level.py), or None


@dataclass
class _State:
    target_cache: DynamicCache
    head_cache: DynamicCache
    head_len: int               # committed pairs in the head cache
    pend_feats: torch.Tensor    # (1, T, H) target features not yet fed to the head
    pend_tokens: torch.Tensor   # (1, T) the token that followed each of those features
    root: int                   # last committed token, not yet in the target cache
    history: list[int]          # prompt and every committed token, root last (for prompt lookup)
    rows: DraftRows             # the lm_head rows this run's draft scores
    produced: int = 0           # tokens committed so far (the prefill's first included)


class _Drafter:
    """The draft head over one step (draft.Drafter): its cache holds committed pairs plus this step's drafts."""

    def __init__(self, decoder: "Decoder", st: _State):
        self.decoder, self.st = decoder, st

    def _run(self, tokens: list[int], feats: torch.Tensor, visible: torch.Tensor | None, positions: list[int],
             k: int, last: bool = False) -> tuple[torch.Tensor, torch.Tensor, list, list]:
        """The head over `tokens` (visible: which of this step's drafted keys each sees; None: causal rows) ->
        (log-probs of the scored rows (every row, or the last: `last`), features, each scored row's top-k
        log-probs and vocabulary ids)."""
        st, dev, level = self.st, self.decoder.device, self.st.rows.level
        fused = level(tokens, feats, visible, st.head_len, positions, st.head_cache, last, k) if level else None
        if fused is not None:
            logp, out, lp, idx = fused
        else:
            q = len(tokens)
            visible = torch.ones(q, q, dtype=torch.bool).tril() if visible is None else visible
            mask = additive_mask(visible, st.head_len, self.decoder.head_dtype).to(dev)
            out = self.decoder.head(torch.tensor([tokens], device=dev), feats[None] if feats.dim() == 2 else feats,
                                    mask, torch.tensor([positions], device=dev), st.head_cache)[0]  # (Q, H)
            logp = torch.log_softmax(st.rows.logits(out[-1:] if last else out).float(), dim=-1)
            lp, idx = logp.topk(k, dim=-1)
        ids = st.rows.ids
        return logp, out, lp.tolist(), (idx if ids is None else ids[idx]).tolist()

    def root(self, k: int) -> tuple[torch.Tensor, torch.Tensor, list[float], list[int]]:
        """Feed the head the pairs committed since the last step; the root's draft log-probs, feature and top-k."""
        st = self.st
        t = st.pend_tokens.shape[1]
        logp, out, lp, ids = self._run(st.pend_tokens[0].tolist(), st.pend_feats, None,
                                       list(range(st.head_len, st.head_len + t)), k, last=True)
        st.head_len += t
        return logp[-1], out[-1], lp[-1], ids[-1]

    def level(self, tokens, feats, visible, depth, k):  # the nodes sit one position past their parents
        return self._run(tokens, feats, visible, [self.st.head_len - 1 + depth] * len(tokens), k)

    def logp_of(self, logp_row: torch.Tensor, token: int) -> float:
        rows = self.st.rows
        col = token if rows.ids is None else rows.col.get(token)
        return LOG_FLOOR if col is None or col >= logp_row.shape[-1] else max(float(logp_row[col]), LOG_FLOOR)


class Decoder:
    """Runs one method on one prompt and yields a record per step. Holds no per-run state."""

    def __init__(self, target, head: Head, tokenizer, eos_ids: set[int] | None = None,
                 draft_linear: Callable[[torch.Tensor], Callable] | None = None,
                 greedy: Callable[[torch.Tensor], list[int]] | None = None, stack: Callable | None = None,
                 draft_level: Callable | None = None):
        """`draft_linear(weight)`: the layer that scores the draft's lm_head rows (default: a float matmul in the
        head's dtype); `greedy(h)`: the target's argmax token after each row of features (default: its lm_head);
        `stack(input_ids, attention_mask, position_ids, cache)`: the target body's post-norm features computed
        another way (its layers in one kernel call), or None where it does not apply (default: the body itself);
        `draft_level(head, rows_layer)`: a draft level in one call over those rows (`DraftRows.level`), or None."""
        self.target, self.head, self.tok = target, head, tokenizer
        self.token_text = TokenText(tokenizer)
        self.body = getattr(target, target.base_model_prefix)
        self.lm_head = target.get_output_embeddings()
        self.device, self.dtype = target.device, target.dtype
        eos = eos_ids if eos_ids is not None else target.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, set, tuple)) else [eos]) - {None}
        vocab = head.draft_vocab  # the draft may score a frequent subset (the target verifies all)
        self.draft_ids = None if vocab is None else vocab.to(self.device)
        self.head_dtype = head.dtype
        self._linear = draft_linear or (lambda w: (lambda x, w=w: torch.nn.functional.linear(x.to(w.dtype), w)))
        self.greedy_tokens = greedy or (lambda h: self.lm_head(h).argmax(dim=-1).tolist())
        self.stack = stack
        self.draft_level = draft_level
        self._rows: dict[int, DraftRows] = {}

    def draft_rows(self, n: int = 0) -> DraftRows:
        """The draft over the first `n` tokens of the head's draft vocabulary (0 or more than it has: all of it; a
        head without one drafts over the first `n` of the full vocabulary), built on first use and kept."""
        full = self.lm_head.weight.shape[0]
        size = full if self.draft_ids is None else len(self.draft_ids)
        n = size if n <= 0 or n >= size else n
        if n not in self._rows:
            ids = self.draft_ids[:n] if self.draft_ids is not None else (
                torch.arange(n, device=self.device) if n < full else None)
            col = {} if ids is None else {t: j for j, t in enumerate(ids.tolist())}
            w = self.head.draft_weight(self.lm_head.weight, n).detach().to(self.head_dtype)  # (n, H)
            layer = self._linear(w)
            level = self.draft_level(self.head, layer) if self.draft_level is not None else None
            self._rows[n] = DraftRows(ids=ids, col=col, logits=self.head.scorer(layer), level=level)
        return self._rows[n]

    def forward(self, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the target's body -> its post-norm features (B, T, H) and the head's input features from
        the same pass (`Head.target_features`: those again for EAGLE-1/2, three layers' (B, T, 3H) for EAGLE-3)."""
        if self.stack is not None and self.head.feature_layers is None:
            ids, cache = inputs["input_ids"], inputs.get("cache")
            pos = inputs.get("position_ids")
            if pos is None and cache is not None:
                past = cache.get_seq_length()
                pos = torch.arange(past, past + ids.shape[-1], device=self.device)[None]
            h = self.stack(ids, inputs.get("attention_mask"), pos, cache) if pos is not None else None
            if h is not None:
                return h, self.head.target_features(SimpleNamespace(last_hidden_state=h, hidden_states=None))
        out = self.body(**inputs, output_hidden_states=self.head.feature_layers is not None)
        return out.last_hidden_state, self.head.target_features(out)

    def sync(self) -> float:
        """A timestamp after the device has finished its queued work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    # ---- phases --------------------------------------------------------------------------------
    def prefill(self, prompt_ids: list[int], cfg: DecodeConfig, gen) -> tuple[_State, StepRecord]:
        t0 = self.sync()
        ids = torch.tensor([prompt_ids], device=self.device)
        cache = new_cache(self.target.config)
        h, feats = self.forward(input_ids=ids, cache=cache, use_cache=True)  # (1, P, H), (1, P, H or 3H)
        first = (self.greedy_tokens(h[0, -1:])[0] if cfg.greedy
                 else sample_token(self.lm_head(h[0, -1]), cfg.temperature, cfg.top_p, gen))
        st = _State(target_cache=cache, head_cache=new_cache(self.head.config), head_len=0, pend_feats=feats,
                    pend_tokens=torch.tensor([prompt_ids[1:] + [first]], device=self.device), root=first,
                    history=list(prompt_ids), rows=self.draft_rows(cfg.draft_tokens))
        _, stop = self.produce(st, [first], cfg)
        rec = StepRecord(step=0, method=cfg.method, prefix_len=len(prompt_ids), nodes=(), accepted=(),
                         bonus_token=first, new_tokens=(first,), new_texts=(self.token_text(first),),
                         new_sources=("target",), draft_ms=0.0, verify_ms=(self.sync() - t0) * 1e3, commit_ms=0.0,
                         stop=stop)
        return st, rec

    def draft_tree(self, st: _State, cfg: DecodeConfig, prune: bool = True) -> DraftTree:
        """Grow this step's tree; the drafted pairs leave the head cache again."""
        tree = DraftTree(st.root, _Drafter(self, st))
        if cfg.method == DYNAMIC:
            if cfg.lookup:
                tree.attach_lookup(continuation(st.history, cfg.lookup_tokens))
            tree.grow_dynamic(cfg, prune)
        elif cfg.method == STATIC:
            tree.grow_static(cfg.tree)
        elif cfg.method == CHAIN:
            tree.grow_chain(cfg.depth, cfg.p_min)
        truncate(st.head_cache, st.head_len)
        return tree

    def verify(self, cache: DynamicCache, parents: list[int], tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One target forward over a whole tree on top of `cache` -> post-norm features (N, H) and the head's
        input features (N, H or 3H; see `forward`)."""
        ti = tree_inputs(parents, cache.get_seq_length(), self.dtype, self.device)
        h, feats = self.forward(input_ids=torch.tensor([tokens], device=self.device), attention_mask=ti.mask,
                                position_ids=ti.position_ids, cache=cache, use_cache=True)
        return h[0], feats[0]

    def accept(self, parents: list[int], tokens: list[int], h: torch.Tensor, cfg: DecodeConfig, gen) -> Decision:
        """The path the target keeps and its bonus token (verify.py: greedy, or sibling-wise rejection sampling)."""
        if cfg.greedy:
            return accept_greedy(parents, tokens, self.greedy_tokens(h))
        return accept_sampling(parents, tokens, self.lm_head(h), cfg.temperature, cfg.top_p, gen)

    def commit(self, st: _State, path: list[int], tokens: list[int], bonus: int, feats: torch.Tensor, past: int,
               cfg: DecodeConfig) -> tuple[list[int], str | None]:
        """Keep prefix + root + accepted path in the target cache, queue the new pairs (head features) for the head
        and produce the new tokens -> (those committed, why the run stops after them or None)."""
        rows = torch.tensor([0] + path, device=self.device)
        keep_positions(st.target_cache, past, past + rows)
        st.pend_feats = feats.index_select(0, rows)[None]
        st.pend_tokens = torch.tensor([[tokens[i] for i in path] + [bonus]], device=self.device)
        st.root = bonus
        return self.produce(st, [tokens[i] for i in path] + [bonus], cfg)

    def produce(self, st: _State, new: list[int], cfg: DecodeConfig) -> tuple[list[int], str | None]:
        """Count `new` as produced, cut exactly where plain decoding would stop -> (the tokens kept, "eos" or
        "max_new_tokens" where the cut ends the run, else None)."""
        stop = None
        for j, t in enumerate(new):
            stop = "eos" if t in self.eos else "max_new_tokens" if st.produced + j + 1 >= cfg.max_new_tokens else None
            if stop:
                new = new[:j + 1]
                break
        st.produced += len(new)
        st.history += new
        return new, stop

    def check_prompt(self, prompt_ids: list[int], cfg: DecodeConfig) -> None:
        """Refuse an empty prompt, or one that leaves no room in the model's context for the answer and a tree."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        limit = getattr(self.target.config, "max_position_embeddings", None)
        branch = cfg.lookup_tokens if cfg.lookup else 0  # the lookup branch can add rows on top of total_tokens
        room = cfg.max_new_tokens + max(cfg.total_tokens + branch, len(cfg.tree) + 1)
        if limit and len(prompt_ids) + room > limit:
            raise ValueError(f"the prompt is {len(prompt_ids)} tokens; with max_new_tokens={cfg.max_new_tokens} and "
                             f"the draft tree it needs {len(prompt_ids) + room}, but the model's context is {limit}"
                             f" tokens: shorten the prompt to at most {limit - room} tokens")

    # ---- the loop ------------------------------------------------------------------------------
    @torch.inference_mode()  # entered around each resume of the generator, not across yields
    def run(self, prompt_ids: list[int], cfg: DecodeConfig, should_stop: Callable[[], bool] | None = None,
            prune: bool = True) -> Iterator[StepRecord]:
        """Decode until EOS or max_new_tokens, yielding one record per step (step 0 is the prefill); the last one
        says why it is the last (`StepRecord.stop`). `should_stop()` is asked once per step, before its record
        goes out: when true, that record is the last ("stopped"). `prune=False` drafts every level in full (the
        same trees; the tuner times drafting that way)."""
        self.check_prompt(prompt_ids, cfg)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        st, rec = self.prefill(prompt_ids, cfg, gen)
        while True:
            if rec.stop is None and should_stop is not None and should_stop():
                rec = replace(rec, stop="stopped")
            yield rec
            if rec.stop is not None:
                return
            rec = self.step(st, rec.step + 1, cfg, gen, prune)

    def step(self, st: _State, step: int, cfg: DecodeConfig, gen, prune: bool = True) -> StepRecord:
        """One step: draft a tree, verify it in one target forward, accept a path, commit it."""
        t0 = self.sync()
        tree = self.draft_tree(st, cfg, prune)
        kept, parents, tokens = tree.verified()
        t1 = self.sync()
        past = st.target_cache.get_seq_length()
        h, feats = self.verify(st.target_cache, parents, tokens)
        decision = self.accept(parents, tokens, h, cfg, gen)
        t2 = self.sync()
        new, stop = self.commit(st, decision.accepted, tokens, decision.bonus, feats, past, cfg)
        t3 = self.sync()
        return self._record(step, cfg, past + 1, tree, kept, decision, new, stop, (t1 - t0, t2 - t1, t3 - t2))

    def _record(self, step, cfg, prefix_len, tree: DraftTree, kept, decision, new, stop, times) -> StepRecord:
        """Freeze one step into plain data: every candidate, its status and the target's verdict."""
        pos, text, nodes = {old: j for j, old in enumerate(kept)}, self.token_text, []
        for i, c in enumerate(tree.pool if cfg.method != PLAIN else ()):
            j = pos.get(i)
            status = ROOT if i == 0 else KEPT if j is not None else PRUNED if c.expanded else UNEXPANDED
            tt = decision.target_tokens[j] if (j is not None and decision.target_tokens) else None
            tp = decision.target_probs[j] if (j is not None and decision.target_probs) else None
            draw = decision.draws[j] if (j is not None and decision.draws) else None
            nodes.append(Node(id=i, parent=c.parent, token=c.token, text=text(c.token), depth=c.depth, rank=c.rank,
                              prob=math.exp(c.logp) if i else 1.0, score=c.score, status=status, expanded=c.expanded,
                              verdict=decision.verdicts[j] if j is not None else None, target_token=tt,
                              target_text=text(tt) if tt is not None else None, source=c.source, target_prob=tp,
                              draw=draw))
        sources = (["draft"] * len(decision.accepted) + ["target"])[:len(new)]  # accepted drafts, then the bonus
        return StepRecord(step=step, method=cfg.method, prefix_len=prefix_len, nodes=tuple(nodes),
                          accepted=tuple(kept[j] for j in decision.accepted), bonus_token=decision.bonus,
                          new_tokens=tuple(new), new_texts=tuple(text(t) for t in new), new_sources=tuple(sources),
                          draft_ms=times[0] * 1e3, verify_ms=times[1] * 1e3, commit_ms=times[2] * 1e3, stop=stop,
                          residual_top=tuple((t, text(t), p) for t, p in decision.residual_top),
                          bonus_prob=decision.bonus_prob)
