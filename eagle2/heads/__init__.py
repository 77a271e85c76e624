"""The draft heads, one module per layout they load: `eagle` (the EAGLE-1/2 head: fc over [token embedding;
target feature] and one decoder layer) and `eagle3` (the EAGLE-3 head: the target's hidden states from three
layers, fused, with its own draft vocabulary). `eagle.load_head` reads either layout from disk;
`eagle.head_kind` says which one a head is."""
