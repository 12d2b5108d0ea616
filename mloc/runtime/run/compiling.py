"""The run loop's side of compiled steps (`--compile`): `auto`'s decision after the warm-up
(:mod:`mloc.runtime.compiled.decision`), and the steps' reports shown and recorded in
`config.json`."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from contextlib import contextmanager
from typing import Iterator

from mloc.runtime.compiled.decision import WARMUP, decide
from mloc.runtime.files.runfiles import amend_config
from mloc.runtime.program.engine import Program


class CompileWatch:
    """The run's side of compiled steps: `--compile auto`'s decision after the warm-up
    (:mod:`mloc.runtime.compiled.decision`), and, after the first compiled step, a line
    per step (compiled, in how long, or why not) shown and recorded in `config.json`."""

    def __init__(self, program: Program, out: Path, start: int, steps: int, progress):
        self.program, self.out, self.start, self.steps, self.progress = program, out, start, steps, progress
        self.times: list[float] = []
        self.reported = False
        self.eager: set[int] = set()    # the reports of the steps already said to run eagerly
        self.operations = 0     # the first step's gradient operations (`auto`)
        kept = program.compiling.decision
        if kept:
            self._say(f"compile: {'on' if kept['compile'] else 'off'} (the decision this run made at step "
                      f"{kept.get('at_step', '?')}, kept on resume: --compile on|off overrides it)")

    def finish(self) -> None:
        """The run's end: the steps' reports into `config.json`."""
        if self.program.compiling.reports and self.program.dist.is_main:
            amend_config(self.out, compiled=self.program.compiling.report())

    @contextmanager
    def around(self, done: int) -> Iterator[None]:
        """The context of outer step ``done``: under `auto`, the first step's gradient
        operations are counted (that step is not timed: it builds the steps)."""
        if self.program.compiling.mode == "auto" and done == self.start + 1:
            with self.program.compiling.counting() as ops:
                yield
            self.operations = ops.n
        else:
            yield

    def after(self, done: int, seconds: float) -> None:
        program = self.program
        if program.compiling.mode == "auto":
            if done > self.start + 1:           # the first step builds the steps: not timed
                self.times.append(seconds)
            if len(self.times) == WARMUP:
                d = decide(self.steps - done, self._median(), program.compiling.kinds,
                           self.operations)
                decision = {"compile": d.compile, "reason": d.reason, "at_step": done}
                program.compiling.switch(d.compile, decision)
                self._say(f"compile: {'on' if d.compile else 'off'} ({d.reason})", compile_decision=decision)
        elif program.compiling.mode == "on" and not self.reported and program.compiling.reports:
            self.reported = True
            for r in program.compiling.ran():
                self._say(f"compile: {r.line()}")
            self.eager = {id(r) for r in program.compiling.ran() if r.reason is not None}
            if program.dist.is_main:
                amend_config(self.out, compiled=program.compiling.report())
        elif self.reported:
            self._fallbacks(done)

    def _fallbacks(self, done: int) -> None:
        """A step compiled at first that runs eagerly from a later step on (a recapture the
        tracer refused, too many signatures): said once, when it happens, and recorded."""
        fell = [r for r in self.program.compiling.ran() if r.reason is not None and id(r) not in self.eager]
        for r in fell:
            self.eager.add(id(r))
            self._say(f"compile: from step {done}: {r.line()}")
        if fell and self.program.dist.is_main:
            amend_config(self.out, compiled=self.program.compiling.report())

    def _median(self) -> float:
        """The median eager step, rank 0's under data parallelism (broadcast): the ranks
        must decide alike, or their replicas would round differently (a compiled step is
        not bitwise an eager one) and drift apart."""
        median = statistics.median(self.times)
        if self.program.dist.world > 1:
            cell = torch.tensor([median], dtype=torch.float64, device=self.program.dist.device)
            self.program.dist.broadcast_params([cell])
            median = float(cell[0])
        return median

    def _say(self, line: str, **record) -> None:
        if self.progress is not None and hasattr(self.progress, "note"):
            self.progress.note(line)
        if record and self.program.dist.is_main:
            amend_config(self.out, **record)
