"""programs/interlock.mlo (three stages, ``chain [...] { interlock = 2 }``) and Betty.

Interlocking backpropagation sends stage k's main parameters the gradient of a later head's
loss (plain backpropagation through at most n stages, no best response) and each head the
gradient of its own loss on detached features. A Betty ``Problem`` has one loss and one
optimizer and receives its own loss's gradient plus best-response terms along ``u2l`` paths;
wiring stages with ``l2u`` would make each the upper level of the one before and add implicit
hypergradients, a different algorithm. Nothing in Betty's API routes a loss to a subset of a
problem's parameters across problems, so there is no Betty version to measure."""

from __future__ import annotations

PROGRAM = "interlock"
BETTY = ("no interlocking chains: a Problem gets its own loss's gradient plus best-response terms; "
         "no API sends stage k a later head's gradient and its head its own")
METHOD = "chain { interlock = 2 } → none (not an MLO edge)"


def evidence() -> list[tuple[str, str]]:
    return []
