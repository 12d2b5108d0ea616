"""Who trains whom in an interlocking chain (Gomez, Key et al., "Interlocking
Backpropagation", JMLR 23(171), 2022): a pure function of the stages and n, read by the
graph printer, the planner, the generated code and both executions of the runtime.

A chain of K stages (modules M_1..M_K, each ending in a head A_k with loss l_k; the last
head is the network's real one) trained with `interlock = n`:

- the main parameters of stage k receive the gradient of exactly one loss, the one at head
  ``t(k) = min(k + n - 1, K)``, back-propagated through the stages t(k), ..., k (at most
  n of them);
- each head A_k is trained by its own loss only, on detached features;
- a head j < n (other than the last) trains no stage: it is *pruned* (its loss is not
  computed; kept only to report it when the chain monitors its heads).

n = 1 is local learning, n = K end-to-end backpropagation. Indices here are 0-based:
``target(k) = min(k + n - 1, K - 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interlock:
    """An interlocking chain: its `stages` (problem names, in depth order), `n`, and
    whether pruned heads are still evaluated (and trained on their detached features) to
    report their losses (`monitor`)."""

    stages: tuple[str, ...]
    n: int
    monitor: bool = False

    @property
    def k(self) -> int:
        return len(self.stages)

    def target(self, k: int) -> int:
        """The head whose loss trains stage `k`'s main parameters."""
        return min(k + self.n - 1, self.k - 1)

    def trained_by(self, t: int) -> tuple[int, ...]:
        """The stages whose main parameters head `t`'s loss trains (possibly none)."""
        return tuple(k for k in range(self.k) if self.target(k) == t)

    def reach(self, t: int) -> int:
        """The deepest stage head `t`'s gradient signal travels back to (`t` itself when it
        trains no stage below it)."""
        return min(self.trained_by(t), default=t)

    def pruned(self) -> tuple[int, ...]:
        """The heads that train no stage (j < n - 1, 0-based; never the last)."""
        return tuple(t for t in range(self.k) if not self.trained_by(t))

    def evaluated(self) -> tuple[int, ...]:
        """The heads whose loss a step computes: all but the pruned, unless monitored."""
        return tuple(range(self.k)) if self.monitor else tuple(
            t for t in range(self.k) if self.trained_by(t))

    def signals(self, j: int) -> tuple[int, ...]:
        """The heads whose gradient signal passes through stage `j` (its own first):
        t with reach(t) <= j <= t. At most n of them."""
        return tuple(t for t in range(j, self.k) if self.reach(t) <= j and self.trained_by(t))

    def policy(self) -> str:
        return {1: "local learning", 2: "pairwise interlocking"}.get(self.n) or ("end-to-end backpropagation" if self.n == self.k
                                                     else f"{self.n}-wise interlocking")

    def lines(self) -> list[str]:
        """One line per stage: which loss trains its main parameters, through which
        stages, and what becomes of its head."""
        out = []
        for k, name in enumerate(self.stages):
            t = self.target(k)
            path = ", ".join(self.stages[j] for j in range(t, k - 1, -1))
            if k in self.pruned():
                head = "head monitored (trains on its own loss, trains no stage)" if self.monitor \
                    else "head pruned (trains no stage)"
            elif k == self.k - 1:
                head = "its head is the network's"
            else:
                head = "head trained by its own loss on detached features"
            out.append(f"{name}: main <- loss of {self.stages[t]} (through {path}); {head}")
        return out

