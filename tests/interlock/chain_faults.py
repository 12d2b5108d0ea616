"""Faulty second-stage losses for the pipeline's supervision tests
(tests/interlock/test_pipeline_supervision.py); copied beside `hand.py` with the program.

Each is `hand.loss2` plus a fault, done only where the stage's parameters are real (in
the pipeline worker, not in the compile's trace on the meta device).
"""

from __future__ import annotations

import sys

from hand import loss2

_calls = 0


def _real(stage) -> bool:
    return not next(stage.parameters()).is_meta


def loss2_chatty(stage1, stage2, batch, nbytes: int = 2048):
    """loss2, writing ``nbytes`` to stderr at every step: far more than a pipe holds."""
    if _real(stage2):
        sys.stderr.write("chatty stage 2 " + "." * (nbytes - 17) + "\n")
        sys.stderr.flush()
    return loss2(stage1, stage2, batch)


def loss2_raising(stage1, stage2, batch, after: int = 12):
    """loss2, raising ValueError from the step after ``after`` on."""
    global _calls
    if _real(stage2):
        _calls += 1
        if _calls > after:
            raise ValueError("labels out of range (stage 2)")
    return loss2(stage1, stage2, batch)
