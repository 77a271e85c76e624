"""The decode loop: prefill, then per step draft_tree -> verify -> accept -> commit, yielding a StepRecord.

One loop serves EAGLE-2 (dynamic tree), EAGLE-1 (static tree) and plain decoding (an empty tree).
The target is a stock transformers causal LM driven with a 4D additive mask, explicit position ids and
its own DynamicCache (with layers that have room to grow, eagle2/cache.py); after each verify only the
prefix and the accepted path stay in that cache.
The draft head's cache likewise keeps committed positions only.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from . import int8, kernels, rowkernel
from .argmax import GreedyTokens
from .cache import keep_positions, new_cache
from .config import DecodeConfig
from .lookup import continuation
from .records import KEPT, PRUNED, ROOT, UNEXPANDED, Node, StepRecord
from .tokens import TokenText
from .rerank import Candidate, cutoff, floors, select_dynamic
from .tree import additive_mask, static_children, tree_inputs
from .verify import accept_greedy, accept_sampling, sample_token


LOG_FLOOR = -69.0  # about log(1e-30): the score of a lookup token the draft gives (almost) no probability


def truncate(cache: DynamicCache, length: int) -> None:
    """Drop everything after the first `length` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass
class _DraftRows:
    """The lm_head rows the draft scores: vocabulary ids (None = all), their column of each id, weight, packing."""
    ids: torch.Tensor | None
    col: dict[int, int]
    w: torch.Tensor
    packed: torch.Tensor | None
    q8: int8.Rows | None = None  # int8 copy for an int8 draft head (eagle2/int8.py)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.q8 is not None and x.shape[0] <= rowkernel.MAX_ROWS:
            return self.q8.linear(x)
        return (torch.nn.functional.linear(x, self.w) if self.packed is None
                else kernels.packed_linear(x, self.packed, None))

    def topk(self, logp: torch.Tensor, k: int) -> tuple[list, list]:
        """Top-k draft tokens (vocabulary ids) and log-probs, as Python lists: one host transfer."""
        lp, idx = logp.topk(k, dim=-1)
        if self.ids is not None:
            idx = self.ids[idx]
        return lp.tolist(), idx.tolist()

    def logp_of(self, logp_row: torch.Tensor, token: int) -> float:
        """The draft's log-probability of a vocabulary token (floored; outside a reduced vocabulary it is 0)."""
        col = self.col.get(token) if self.ids is not None else token
        return LOG_FLOOR if col is None else max(float(logp_row[col]), LOG_FLOOR)


@dataclass
class _State:
    target_cache: DynamicCache
    head_cache: DynamicCache
    head_len: int               # committed pairs in the head cache
    pend_feats: torch.Tensor    # (1, T, H) target features not yet fed to the head
    pend_tokens: torch.Tensor   # (1, T) the token that followed each of those features
    root: int                   # last committed token, not yet in the target cache
    history: list[int]          # prompt and every committed token, root last (for prompt lookup)
    produced: int = 0
    draft: _DraftRows | None = None  # the lm_head rows this run's draft scores



def encode_prompt(tokenizer, text: str, raw: bool = False) -> list[int]:
    """Token ids of a user prompt, through the model's chat template unless `raw`."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer(text)["input_ids"]
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])


class Decoder:
    """Runs one method on one prompt and yields a record per step."""

    def __init__(self, target, head, tokenizer, eos_ids: set[int] | None = None):
        self.target, self.head, self.tok = target, head, tokenizer
        self.token_text = TokenText(tokenizer)
        self.body = getattr(target, target.base_model_prefix)
        self.lm_head = target.get_output_embeddings()
        self.device, self.dtype = target.device, target.dtype
        eos = eos_ids if eos_ids is not None else target.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, set, tuple)) else [eos]) - {None}
        # The draft may score only a frequent subset of the vocabulary (lossless: the target verifies
        # with its full lm_head). Rows of the lm_head are gathered once here.
        vocab = getattr(head, "draft_vocab", None)
        self.draft_ids = None if vocab is None else vocab.to(self.device)
        # The head may run in a cheaper dtype than the target, or from int8 weight rows (eagle2/int8.py;
        # `loading.load(draft_dtype=...)`): drafting only proposes, the target verifies in its own dtype, so
        # the output is unchanged.
        self.head_dtype = getattr(head, "dtype", self.dtype)
        self._rows: dict[int, _DraftRows] = {}  # by how many leading tokens of the vocabulary (0: all)
        # Greedy tokens through a shortlist proved exact from int8 (our row kernel) or bf16 copies of the
        # lm_head (eagle2/argmax.py) where that applies; None: the full float32 lm_head's argmax.
        self.greedy_head = GreedyTokens(self.lm_head) if GreedyTokens.applies(self.lm_head) else None
        # EAGLE-2 skips expanding nodes that can no longer reach the kept tree (`rerank.cutoff`): the kept
        # tree is the same, the drafting cheaper. Off only to check that claim.
        self.prune = True

    # ---- helpers -------------------------------------------------------------------------------
    def draft_rows(self, n: int = 0) -> _DraftRows:
        """The rows for a draft over the first `n` tokens of the head's draft vocabulary (0 or more than it has:
        all of it; a head without one drafts over the first `n` of the full vocabulary), gathered, cast and (with
        oneDNN kernels, eagle2/kernels.py) packed on first use and kept."""
        full = self.lm_head.weight.shape[0]
        size = full if self.draft_ids is None else len(self.draft_ids)
        n = size if n <= 0 or n >= size else n
        if n not in self._rows:
            if self.draft_ids is not None:
                ids = self.draft_ids[:n]
            else:
                ids = torch.arange(n, device=self.device) if n < full else None
            w = self.lm_head.weight if ids is None else self.lm_head.weight.index_select(0, ids)
            w = w.to(self.head_dtype)  # (M, H)
            col = {} if ids is None else {t: j for j, t in enumerate(ids.tolist())}
            packed = kernels.pack(w) if kernels.patched(self.lm_head) else None
            q8 = int8.quantize(w) if int8.is_int8(self.head) and int8.fits(w) else None
            self._rows[n] = _DraftRows(ids=ids, col=col, w=w, packed=packed, q8=q8)
        return self._rows[n]

    def _text(self, token: int) -> str:
        return self.token_text(token)

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    # ---- phases --------------------------------------------------------------------------------
    def prefill(self, prompt_ids: list[int], cfg: DecodeConfig, gen) -> tuple[_State, StepRecord]:
        t0 = self._sync()
        ids = torch.tensor([prompt_ids], device=self.device)
        cache = new_cache(self.target.config)
        h = self.body(input_ids=ids, cache=cache, use_cache=True).last_hidden_state  # (1, P, H)
        first = (self.greedy_tokens(h[0, -1:])[0] if cfg.greedy
                 else sample_token(self.lm_head(h[0, -1]), cfg.temperature, cfg.top_p, gen))
        state = _State(target_cache=cache, head_cache=new_cache(self.head.config), head_len=0,
                       pend_feats=h, pend_tokens=torch.tensor([prompt_ids[1:] + [first]], device=self.device),
                       root=first, history=list(prompt_ids) + [first], produced=1)
        ms = (self._sync() - t0) * 1e3
        rec = StepRecord(step=0, method=cfg.method, prefix_len=len(prompt_ids), nodes=(), accepted=(),
                         bonus_token=first, new_tokens=(first,), new_texts=(self._text(first),),
                         new_sources=("target",), draft_ms=0.0, verify_ms=ms, commit_ms=0.0)
        return state, rec

    def _head_step(self, st: _State, tokens: list[int], feats: torch.Tensor, visible: torch.Tensor,
                   positions: list[int], last: bool = False) -> torch.Tensor:
        """Run the head on new (token, feature) pairs appended to its cache -> draft log-probs (Q, V), feats.
        `last`: only the last row's log-probs are needed (Q = 1 then; features still of every row)."""
        mask = additive_mask(visible, st.head_len, self.head_dtype).to(self.device)
        out = self.head(torch.tensor([tokens], device=self.device), feats, mask,
                        torch.tensor([positions], device=self.device), st.head_cache)[0]  # (Q, H)
        scored, rows = (out[-1:] if last else out), st.draft
        return torch.log_softmax(rows.logits(scored).float(), dim=-1), out

    def _catch_up(self, st: _State) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the head the pairs committed since last step; returns the root's draft log-probs and feature."""
        t = st.pend_tokens.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        logp, out = self._head_step(st, st.pend_tokens[0].tolist(), st.pend_feats, causal,
                                    list(range(st.head_len, st.head_len + t)), last=True)
        st.head_len += t
        return logp[-1], out[-1]

    def _add_children(self, st: _State, pool: list[Candidate], feats: dict[int, torch.Tensor], n: int,
                      logp_row: torch.Tensor,
                      top_lp: list[float], top_tok: list[int], feat: torch.Tensor, extra: int | None) -> list[int]:
        """Append node n's top-k children, plus `extra` (a prompt-lookup token) scored by the same draft row."""
        pool[n].expanded = True
        depth, base, new = pool[n].depth + 1, pool[n].score, []
        for r, (lp, tok) in enumerate(zip(top_lp, top_tok)):
            pool.append(Candidate(parent=n, token=tok, depth=depth, rank=r, logp=lp, score=base + lp,
                                  source="both" if tok == extra else "draft"))
            new.append(len(pool) - 1)
        if extra is not None and extra not in top_tok:
            lp = st.draft.logp_of(logp_row, extra)
            pool.append(Candidate(parent=n, token=extra, depth=depth, rank=len(top_tok), logp=lp, score=base + lp,
                                  source="lookup"))
            new.append(len(pool) - 1)
        for i in new:
            feats[i] = feat
        return new

    def _expand(self, st: _State, pool: list[Candidate], feats: dict[int, torch.Tensor], drafted: list[int],
                nodes: list[int], k: int, extra: dict[int, int] | None = None) -> list[int]:
        """Draft the top-k children of `nodes` (all one depth) in one head forward; returns new pool indices.
        `extra` maps a node to one more child token to add (prompt lookup), scored by the same forward."""
        keys = drafted + nodes
        where = {n: j for j, n in enumerate(keys)}
        visible = torch.zeros(len(nodes), len(keys), dtype=torch.bool)
        for q, n in enumerate(nodes):
            a = n
            while a > 0:  # the node and its drafted ancestors (the root's pair is already committed)
                visible[q, where[a]] = True
                a = pool[a].parent
        depth = pool[nodes[0]].depth
        logp, out = self._head_step(st, [pool[n].token for n in nodes], torch.stack([feats[n] for n in nodes])[None],
                                    visible, [st.head_len - 1 + depth] * len(nodes))
        drafted.extend(nodes)
        top_lp, top_tok = st.draft.topk(logp, k)  # (Q, k) each
        new = []
        for q, n in enumerate(nodes):
            new += self._add_children(st, pool, feats, n, logp[q], top_lp[q], top_tok[q], out[q],
                                      (extra or {}).get(n))
        return new

    def _root_children(self, st, pool, feats, k, extra: int | None = None) -> list[int]:
        logp, feat = self._catch_up(st)
        lp, tok = st.draft.topk(logp, k)
        return self._add_children(st, pool, feats, 0, logp, lp, tok, feat, extra)

    def _grow_dynamic(self, st: _State, pool: list[Candidate], feats: dict[int, torch.Tensor], drafted: list[int],
                      cfg: DecodeConfig) -> list[int]:
        """EAGLE-2: expand the top_k most confident nodes per level, then keep the best total_tokens - 1 overall.
        A node scoring no better than the pool's (total_tokens - 1)-th best is not expanded, since none of its
        descendants could be kept; drafting stops early when no frontier node can still make the cut.
        With `cfg.min_prob` / `cfg.expand_prob` the tree is sized per step: only nodes scoring at least the
        floors are kept / expanded (`floors`), so a confident step verifies more and drafts deeper than an
        unsure one.
        With `cfg.lookup`, a prompt-lookup continuation (up to `cfg.lookup_tokens`) rides along as one more
        branch, verified on top of that tree: its first `depth` tokens are scored by the draft like any other
        node and expanded with their level, the rest hang below them unscored (see `_with_chain`)."""
        chain = continuation(st.history, cfg.lookup_tokens) if cfg.lookup else []
        floor, grow = floors(cfg.min_prob, cfg.expand_prob)
        frontier = self._root_children(st, pool, feats, cfg.top_k, chain[0] if chain else None)
        on_chain = [i for i in frontier if pool[i].source != "draft"]  # one node per level, or none
        for d in range(1, cfg.depth):
            nodes = sorted(frontier, key=lambda i: -pool[i].score)[:cfg.top_k]  # best by cumulative score
            nodes = [i for i in nodes if pool[i].score >= grow]  # a sized tree expands only confident nodes
            if self.prune:
                cut = cutoff(pool, cfg.total_tokens - 1)
                nodes = [i for i in nodes if pool[i].score > cut]
            extra = {}
            if len(on_chain) == d and d < len(chain):
                nodes = nodes if on_chain[-1] in nodes else nodes + [on_chain[-1]]
                extra = {on_chain[-1]: chain[d]}
            if not nodes:
                break
            frontier = self._expand(st, pool, feats, drafted, nodes, cfg.top_k, extra)
            on_chain += [i for i in frontier if pool[i].source != "draft"]
        kept = select_dynamic(pool, cfg.total_tokens - 1, floor)
        return self._with_chain(pool, kept, on_chain, chain) if chain else kept

    @staticmethod
    def _with_chain(pool: list[Candidate], kept: list[int], on_chain: list[int], chain: list[int]) -> list[int]:
        """The kept tree plus the whole lookup chain: its drafted nodes (where the rerank left them out) and
        the chain's tokens past the drafted levels, appended below them unscored (LOG_FLOOR each: the draft
        never saw them). Verifying the chain costs a row per node the tree lacks; on a CPU a row is cheap
        next to the target's fixed cost, and where the text repeats itself the chain is accepted whole."""
        keep = set(kept) | set(on_chain)
        last = on_chain[-1]
        for tok in chain[len(on_chain):]:
            pool.append(Candidate(parent=last, token=tok, depth=pool[last].depth + 1, rank=0, logp=LOG_FLOOR,
                                  score=pool[last].score + LOG_FLOOR, source="lookup"))
            last = len(pool) - 1
            keep.add(last)
        return sorted(keep, key=lambda i: (pool[i].depth, i))  # parents before children, siblings in rank order

    def draft_tree(self, st: _State, cfg: DecodeConfig) -> tuple[list[Candidate], list[int]]:
        """Grow the draft tree; returns the whole candidate pool and the kept indices (root first)."""
        pool = [Candidate(parent=-1, token=st.root, depth=0, rank=0, logp=0.0, score=0.0)]
        feats: dict[int, torch.Tensor] = {}
        drafted: list[int] = []
        if cfg.method == "vanilla":
            return pool, [0]
        if cfg.method == "eagle2":
            kept = self._grow_dynamic(st, pool, feats, drafted, cfg)
        else:
            spec = static_children(cfg.tree)
            k = cfg.static_top_k
            path_of = {0: ()}
            level = [i for i in self._root_children(st, pool, feats, k) if pool[i].rank in spec[()]]
            kept = [0]
            while level:
                kept += level
                for i in level:
                    path_of[i] = path_of[pool[i].parent] + (pool[i].rank,)
                grow = [i for i in level if path_of[i] in spec]
                if not grow:
                    break
                kids = self._expand(st, pool, feats, drafted, grow, k)
                level = [c for c in kids if pool[c].rank in spec[path_of[pool[c].parent]]]
            pool = [pool[i] for i in kept]  # a static tree drafts only its own nodes
            remap = {old: new for new, old in enumerate(kept)}
            for c in pool[1:]:
                c.parent = remap[c.parent]
            kept = list(range(len(pool)))
        truncate(st.head_cache, st.head_len)  # drafted pairs never stay in the head cache
        return pool, kept

    def verify(self, st: _State, parents: list[int], tokens: list[int]) -> torch.Tensor:
        """One target forward over the whole kept tree -> post-norm features (N, H)."""
        past = st.target_cache.get_seq_length()
        ti = tree_inputs(parents, past, self.dtype, self.device)
        ids = torch.tensor([tokens], device=self.device)
        return self.body(input_ids=ids, attention_mask=ti.mask, position_ids=ti.position_ids,
                         cache=st.target_cache, use_cache=True).last_hidden_state[0]

    def greedy_tokens(self, h: torch.Tensor) -> list[int]:
        """The target's argmax token after each row of features (N, H)."""
        if self.greedy_head is not None:
            return self.greedy_head(h)
        return self.lm_head(h).argmax(dim=-1).tolist()

    def commit(self, st: _State, path: list[int], tokens: list[int], bonus: int, h: torch.Tensor, past: int) -> None:
        """Keep prefix + root + accepted path in the target cache; queue the new pairs for the head."""
        rows = torch.tensor([0] + path, device=self.device)
        keep_positions(st.target_cache, past, past + rows)
        st.pend_feats = h.index_select(0, rows)[None]
        st.pend_tokens = torch.tensor([[tokens[i] for i in path] + [bonus]], device=self.device)
        st.root = bonus

    def check_prompt(self, prompt_ids: list[int], cfg: DecodeConfig) -> None:
        """Refuse an empty prompt, or one that leaves no room in the model's context for the answer and a tree."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        limit = getattr(self.target.config, "max_position_embeddings", None)
        branch = cfg.lookup_tokens if cfg.lookup else 0  # the lookup branch is verified on top of total_tokens
        room = cfg.max_new_tokens + max(cfg.total_tokens + branch, len(cfg.tree) + 1)
        if limit and len(prompt_ids) + room > limit:
            raise ValueError(f"the prompt is {len(prompt_ids)} tokens; with max_new_tokens={cfg.max_new_tokens} and "
                             f"the draft tree it needs {len(prompt_ids) + room}, but the model's context is {limit}"
                             f" tokens: shorten the prompt to at most {limit - room} tokens")

    # ---- the loop ------------------------------------------------------------------------------
    @torch.inference_mode()  # entered around each resume of the generator, not across yields
    def run(self, prompt_ids: list[int], cfg: DecodeConfig,
            should_stop: Callable[[], bool] | None = None) -> Iterator[StepRecord]:
        """Decode until EOS or max_new_tokens, yielding one record per step (step 0 is the prefill)."""
        self.check_prompt(prompt_ids, cfg)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        st, rec = self.prefill(prompt_ids, cfg, gen)
        st.draft = self.draft_rows(cfg.draft_tokens)
        yield rec
        step = 0
        done = rec.bonus_token in self.eos or st.produced >= cfg.max_new_tokens
        while not done and not (should_stop and should_stop()):
            step += 1
            t0 = self._sync()
            pool, kept = self.draft_tree(st, cfg)
            t1 = self._sync()
            past = st.target_cache.get_seq_length()
            index = {old: new for new, old in enumerate(kept)}
            parents = [-1] + [index[pool[i].parent] for i in kept[1:]]
            tokens = [pool[i].token for i in kept]
            h = self.verify(st, parents, tokens)
            if cfg.greedy:
                dec = accept_greedy(parents, tokens, self.greedy_tokens(h))
            else:
                dec = accept_sampling(parents, tokens, self.lm_head(h), cfg.temperature, cfg.top_p, gen)
            t2 = self._sync()
            self.commit(st, dec.accepted, tokens, dec.bonus, h, past)
            new = [tokens[i] for i in dec.accepted] + [dec.bonus]
            sources = ["draft"] * len(dec.accepted) + ["target"]
            for j, t in enumerate(new):  # cut exactly where plain decoding would stop
                if t in self.eos or st.produced + j + 1 >= cfg.max_new_tokens:
                    new, sources, done = new[: j + 1], sources[: j + 1], True
                    break
            st.produced += len(new)
            st.history += new
            t3 = self._sync()
            yield self._record(step, cfg, past + 1, pool, kept, dec, new, sources, (t1 - t0, t2 - t1, t3 - t2))

    def _record(self, step, cfg, prefix_len, pool, kept, dec, new, sources, times) -> StepRecord:
        """Freeze one step into plain data: every candidate, its status and the target's verdict."""
        pos = {old: new_i for new_i, old in enumerate(kept)}
        nodes = []
        if cfg.method != "vanilla":
            for i, c in enumerate(pool):
                j = pos.get(i)
                status = ROOT if i == 0 else KEPT if j is not None else PRUNED if c.expanded else UNEXPANDED
                tt = dec.target_tokens[j] if (j is not None and dec.target_tokens) else None
                nodes.append(Node(id=i, parent=c.parent, token=c.token, text=self._text(c.token), depth=c.depth,
                                  rank=c.rank, prob=math.exp(c.logp) if i else 1.0,
                                  score=c.score, status=status, expanded=c.expanded,
                                  verdict=dec.verdicts[j] if j is not None else None, target_token=tt,
                                  target_text=self._text(tt) if tt is not None else None, source=c.source))
        return StepRecord(step=step, method=cfg.method, prefix_len=prefix_len, nodes=tuple(nodes),
                          accepted=tuple(kept[j] for j in dec.accepted), bonus_token=dec.bonus,
                          new_tokens=tuple(new), new_texts=tuple(self._text(t) for t in new),
                          new_sources=tuple(sources), draft_ms=times[0] * 1e3, verify_ms=times[1] * 1e3,
                          commit_ms=times[2] * 1e3)
