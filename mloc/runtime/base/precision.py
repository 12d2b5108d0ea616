"""Mixed precision: the autocast context and the loss scaler for a ``precision`` setting.

``fp32`` runs as written; ``bf16`` autocasts to bfloat16 on the CPU and CUDA (no loss
scaling: bfloat16 has float32's range); ``fp16`` autocasts to float16 on CUDA only, with
dynamic loss scaling (``torch.amp.GradScaler``; Micikevicius et al., "Mixed Precision
Training", ICLR 2018). :class:`ScaledStep` lets a GradScaler drive the runtime's
functional optimizer steps::

    scaler = grad_scaler_for(precision, device)
    with autocast_for(precision, device):
        loss = problem_loss()
    scaler.scale(loss).backward()
    scaler.step(ScaledStep(problem.params, problem.step))   # unscales; skips on inf/NaN
    scaler.update()

An upper problem's step passes ``scaler.scale`` as the ``seed`` of
``Hierarchy.hypergrad``: the top loss is scaled before anything is differentiated, and the
hypergradient comes out scaled alike (every BR-VJP is homogeneous of degree one).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch

from mloc.shared.precision import PRECISIONS


class DeviceError(ValueError):
    """The device or precision a run asks for is not available on this machine (an
    environment problem, reported as a usage error: exit 2). ``help`` says what to use."""

    def __init__(self, message: str, help: str):
        super().__init__(message)
        self.help = help



def _device_type(device) -> str:
    return torch.device(device).type


def autocast_for(precision: str, device) -> contextlib.AbstractContextManager:
    """The autocast context for ``precision`` on ``device`` (a ``torch.device`` or string)."""
    kind = _device_type(device)
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        if kind == "cuda" and not torch.cuda.is_bf16_supported():
            raise DeviceError("this CUDA device does not support bf16", "use --precision fp16 (or fp32)")
        return torch.autocast(kind, dtype=torch.bfloat16)
    if precision == "fp16":
        if kind != "cuda":
            raise DeviceError(f"precision fp16 needs a CUDA device, not {kind}",
                              f"use --precision bf16 (the mixed precision for the {kind}) or fp32")
        return torch.autocast("cuda", dtype=torch.float16)
    raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")


NULL_CONTEXT = contextlib.nullcontext()    # reusable: entering it does nothing

_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def autocast_off() -> contextlib.AbstractContextManager:
    """A context with autocast off for every device type it is on. Used in two places:

    - Around every backward of a hypergradient step. Autocast is meant to wrap forwards only
      (its own rule: the backward of each operation runs in the dtype its forward ran in),
      but on the CPU a backward called inside an autocast region runs its matrix products
      in the low precision even where the forward ran in float32: 0.28 % off for a 64×64
      product in bfloat16. A finite difference divides that error by ``2ε``: SAMA's
      hypergradient of a bf16 step was 31 % off at ``eps = 0.01`` (2.5 % at 0.1) before
      its backward ran outside autocast.
    - Around the forwards a method's second-order products differentiate, whose round-off
      the method amplifies: the finite differences' perturbed passes (divided by ``2ε``)
      and the lower loss that ``cg`` and ``neumann`` linearize (``H p`` and ``J_xᵀ q``,
      :meth:`~mloc.runtime.grad.problem.LowerOp.grad`). A solver applies ``H`` many times
      and its error grows with ``H``'s condition number: ``cg(10)`` on a bf16 linearization
      was 4.8 × the hypergradient's own size away from float64 (float32: 1.3e-4), on a
      float32 one 1.6e-2."""
    if not _any_autocast():
        return NULL_CONTEXT
    stack = contextlib.ExitStack()
    for device_type in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device_type):
            stack.enter_context(torch.autocast(device_type, enabled=False))
    return stack


def check_with_dtype(precision: str, dtype: str | None, problems: Sequence = ()) -> None:
    """A :class:`DeviceError` for mixed precision in a ``--dtype float64`` run, where it
    would silently do nothing: autocast lowers float32 operations only. ``precision``: the
    run's; ``problems``: specs (``name``, ``precision``) whose own field overrides it."""
    if dtype != "float64":
        return
    asked = [(p.name, p.precision) for p in problems if p.precision]
    if not problems or len(asked) < len(problems):      # some problem runs at the run's precision
        asked.insert(0, (None, precision))
    for problem, own in asked:
        if own != "fp32":
            _no_mixed_precision(own, problem)


def _no_mixed_precision(precision: str, problem: str | None) -> None:
    said = f"`{problem}`'s precision = {precision}" if problem else f"--precision {precision}"
    raise DeviceError(f"{said} would do nothing in a --dtype float64 run: autocast lowers float32 "
                      "operations only, so every operation would stay in float64",
                      "drop --dtype float64 to train in mixed precision, or keep float64 with "
                      + (f"--set {problem}.precision=fp32" if problem else "--precision fp32"))


def autocast_factory(precision: str, device) -> Callable[[], contextlib.AbstractContextManager]:
    """A function returning :func:`autocast_for`'s context, with ``precision`` and ``device``
    checked once: a training loop builds it once per problem instead of once per step
    (for ``fp32``, a shared ``nullcontext``)."""
    context = autocast_for(precision, device)          # validates; raises like it
    if isinstance(context, contextlib.nullcontext):
        return lambda: NULL_CONTEXT
    kind, dtype = context.device, context.fast_dtype
    return lambda: torch.autocast(kind, dtype=dtype)


def grad_scaler_for(precision: str, device) -> torch.amp.GradScaler:
    """A GradScaler for ``device``, enabled for ``fp16`` only (disabled, it passes losses
    through and steps unconditionally)."""
    kind = _device_type(device)
    return torch.amp.GradScaler(kind, enabled=precision == "fp16" and kind == "cuda")


class ScaledStep:
    """Duck-types the part of ``torch.optim.Optimizer`` a GradScaler uses (``param_groups``
    and ``step()``), so ``scaler.step(ScaledStep(params, step))`` unscales ``params``'
    gradients in place and calls ``step()`` only if they are all finite."""

    def __init__(self, params: Sequence[torch.Tensor], step: Callable[[], object]):
        self.param_groups = [{"params": list(params)}]
        self._step = step

    def step(self) -> None:
        self._step()
