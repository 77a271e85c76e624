"""Draft-head training: self-distillation data (data), the training loop (loop) and the command line (cli)."""
