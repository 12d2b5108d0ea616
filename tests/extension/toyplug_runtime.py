"""The implementations of toyplug's built-ins (imports torch: only a run imports it).
Copied by tests/test_extension.py into the temporary package `toyplug` (as `runtime.py`)."""

from dataclasses import dataclass

from mloc.runtime.base import tree
from mloc.runtime.optim import Optimizer, takes
from toyplug.builtins import PlainHyper


class Plain(Optimizer):
    def init(self, params):
        return ()

    def update(self, grads, state, params):
        step = self.hyper.step              # read when stepping: a schedule replaces it
        return tuple(-step * g for g in grads), state


@takes(PlainHyper)
def plain(hyper: PlainHyper) -> Plain:
    return Plain(hyper)


@dataclass(frozen=True)
class onestep:
    scale: float = 1.0

    def prepare(self, op):
        return op.theta

    def vjp(self, op, v, create_graph: bool = False):
        return op.mixed(tree.scale(self.scale, v), create_graph)
