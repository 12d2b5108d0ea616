"""What a generated `train.py` declares: the whole program as one :class:`Declaration`.

train.py builds one value, ``PROGRAM = Declaration(...)``, out of the types this module
gathers (its problems' :class:`ProblemSpec` s, the hierarchy's :class:`Edge` s, each upper's
planned :class:`Composition`, the interlocking chains, its :class:`Evaluation` s, what
selection watches, its default :class:`RunConfig` and :class:`Intervals`), and hands it to
:func:`mloc.runtime.processes.launch.main`. The runtime reads its fields; nothing reads train.py's
globals by name. Every type here is the runtime's own (or :mod:`mloc.shared`'s), so
train.py imports nothing of the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from mloc.runtime.program.build import ProblemSpec
from mloc.runtime.grad.compose import Edge
from mloc.runtime.run.loop import Intervals
from mloc.runtime.files.options import RunConfig
from mloc.shared.composition import Composition
from mloc.shared.interlock import Interlock

__all__ = ["Composition", "Criterion", "Declaration", "Edge", "Evaluation", "Interlock", "Intervals", "ProblemSpec",
           "RunConfig"]


@dataclass(frozen=True)
class Evaluation:
    """``eval [NAME] every N = CALL``: ``function(program)`` every ``every`` steps, its
    value logged as ``name`` (a dict's keys become ``NAME.KEY`` when ``named``)."""

    every: int
    name: str
    function: Callable
    named: bool = False


@dataclass(frozen=True)
class Criterion:
    """A metric selection follows: ``checkpoint best on MODE METRIC`` (``best``) or
    ``stop when MODE METRIC has not improved [by min_delta] for PATIENCE evals`` (``stop``),
    followed by :class:`mloc.runtime.run.selection.Tracker`."""

    metric: str
    mode: str                       # "max" | "min"
    patience: int | None = None
    min_delta: float = 0.0


@dataclass(frozen=True)
class Declaration:
    """One compiled program, as train.py declares it.

    ``build_modules()`` builds every problem's module (in source order, after the seed is
    set); ``data[name]()`` makes problem ``name``'s batches; ``schedule(program)`` is one
    outer step (the planner's, calling :class:`~mloc.runtime.program.engine.Program`'s vocabulary);
    ``semantics`` and ``compositions`` are the planner's; ``overrides`` the ``--set``s the
    file was compiled with; ``best`` and ``stop`` what selection watches (None: nothing).
    """

    name: str
    problems: tuple[ProblemSpec, ...]
    build_modules: Callable[[], dict]
    data: Mapping[str, Callable]
    schedule: Callable
    defaults: RunConfig
    edges: tuple[Edge, ...] = ()
    semantics: str = "per_edge"
    compositions: Mapping[str, Composition] = field(default_factory=dict)
    chains: tuple[Interlock, ...] = ()
    evaluations: tuple[Evaluation, ...] = ()
    best: Criterion | None = None
    stop: Criterion | None = None
    intervals: Intervals = field(default_factory=Intervals)
    overrides: tuple[str, ...] = ()

    def directions(self) -> dict[str, str]:
        """``{metric: "max" | "min"}`` for each metric selection watches (the checker made
        ``best`` and ``stop`` agree, E604). ``config.json`` records it, so that `mloc runs`
        and `mloc sweep` rank a metric's values the way the program does."""
        return {w.metric: w.mode for w in (self.best, self.stop) if w is not None}


def declared(namespace: Mapping) -> Declaration:
    """The declaration a train.py's namespace holds (its ``PROGRAM``), found by its type:
    what `mloc run` and a `--pipeline` worker take from the file they execute."""
    (found,) = {id(v): v for v in namespace.values() if isinstance(v, Declaration)}.values()
    return found
