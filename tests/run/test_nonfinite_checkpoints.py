"""No checkpoint mloc writes ever holds a non-finite parameter or optimizer state (issue 22).

NaN and Inf are injected into one step of a small bilevel program (``tests/run/nonfinite.py``:
a poisoned batch at step ``at`` makes the lower's loss NaN, one entry of its gradient NaN or
Inf under a finite loss, one entry 1e30 so that a squared statistic overflows, or the
upper's hypergradient NaN), and ``mloc run`` trains it with checkpoints and logs at other
intervals than the bad step. Whatever the case: the run ends with exit 0 or 1 (never an
internal error), ``checkpoint.pt`` and ``best.pt`` hold only finite parameters and optimizer
states, a NaN report names a step no earlier than the poisoned one, and the checkpoint it
calls the last good one precedes that step. A NaN or Inf gradient or loss of the lower problem
is named at its own step.

The cases are drawn from the registries (``mloc.builtins``: every optimizer with a runtime,
every method with a runtime, each lower optimizer only with the methods its capabilities
allow), so a new optimizer or method is covered without editing this file: the default
tier takes each optimizer and each method at least once, the slow tier many random cases.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

from mloc.builtins import METHODS, OPTIMIZERS
from mloc.cli import main
from mloc.runtime.base import tree
from mloc.runtime.program.checkpoint import load_checkpoint

RUN = Path(__file__).resolve().parent
RUNNABLE = sorted(n for n, d in OPTIMIZERS.items() if d.runtime is not None)
RUN_METHODS = sorted(m for m, d in METHODS.items() if d.runtime is not None)
KINDS = [("net", "grad"), ("net", "loss"), ("net", "huge"), ("weights", "grad"), ("net", "inf"),
         ("weights", "loss"), ("weights", "huge")]
REPORT = re.compile(r"error: the (.+) of problem `(\w+)` became NaN or Inf at step (\d+)")


def _call(name: str, lr: float) -> str:
    """A call of the built-in optimizer ``name`` with its required arguments (lr) filled in
    (``name`` with arguments already: those, and the learning rate)."""
    if "(" in name:
        return name.replace("(", f"(lr={lr}, ", 1)
    args = {"lr": lr}
    for p in OPTIMIZERS[name].signature.params:
        if p.name not in args and repr(p.default) == "REQUIRED":
            args[p.name] = 1
    return f"{name}({', '.join(f'{k}={v}' for k, v in args.items())})"


def _allowed(method: str) -> list[str]:
    """The lower optimizers whose capabilities the method's needs are within."""
    return [o for o in RUNNABLE if METHODS[method].caps.needs <= OPTIMIZERS[o].caps.provides]


def _default_cases() -> list[tuple]:
    """Each method once and each optimizer at least once, the kinds and intervals in turn."""
    cases, used = [], set()
    for i, method in enumerate(RUN_METHODS):
        options = _allowed(method)
        fresh = [o for o in options if o not in used] or options
        opt = fresh[0]
        used.add(opt)
        cases.append((opt, method, *KINDS[i % len(KINDS)], 3 + i % 6, 1 + i % 3, 2 + i % 4))
    for opt in RUNNABLE:
        if opt not in used:
            method = next(m for m in RUN_METHODS if opt in _allowed(m))
            cases.append((opt, method, "net", "grad", 4, 2, 3))
    return cases


def _random_cases(n: int, seed: int = 22) -> list[tuple]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        method = rng.choice(RUN_METHODS)
        cases.append((rng.choice(_allowed(method)), method, *rng.choice(KINDS), rng.randint(1, 9),
                      rng.randint(1, 4), rng.randint(1, 6)))
    return cases


def _program(tmp: Path, checkpoint_every: int, log_every: int) -> Path:
    """``nonfinite.mlo`` with the intervals given, beside copies of its Python modules."""
    for module in ("nonfinite.py", "small.py"):
        shutil.copy(RUN / module, tmp / module)
    text = (RUN / "nonfinite.mlo").read_text()
    text = text.replace("checkpoint every 2", f"checkpoint every {checkpoint_every}")
    text = text.replace("log every 5", f"log every {log_every}\n    eval acc every 2 = lib.accuracy(net)"
                                       "\n    checkpoint best on max acc")
    path = tmp / "nonfinite.mlo"
    path.write_text(text)
    return path


def _nonfinite_entries(path: Path) -> list[str]:
    """Where the checkpoint at ``path`` holds a NaN or Inf among the parameters and optimizer
    states (``problem.params[i]``, ``problem.optimizer[j]``)."""
    state = load_checkpoint(path, None)
    bad = []
    for name, saved in state["problems"].items():
        for part in ("params", "optimizer"):
            for i, t in enumerate(tree.tensors(saved[part])):
                if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                    bad.append(f"{name}.{part}[{i}]")
    return bad


def _run_case(tmp_path: Path, capsys, opt, method, target, kind, at, checkpoint_every, log_every,
              compile: str = "auto"):
    program = _program(tmp_path, checkpoint_every, log_every)
    out = tmp_path / "r"
    rc = main(["run", str(program), "--out", str(out), "--quiet", "--threads", "1", "--compile", compile,
               "--set", f"net.optimizer={_call(opt, 0.1)}", "--set", f"weights.optimizer={_call(opt, 0.01)}",
               "--set", f"weights->net.hypergrad={method}",
               "--set", f'{target}.loss.inject="{kind}"', "--set", f"{target}.data.at={at}"])
    err = capsys.readouterr().err
    assert rc in (0, 1), err
    assert "Traceback" not in err and "internal" not in err, err
    written = {f: out / f for f in ("checkpoint.pt", "best.pt") if (out / f).is_file()}
    for name, path in written.items():
        assert _nonfinite_entries(path) == [], f"{name} holds NaN/Inf; {err}"
    report = REPORT.search(err)
    if rc == 1:
        assert report, err
        what, problem, step = report.group(1), report.group(2), int(report.group(3))
        assert step >= at, err                           # nothing went wrong before the poisoned step
        if "checkpoint.pt" in written:
            assert load_checkpoint(written["checkpoint.pt"], None)["step"] < step
            assert f"the last good checkpoint is {written['checkpoint.pt']}" in err
        else:
            assert "no checkpoint was written before it" in err
    if target == "net" and kind in ("grad", "inf", "loss"):   # the lower's own step: named at once
        named = "loss" if kind == "loss" else "parameters or optimizer state"   # what the gradient reached
        assert rc == 1 and (what, problem, step) == (named, "net", at), err
    return rc, err


@pytest.mark.parametrize("opt,method,target,kind,at,checkpoint_every,log_every", _default_cases())
def test_no_checkpoint_holds_a_non_finite_value(tmp_path, capsys, opt, method, target, kind, at,
                                                checkpoint_every, log_every):
    _run_case(tmp_path, capsys, opt, method, target, kind, at, checkpoint_every, log_every)


@pytest.mark.slow
@pytest.mark.parametrize("opt,method,target,kind,at,checkpoint_every,log_every", _random_cases(60))
def test_no_checkpoint_holds_a_non_finite_value_many(tmp_path, capsys, opt, method, target, kind, at,
                                                     checkpoint_every, log_every):
    _run_case(tmp_path, capsys, opt, method, target, kind, at, checkpoint_every, log_every)


@pytest.mark.parametrize("opt", RUNNABLE)
def test_a_nan_gradient_under_a_finite_loss_is_named_at_its_step_and_never_checkpointed(tmp_path, capsys, opt):
    """The issue's case: at step 8 the loss is finite and one gradient entry is NaN, and a
    checkpoint is due at step 8. The run stops naming step 8 (the parameters the gradient
    reached; the note says the loss was finite); the checkpoint on disk is step 6's, finite,
    and the report calls it the last good one (before: step 8's checkpoint was written with
    NaN weights and the report blamed the loss at step 9)."""
    rc, err = _run_case(tmp_path, capsys, opt, "first_order", "net", "grad", 8, 2, 5)
    assert rc == 1 and "the parameters or optimizer state of problem `net` became NaN or Inf at step 8" in err
    assert "= note: its loss (or hypergradient) was finite at that step" in err
    assert load_checkpoint(tmp_path / "r" / "checkpoint.pt", None)["step"] == 6


@pytest.mark.parametrize("opt", RUNNABLE)
def test_an_overflowing_statistic_is_named_at_its_step(tmp_path, capsys, opt):
    """A finite gradient entry of 1e30 (of the logits) at step 4 under a finite loss: adam's,
    adamw's and shampoo's squared statistics overflow to Inf (sgd's parameters move by ~1e29,
    finite).
    Such a step is named as the parameters or optimizer state at step 4, and step 4's
    checkpoint is not written (before: nothing was noticed until a loss turned NaN, and the
    checkpoints in between held an Inf statistic)."""
    rc, err = _run_case(tmp_path, capsys, opt, "first_order", "net", "huge", 4, 1, 5)
    if opt in ("adam", "adamw", "shampoo"):
        assert rc == 1, err
    if rc == 1 and "at step 4" in err:
        assert "the parameters or optimizer state of problem `net` became NaN or Inf at step 4" in err, err
        assert load_checkpoint(tmp_path / "r" / "checkpoint.pt", None)["step"] == 3


@pytest.mark.parametrize("kind", ["grad", "huge"])
def test_shampoo_with_asynchronous_stale_roots_never_checkpoints_a_non_finite_root(tmp_path, capsys, kind):
    """Shampoo computing its roots in the background worker (``async_roots``, staleness 2,
    preconditioning from step 1): after a NaN gradient (or an overflowing statistic) at
    step 3 the root refreshed from those statistics is rejected and never installed, the
    step is named, and no checkpoint, whose state includes the pending roots after the
    worker drained, holds a NaN or Inf."""
    opt = "shampoo(staleness=2, async_roots=true, start_preconditioning_step=1)"
    rc, err = _run_case(tmp_path, capsys, opt, "first_order", "net", kind, 3, 1, 5)
    assert rc == 1 and "of problem `net` became NaN or Inf at step 3" in err, err
    assert load_checkpoint(tmp_path / "r" / "checkpoint.pt", None)["step"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("opt,target,kind", [("sgd", "net", "grad"), ("adam", "net", "huge"),
                                             ("adam", "net", "loss"), ("adam", "weights", "grad")])
def test_a_compiled_step_with_its_update_in_the_graph_names_a_non_finite_step(tmp_path, capsys, opt, target, kind):
    """`--compile on`: the lower and upper steps run their optimizer updates inside their
    graphs (``compiled.fused``), so a non-finite gradient reaches the parameters inside the
    graph, as it does in an eager commit; the watches read the graph's outputs and the
    committed state after it. The step is named as in eager (the lower's own NaN at its
    step; an overflowing Adam statistic as the parameters or optimizer state) and no
    checkpoint holds it (``_run_case``'s checks)."""
    method = "first_order" if target == "net" else "neumann"     # the upper's NaN reaches it through the lower
    rc, err = _run_case(tmp_path, capsys, opt, method, target, kind, 4, 2, 5, compile="on")
    assert rc == 1, err
    named = {"loss": "loss", "grad": "parameters or optimizer state" if target == "net" else "hypergradient",
             "huge": "parameters or optimizer state"}[kind]
    if target == "net":
        assert f"the {named} of problem `net` became NaN or Inf at step 4" in err, err
    compiled = json.loads((tmp_path / "r" / "config.json").read_text())["run"]["compiled"]
    update = {c["step"]: c["update"] for c in compiled if c["step"] in ("lower net", "upper weights")}
    assert update["lower net"] == "fused", compiled
    if method == "first_order":     # no gradient reaches the weight net: its graph is the gradient's, committed apart
        assert update["upper weights"].startswith("a parameter no gradient reached keeps its optimizer state"), compiled
    else:
        assert update["upper weights"] == "fused", compiled
