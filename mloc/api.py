"""The Python API: compile a program, instantiate it, step it, inspect it, save it.

    import mloc

    prog = mloc.load("programs/hpo.mlo", device="cpu")      # check, trace, plan, build
    prog.step()                                             # one outer step
    prog.run(100)                                           # 100 more (NaN/Inf checked at the end)
    prog.losses()                                           # {"model": 0.41, "decay": 0.57}
    prog.module("model")                                    # the trained torch.nn.Module
    prog.hypergradients()                                   # {"decay": {"log_decay": tensor}}
    prog.save("hpo.pt"); prog.restore("hpo.pt")             # everything needed to resume
    print(prog.source)                                      # the generated train.py
    prog.close()                                            # background work stopped

or ``with mloc.load(...) as prog:``, which closes it at the end of the block. Under torchrun
every program of a process uses the one process group the first joined.

`load` raises `mloc.api.ProgramError` carrying the diagnostics when the program has errors;
a problem name the program does not have raises `UnknownProblem` (a `KeyError`) saying
which it meant, as the checker does for every name.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mloc.codegen.compile import compile_program, load_generated
from mloc.diagnostics import Diagnostic, did_you_mean, render


class ProgramError(Exception):
    """The program has errors; `diagnostics` holds them (rendered in the message)."""

    def __init__(self, diagnostics: tuple[Diagnostic, ...]):
        self.diagnostics = diagnostics
        super().__init__("\n" + render(diagnostics, "full"))


class UnknownProblem(KeyError):
    """A problem name that the program does not have. A `KeyError` (what a lookup by name
    raises), whose message is shown as written rather than quoted."""

    def __str__(self) -> str:
        return str(self.args[0])


class SessionClosed(RuntimeError):
    """A closed :class:`Session` was asked to train or compute (its state stays readable)."""


class Session:
    """A compiled, instantiated program (see the module docstring)."""

    def __init__(self, compiled, program, declaration):
        self.compiled, self.program, self.declaration = compiled, program, declaration
        self.closed = False

    def close(self) -> None:
        """Stop the program's background work (Shampoo's root workers); idempotent. The
        session's state stays readable (``losses``, ``module``, ``evaluate``, ``save``); stepping it
        and its hypergradients raise :class:`SessionClosed`."""
        self.closed = True
        self.program.close()

    def _open(self, doing: str) -> None:
        if self.closed:
            raise SessionClosed(f"program `{self.program.name}`'s session was closed, so it cannot {doing}: "
                                "mloc.load it again (and restore a save of this one) to go on")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def source(self) -> str:
        return self.compiled.source

    @property
    def plan(self):
        return self.compiled.plan

    @property
    def steps_done(self) -> int:
        return self.program.step_count

    def step(self) -> None:
        self._open("step")
        self.program.outer_step()

    def run(self, steps: int) -> dict[str, float]:
        self._open("run")
        for _ in range(steps):
            self.program.outer_step()
        self.program.guard.check()
        return self.program.losses()

    def losses(self) -> dict[str, float]:
        return self.program.losses()

    def module(self, name: str):
        return self.program.module(self._problem(name))

    def _problem(self, name: str) -> str:
        """`name` if the program has that problem, else UnknownProblem with a did-you-mean."""
        names = list(self.program.live)
        if name in names:
            return name
        hint = did_you_mean(name, names) if isinstance(name, str) else None
        raise UnknownProblem(f"program `{self.program.name}` has no problem `{name}`"
                             + (f": {hint}" if hint else "")
                             + f" (its problems: {', '.join(f'`{n}`' for n in names)})")

    def hypergradients(self):
        self._open("compute hypergradients")
        return self.program.hypergradients()

    def evaluate(self) -> dict[str, float]:
        return self.program.evaluate()

    def save(self, path: str | Path) -> None:
        """Write the program's whole state to ``path`` (what :meth:`restore` reads). Under
        torchrun every rank calls it, as every rank steps: background Shampoo roots are
        exchanged and sharded state is gathered across the ranks, then rank 0 alone writes
        and every rank waits for the file."""
        from mloc.runtime.program.checkpoint import save_checkpoint
        state = self.program.state_dict()
        if self.program.dist.is_main:
            save_checkpoint(Path(path), state, self.program.name)
        self.program.dist.barrier()

    def restore(self, path: str | Path) -> None:
        from mloc.runtime.program.checkpoint import load_checkpoint
        self.program.load_state_dict(load_checkpoint(Path(path), self.program.name))


def load(path: str | Path, *, set: tuple[str, ...] | list[str] = (), seed: int | None = None,
         device: str = "cpu", precision: str | None = None, dtype: str | None = None,
         compile: str = "off", overlap: str = "on", strategy: str | None = None,
         checkpoint_form: str | None = None) -> Session:
    """Compile and instantiate the program at `path` (raises ProgramError on errors).
    `compile="on"` runs the training steps compiled with torch.compile
    (:mod:`mloc.runtime.compiled`; `session.program.compiling.reports` says how each step ran);
    "auto" is decided by `mloc run`'s loop, so here it is "off". `overlap`: under torchrun's
    environment (data parallelism), whether gradients are averaged as the backward runs
    (:mod:`mloc.runtime.base.overlap`). `strategy`: ddp, zero or auto (:mod:`mloc.shared.strategy`);
    None keeps the program's. `checkpoint_form`: gathered or sharded, how `mloc run` writes a zero
    run's checkpoints (:mod:`mloc.runtime.program.sharded`; `Session.save` writes gathered)."""
    compiled = compile_program(str(path), tuple(set), compile=compile)
    if not compiled.ok:
        raise ProgramError(compiled.diagnostics)
    from mloc.runtime.processes.launch import build
    declaration = load_generated(compiled.source, str(Path(path).resolve().with_suffix(".generated.py")))
    defaults = declaration.defaults
    config = replace(defaults, seed=defaults.seed if seed is None else seed, device=device,
                     precision=precision or defaults.precision, dtype=dtype,
                     compile="off" if compile == "auto" else compile, overlap=overlap,
                     strategy=strategy or defaults.strategy,
                     checkpoint_form=checkpoint_form or defaults.checkpoint_form)
    return Session(compiled, build(declaration, config), declaration)
