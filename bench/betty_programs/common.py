"""What every Betty builder shares: a problem from a loss function, an engine, batches cast
to a dtype, and the records the driver reads (see the package docstring for the interface)."""

from __future__ import annotations

import copy
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "programs", ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


@dataclass(frozen=True)
class Check:
    """One first-step comparison: mloc's extra ``--set`` (the method), Betty's lower Config
    fields for it, and whether the two compute the same thing (see the package docstring)."""
    label: str
    mloc_set: tuple[str, ...]
    betty: dict = field(default_factory=dict)
    same: bool = True


@dataclass
class BettyProgram:
    """A built Betty program: ``step()`` runs one outer step as mloc counts them;
    ``modules`` are Betty's (trained in place); ``problems`` its Problem objects by name."""
    step: Callable[[], None]
    modules: dict
    problems: dict


def betty_missing() -> str | None:
    """None when Betty imports, else why not."""
    try:
        import betty  # noqa: F401
        from betty.problems import ImplicitProblem  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def quiet():
    from betty.logging.logger_base import get_logger
    get_logger().setLevel(logging.WARNING)   # Betty logs its set-up at INFO to stdout


class Cast:
    """An iterable of batches with every floating tensor cast to ``dtype`` (restartable:
    each ``iter`` restarts the underlying loader, as Betty does at an epoch's end)."""

    def __init__(self, loader, dtype):
        self.loader, self.dtype = loader, dtype

    def __iter__(self):
        for batch in self.loader:
            yield tuple(t.to(self.dtype) if torch.is_tensor(t) and t.is_floating_point() else t
                        for t in batch)


def problem(name: str, loss: Callable, module, optimizer, loader, config: dict | None = None,
            scheduler=None, hooks: dict | None = None):
    """An ``ImplicitProblem`` called ``name`` whose ``training_step(batch)`` is ``loss(batch)``
    (closures read the modules directly); ``hooks``: extra methods (e.g. ``on_inner_loop_start``)."""
    from betty.configs import Config
    from betty.problems import ImplicitProblem
    cls = type(f"Betty_{name}", (ImplicitProblem,),
               {"training_step": lambda self, batch: loss(batch), **(hooks or {})})
    return cls(name=name, module=module, optimizer=optimizer, scheduler=scheduler,
               config=Config(**(config or {})), train_data_loader=loader)


def engine(problems: list, u2l: dict, l2u: dict, calls: int) -> Callable[[], None]:
    """An Engine over ``problems`` (CPU, no logger), set to training; returns one outer step:
    ``calls`` of ``engine.train_step()`` (the leaf's steps per upper step)."""
    from betty.configs import EngineConfig
    from betty.engine import Engine
    quiet()
    eng = Engine(problems=problems, config=EngineConfig(train_iters=10**9, strategy="cpu", logger_type="none"),
                 dependencies={"u2l": u2l, "l2u": l2u})
    eng.train()

    def outer_step():
        for _ in range(calls):
            eng.global_step += 1
            eng.train_step()
    return outer_step


def copies(modules: dict) -> dict:
    """Deep copies, every parameter trainable (mloc may hold a lower problem's parameters
    without ``requires_grad`` between its steps, e.g. under ``init``)."""
    out = {k: copy.deepcopy(m) for k, m in modules.items()}
    for m in out.values():
        for p in m.parameters():
            p.requires_grad_(True)
    return out


def evaluated(fn, *modules):
    """``fn()`` with ``modules`` in evaluation mode and no autograd (as mloc evaluates)."""
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        with torch.no_grad():
            return float(fn())
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


def sgd1(module):
    """Plain SGD with rate 1: one step moves the parameters by minus their gradient."""
    return torch.optim.SGD(module.parameters(), lr=1.0)


def flat(module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def one_step(row, sets=(), lower=None):
    """One outer step of mloc and of Betty in float64 from the same initial modules, each
    upper problem's optimizer plain SGD with rate 1 (``row.AGREE``): ``(init, mloc, betty)``,
    the initial modules and each system's after the step (``{problem: module}``)."""
    import mloc
    prog = mloc.load(ROOT / "programs" / f"{row.PROGRAM}.mlo", set=[*row.AGREE, *sets], dtype="float64")
    init = {n: copy.deepcopy(prog.module(n)) for n in prog.program.live}
    betty = row.build(init, dtype=torch.float64, agree=True, lower=lower)
    prog.step()
    betty.step()
    return init, {n: prog.module(n) for n in init}, betty.modules


def hypergradient(row, init, after) -> torch.Tensor:
    """``θ₀ − θ₁`` of every upper problem, concatenated (the hypergradient under SGD rate 1)."""
    return torch.cat([flat(init[u]) - flat(after[u]) for u in row.UPPERS])


def failure(fn) -> str:
    """What ``fn()`` raises, as ``Type: message`` (first line, at most 160 characters)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(2000)
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 (RecursionError included: that is the evidence)
        text = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {text[:160]}"
    finally:
        sys.setrecursionlimit(limit)
    return "ran without error"
