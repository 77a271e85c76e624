"""Draft-head training, a trainer per head kind: self-distillation data (data, batches), the EAGLE-1/2 head's
training loop (eagle), the EAGLE-3 head's training (eagle3) and its end-to-end run (eagle3_pipeline), and the
command line (cli)."""
