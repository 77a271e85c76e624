"""The library's DynamicCache, with layers that keep spare room instead of concatenating.

transformers' `DynamicLayer.update` appends with `torch.cat`, which copies the layer's whole cache at every
forward: on a CPU that is a few per cent of a decode step at a few hundred tokens, growing with the text.
`RoomyLayer` is a `DynamicLayer` that writes new keys and values into room left at the end of its buffer and
exposes the filled part as a view, so `keys`/`values`, `crop` and `get_seq_length` behave as before;
`keep_positions` compacts the accepted rows of a verified tree in place. The model code is untouched.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 256  # positions added at each reallocation (at least; the buffer at least doubles)


class RoomyLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of buffers with room to grow."""

    def __init__(self) -> None:
        super().__init__()
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def _owns_keys(self) -> bool:
        """Whether `keys`/`values` are still the front of our buffers (anyone may have replaced them)."""
        return (self._k is not None and self.keys is not None and self.keys.dim() == 4
                and self.keys.data_ptr() == self._k.data_ptr() and self.keys.stride() == self._k.stride()
                and self.values.data_ptr() == self._v.data_ptr() and self.values.stride() == self._v.stride())

    def _reserve(self, new_k: torch.Tensor, new_v: torch.Tensor, n: int, needed: int) -> None:
        """Make room for `needed` positions, keeping the first `n`; buffers are shaped like the new states."""
        if self._owns_keys() and needed <= self._k.shape[-2]:
            return
        size = max(needed + MIN_ROOM, 2 * needed)
        k, v = (t.new_empty(*t.shape[:2], size, t.shape[-1]) for t in (new_k, new_v))
        if n:
            k[..., :n, :].copy_(self.keys[..., :n, :])
            v[..., :n, :].copy_(self.values[..., :n, :])
        self._k, self._v = k, v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, m = self.get_seq_length(), key_states.shape[-2]
        self._reserve(key_states, value_states, n, n + m)
        self._k[..., n:n + m, :].copy_(key_states)
        self._v[..., n:n + m, :].copy_(value_states)
        self.keys, self.values = self._k[..., :n + m, :], self._v[..., :n + m, :]
        return self.keys, self.values

    def room(self, m: int) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """For a kernel that writes keys and values in place (eagle2/cpu/layer.py): the buffers, with room for `m`
        more positions, and how many are filled; then `filled`. None before the first update or when someone
        replaced `keys`/`values`."""
        if not self.is_initialized or not self._owns_keys():
            return None
        n = self.keys.shape[-2]
        if n + m > self._k.shape[-2]:
            self._reserve(self._k, self._v, n, n + m)
        return self._k, self._v, n

    def filled(self, n: int) -> None:
        """The first `n` positions of the buffers now hold keys and values (after `room`)."""
        self.keys, self.values = self._k[..., :n, :], self._v[..., :n, :]

    def keep(self, start: int, rows: torch.Tensor, in_place: bool = False) -> None:
        """Keep the first `start` positions followed by positions `rows` (>= start, increasing), in place.
        `in_place`: rows are start, start + 1, ... already, so nothing moves (a chain, or no draft accepted)."""
        if not self._owns_keys():
            select_positions(self, start, rows)
            return
        m = rows.numel()
        if not in_place:
            self._k[..., start:start + m, :] = self._k.index_select(-2, rows)  # gathered first: overlap is safe
            self._v[..., start:start + m, :] = self._v.index_select(-2, rows)
        self.keys, self.values = self._k[..., :start + m, :], self._v[..., :start + m, :]


def select_positions(layer: DynamicLayer, start: int, rows: torch.Tensor) -> None:
    """Keep the first `start` positions and then `rows`, by copying (any layer)."""
    keep = torch.cat([torch.arange(start, device=rows.device), rows])
    layer.keys, layer.values = layer.keys.index_select(-2, keep), layer.values.index_select(-2, keep)


def new_cache(config) -> DynamicCache:
    """A DynamicCache for `config` whose plain (full-attention) layers are RoomyLayers."""
    cache = DynamicCache(config=config)
    cache.layers = [RoomyLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def keep_positions(cache: DynamicCache, start: int, rows: torch.Tensor) -> None:
    """Keep the first `start` positions of every layer followed by positions `rows` (increasing, >= start)."""
    in_place = int(rows[0]) == start and int(rows[-1]) == start + rows.numel() - 1  # nothing to move
    for layer in cache.layers:
        if isinstance(layer, RoomyLayer):
            layer.keep(start, rows, in_place)
        else:
            select_positions(layer, start, rows)
