"""The decoder's core: the decode loop (`engine.Decoder`), how a draft tree grows (`draft`, `rerank`, `lookup`),
trees as data (`tree`), acceptance (`verify`), the target's cache (`cache`), the per-step records that are the
engine's output contract (`records`), the methods by name (`methods`) and prompt encoding (`tokens`). Everything
else in eagle2 (the API, the tools, the page) is built on this; the modules are imported by their own names."""
