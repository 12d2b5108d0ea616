"""A run driven: the training loop around ``Program.outer_step`` (logging, evaluation, model
selection, checkpoints, resume), the metrics and records it writes, and the declaration a
train.py hands it. It may import every layer below it, never ``processes``.
"""
