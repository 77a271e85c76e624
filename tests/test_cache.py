"""RoomyLayer against the library's DynamicLayer: the same keys and values after every operation the engine uses."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers.cache_utils import DynamicLayer

from eagle2.decode import cache as C


def states(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 3, n, 8, generator=g), torch.randn(1, 3, n, 5, generator=g)  # values narrower on purpose


def same(a, b) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def keep_reference(layer: DynamicLayer, start: int, rows: torch.Tensor) -> None:
    """What the engine did before RoomyLayer: copy the kept positions out of the whole cache."""
    keep = torch.cat([torch.arange(start), rows])
    layer.keys, layer.values = layer.keys.index_select(-2, keep), layer.values.index_select(-2, keep)


def test_roomy_layer_matches_dynamic_layer_through_a_decode_like_sequence():
    ref, roomy = DynamicLayer(), C.RoomyLayer()
    seed = 0
    for n in (300, 1, 26, 7):  # prefill, then verify-like appends that grow past the first buffer
        for _ in range(20):
            seed += 1
            k, v = states(n, seed)
            out_ref, out_roomy = ref.update(k, v), roomy.update(k, v)
            assert all(torch.equal(a, b) for a, b in zip(out_ref, out_roomy))  # what attention sees
            past = ref.get_seq_length() - n
            if n > 1:  # keep prefix + an accepted path, in place: scattered, or already in place (a chain)
                path = sorted({0, n // 2, n - 1}) if seed % 2 else range(1 + seed % 3)
                rows = past + torch.tensor(list(path))
                keep_reference(ref, past, rows)
                C.keep_positions(SimpleNamespace(layers=[roomy]), past, rows)
            same(ref, roomy)
            ref.crop(-1), roomy.crop(-1)  # the engine's truncate
            same(ref, roomy)
    assert roomy._owns_keys()  # still writing in place, not falling back to copies


def test_roomy_layer_appends_into_its_room_without_copying():
    roomy = C.RoomyLayer()
    roomy.update(*states(300, 1))  # a prefill
    buffer = roomy._k.data_ptr()
    for i in range(100):  # decode steps: append, keep all but the last, as plain decoding does
        roomy.update(*states(2, 2 + i))
        roomy.keep(300 + i, torch.tensor([300 + i]))
        assert roomy._k.data_ptr() == buffer and roomy.get_seq_length() == 301 + i


def test_roomy_layer_survives_its_tensors_being_replaced():
    """Code that assigns `keys`/`values` (as transformers' own helpers do) must not be lost."""
    ref, roomy = DynamicLayer(), C.RoomyLayer()
    for layer in (ref, roomy):
        layer.update(*states(10, 1))
        layer.keys, layer.values = layer.keys[..., ::2, :].clone(), layer.values[..., ::2, :].clone()
    same(ref, roomy)
    rows = torch.tensor([3, 4])
    keep_reference(ref, 2, rows)
    roomy.keep(2, rows)
    same(ref, roomy)
    for layer in (ref, roomy):
        layer.update(*states(4, 2))
    same(ref, roomy)
    assert roomy._owns_keys()


def test_new_cache_uses_roomy_layers_for_full_attention_only(tiny):
    target = tiny[0]
    cache = C.new_cache(target.config)
    assert cache.layers and all(isinstance(layer, C.RoomyLayer) for layer in cache.layers)
