"""Tools built on the decoder's public API (`eagle2.api`, `eagle2.decode`): the bench and the tree-size sweep,
the end-to-end ablation of the CPU kernels, `diagnose` with its replayed workload and serving engines'
settings, the per-machine tree-size tuner and its profile, replay of smaller trees from records, prompt files,
and the options the command line shares. `python -m eagle2 …` runs them; nothing in eagle2/decode imports them."""
