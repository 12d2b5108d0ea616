"""Compiled training steps (`--compile on`) against the same steps run eagerly.

Tolerances: the compiled graph runs the operations the eager step runs (it is captured
from it), but TorchInductor fuses them into loops whose roundings differ (a fused sum, a
vectorized `exp`). Each of the 100 steps is compared from the same state (the compiled
program is given the eager one's state before every step), so what is measured is the
compiled step's own error, not training's growth of a rounding difference. A step's
rounding is amplified by the conditioning of what it computes: ten CG iterations on the
small program's nearly singular Hessian turn 1e-16 into 1e-11, in eager mode too. So each
step's difference is held to the larger of a fixed bound (float64 1e-12 relative,
float32 1e-5) and 100 times what one ulp of relative noise on the parameters changes in
the eager step itself (measured every step, on a third copy). The factor: rounding inside
CG's iterations is amplified more than rounding of its inputs (measured: 29 times the
parameter-noise effect, 2.9e-12, on `cg` with SGD below); every other case is within the
fixed bound. A miscompiled graph (the pattern-matcher bug of `backend.CONFIG`) is off by
a relative ~1, far outside either. `cg` runs 3 iterations here: its default 10 on this
67-parameter, nearly singular Hessian amplify any rounding ~1e4 (1.08e-12 at worst,
compiled, against an eager parameter-noise effect under 1e-14 at that step);
`programs/imaml.mlo` runs `cg(iters=10)` on a regularized Hessian in the features case.

Registry-parametrised: one case per hypergradient method with a runtime (and per `itd`
mode), so a new method is covered without editing this file. Compiling costs 2–15 s per
step on one thread, so the full matrix is in the slow tier; the default tier compiles
one program.
"""

from __future__ import annotations

import math

import pytest
import torch

import mloc
from mloc.builtins import METHODS, OPTIMIZERS
from mloc.runtime.compiled.decision import decide
from mloc.runtime.compiled.fused import ABSENT
from mloc.runtime.compiled.step import _compare, _Number
from tests.conftest import ROOT

SMALL = ROOT / "tests" / "run" / "small.mlo"
EDGE = "weights->net"
CASES = sorted(("cg(iters=3)" if m == "cg" else m) for m, d in METHODS.items()
               if d.runtime is not None and m != "itd") + [
    "itd(steps=2, mode=reverse)", "itd(steps=2, mode=forward)", "itd(steps=2, mode=recompute)"]


def _pair(method: str | None, optimizer: str | None, dtype: str, program=SMALL, extra=()):
    sets = [f"{EDGE}.hypergrad={method}", f"net.optimizer={optimizer}"] if method else list(extra)
    return (mloc.load(program, set=sets, dtype=dtype, compile="off"),
            mloc.load(program, set=sets, dtype=dtype, compile="on"))


def _worst(eager, compiled) -> float:
    worst = 0.0
    for name, lv in eager.program.live.items():
        for a, b in zip(lv.problem.params, compiled.program.live[name].problem.params):
            worst = max(worst, ((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item())
    return worst


def _ulp_noise(session, generator) -> None:
    """Every parameter times ``1 ± ulp`` (a random sign per entry)."""
    with torch.no_grad():
        for lv in session.program.live.values():
            for p in lv.problem.params:
                ulp = torch.finfo(p.dtype).eps
                sign = torch.randint(0, 2, p.shape, generator=generator).to(p.dtype) * 2 - 1
                p.mul_(1 + ulp * sign)


def _agree(method: str | None, optimizer: str | None, dtype: str, steps: int, bound: float, warmup: int = 5,
           program=SMALL, extra=(), reports: list | None = None, eager_steps: dict | None = None):
    """Every step of ``steps`` compiled and eager from the eager state, within the module
    docstring's bound; no compile at all after the first ``warmup`` steps. The compiled
    run's step reports are appended to ``reports`` where given. ``eager_steps``: steps expected to
    run eagerly (``"upper weights"``) with a text their reason holds."""
    expected_eager = eager_steps or {}
    eager, compiled = _pair(method, optimizer, dtype, program, extra)
    noisy = _pair(method, optimizer, dtype, program, extra)[0]
    generator = torch.Generator().manual_seed(0)
    worst, compiles = 0.0, None
    for i in range(steps):
        state = eager.program.state_dict()     # the random generators' states too: one per process
        for session in (eager, compiled, noisy):
            session.program.load_state_dict(state)
            if session is noisy:
                _ulp_noise(noisy, generator)
            session.step()
        allowed = max(bound, 100 * _worst(eager, noisy))
        worst = max(worst, _worst(eager, compiled) / allowed * bound)
        if i + 1 == warmup:
            compiles = [r.graphs + r.recompiles for r in compiled.program.compiling.ran()]
    ran = compiled.program.compiling.ran()
    if reports is not None:
        reports.extend(ran)
    reports = ran
    assert reports and all(r.compiled or r.kind == "commit" and r.reason == _refused(compiled, r.name)
                           or expected_eager.get(f"{r.kind} {r.name}", "\0") in (r.reason or "")
                           for r in reports), [r.line() for r in reports]
    assert all(any(f"{r.kind} {r.name}" == k and not r.compiled for r in reports) for k in expected_eager), expected_eager
    _fused_where_allowed(compiled)
    assert [r.graphs + r.recompiles for r in reports] == compiles, [r.line() for r in reports]   # steady
    assert worst <= bound, f"{method}: a compiled step differs from the eager one by {worst / bound:.3g} × its bound"
    assert all(math.isfinite(v) for v in compiled.losses().values())
    return worst


def _refused(session, name: str) -> str | None:
    """Why ``name``'s optimizer refuses a compiled commit (``torch.optim``'s), else None."""
    commit = session.program.live[name].compiled_step
    return commit.refused if commit is not None else None


FUSED = {"sgd", "adam", "adamw", "shampoo"}
"""The registry's optimizers whose functional update a compiled step runs in its graph."""


def _fused_where_allowed(session) -> None:
    """Every compiled plain or hypergradient step that commits through a pipeline without a
    stage between gradient and update ran its problem's optimizer update in its graph where
    the optimizer is one of :data:`FUSED`, and said why not otherwise; steps of an
    accumulation, a chain or a meta-batch commit apart, so does one under `clip_grad_norm`
    (hpo.mlo's upper: a stage between), and so does a step where a parameter got no
    gradient (``first_order``'s upper here)."""
    for r in session.program.compiling.ran():
        if r.kind not in ("lower", "upper") or not r.compiled:
            continue
        optimizer = session.program.live[r.name].problem.optimizer
        kind = type(optimizer).__name__.lower().replace("torchoptimizer", "torch")
        if kind == "adam" and optimizer.decoupled:
            kind = "adamw"
        if r.split is not None and ("accumulate" in r.split or "clip_grad_norm" in r.split or r.split == ABSENT):
            continue                # a stage between gradient and update: apart, with its reason
        if getattr(optimizer, "unfused", None):     # the optimizer's own reason (Shampoo's async roots)
            assert not r.fused and optimizer.unfused in (r.split or ""), r.line()
            continue
        assert r.fused == (kind in FUSED), r.line()
        assert r.fused or r.split, r.line()


def test_a_compiled_program_equals_its_eager_run_in_float64():
    """The default tier's case: the program's own neumann hypergradient, SGD with momentum
    below, Adam above (whose step count the compiled upper step does not read)."""
    _agree("neumann(iters=3, alpha=0.1)", "sgd(lr=0.1, momentum=0.9)", "float64", 30, 1e-12)


SGD, ADAM = "sgd(lr=0.1, momentum=0.9)", "adam(lr=0.01)"
OPTIMIZERS_RUN = {"sgd": "sgd(lr=0.1)", "adam": "adam(lr=0.01)", "adamw": "adamw(lr=0.01)",
                  "shampoo": "shampoo(lr=0.01, update_every=3, start_preconditioning_step=2)",
                  "torch": "torch(lr=0.1, cls=torch.optim.RMSprop)"}
PAIRS = ([(m, SGD) for m in CASES] + [("sama", ADAM), ("itd(steps=2, mode=reverse)", ADAM)]
         + [("neumann(iters=3, alpha=0.1)", OPTIMIZERS_RUN[o]) for o in sorted(OPTIMIZERS) if o in OPTIMIZERS_RUN])
"""Every method over SGD with momentum; over Adam, the methods that read the lower's optimizer
(SAMA's diagonal, an unroll: Adam's step count is a lifted number, its bias corrections in the
graph); every optimizer of the registry under the lower (its update in the lower step's graph,
or its commit apart, :data:`FUSED`)."""


def test_every_registry_optimizer_has_a_compiled_case():
    """A new optimizer in the registry needs its case here (and a decision in :data:`FUSED`)."""
    assert {o for o, d in OPTIMIZERS.items() if d.runtime is not None} == set(OPTIMIZERS_RUN)


@pytest.mark.slow
@pytest.mark.parametrize("method,optimizer", PAIRS)
def test_every_method_compiled_equals_eager_over_100_steps_in_float64(method, optimizer):
    _agree(method, optimizer, "float64", 100, 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("method", CASES)
def test_every_method_compiled_equals_eager_in_float32(method):
    _agree(method, "sgd(lr=0.1, momentum=0.9)", "float32", 100, 1e-5)


VMAP = ("meta.module=tasks.SineNet(hidden=8)", "adapt.module=tasks.SineNet(hidden=8)", "meta.vmap=true",
        "meta->adapt.hypergrad=neumann(iters=4, alpha=0.01)", "adapt.optimizer=sgd(lr=0.01, momentum=0.9)")
FEATURES = {
    "buffers": ("tests/buffers/bn.mlo", ()),            # BatchNorm statistics, dropout, evaluation mode
    "project": ("tests/features/project.mlo", ()),      # the upper's `project` after its commit
    "reinit and accumulate": ("programs/imaml.mlo", ()),  # reinit per outer step, accumulate = 4, CG
    "interlocking chain": ("programs/interlock.mlo", ()),  # every stage's gradients in one graph
    "vmapped meta-batch": ("programs/imaml.mlo", VMAP),  # 4 tasks' solves and hypergradients in one graph
    "schedules": ("tests/run/small.mlo", ("net.schedule=cosine(total=100)",      # rates (and Adam's betas,
                  "weights.schedule=torch.optim.lr_scheduler.OneCycleLR(max_lr=0.01, total_steps=200)")),
}                                                      # driven by OneCycleLR) as inputs of the fused graphs


@pytest.mark.slow
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_program_features_behave_compiled_as_eager(feature):
    """Each program's steps, compiled, within the same bounds as the methods: buffers
    (BatchNorm's statistics under the buffer rule; dropout draws eager's masks), project,
    reinit, accumulation, an interlocking chain, a vmapped meta-batch, scheduled
    hyperparameters read by the updates in the steps' graphs; the evaluations
    (evaluation mode) read the same state."""
    program, extra = FEATURES[feature]
    _agree(None, None, "float64", 20, 1e-12, program=ROOT / program, extra=extra)


def test_a_value_read_back_to_python_runs_the_step_eagerly_and_says_where(tmp_path):
    """A loss with ``.item()`` in it cannot be one graph: the step runs eagerly, the report
    names the reason and the user's line, and the run's numbers are the eager ones."""
    lib = tmp_path / "itemlib.py"
    lib.write_text((ROOT / "tests" / "run" / "small.py").read_text() + "\n\ndef ce_item(net, batch):\n"
                   "    x, y = batch\n    loss = F.cross_entropy(net(x), y)\n"
                   "    return loss * (2.0 if loss.item() > 100 else 1.0)\n")
    program = tmp_path / "item.mlo"
    program.write_text(SMALL.read_text().replace("import small as lib", "import itemlib as lib")
                       .replace("loss      = lib.ce(net, batch)", "loss      = lib.ce_item(net, batch)"))
    eager = mloc.load(program, dtype="float64", compile="off")
    compiled = mloc.load(program, dtype="float64", compile="on")
    for _ in range(3):
        state = eager.program.state_dict()
        for session in (eager, compiled):
            session.program.load_state_dict(state)
            session.step()
    upper = compiled.program.compiling.reports["upper", "weights"]       # the commits stay compiled
    assert not upper.compiled
    assert "read back to Python" in upper.reason and "itemlib.py:" in upper.reason
    assert compiled.program.compiling.reports["lower", "net"].compiled
    assert _worst(eager, compiled) <= 1e-12


def test_a_guarded_number_answers_comparisons_from_its_value_and_records_them():
    guards: list = []
    n = _Number(torch.tensor(3.0, dtype=torch.float64), 3, 0, guards)
    assert (n == 0) is False and n > 2 and bool(n)
    assert [(i, op, other, answer) for i, _, op, other, answer in guards] == [
        (0, "==", 0, False), (0, ">", 2, True), (0, "!=", 0, True)]

    def holds(value):
        return all(_compare(derive(value), op, other) == answer for _, derive, op, other, answer in guards)
    assert holds(5) and not holds(0)                                 # 5 replays the graph, 0 does not
    assert torch.equal(0.9 ** n, torch.tensor(0.9, dtype=torch.float64) ** 3)     # arithmetic: a tensor
    after = n + 1                                                    # an unrolled step's new count
    assert isinstance(after, _Number) and after.value == 4 and torch.equal(after.tensor, n.tensor + 1)
    assert (after == 1) is False and guards[-1][1](0) == 1           # a guard on count + 1
    assert holds(5) and not holds(0) and holds(3)
    assert int(n) == 3 and guards[-1][2:] == ("==", 3, True)         # specialized
    assert not holds(5)


def test_auto_compiles_only_when_the_saving_exceeds_the_compile_time():
    long = decide(steps_left=100_000, eager_step_seconds=2e-3, kinds=2, operations=400)
    short = decide(steps_left=100, eager_step_seconds=2e-3, kinds=2, operations=400)
    big = decide(steps_left=100_000, eager_step_seconds=2e-3, kinds=2, operations=10_000)
    assert long.compile and not short.compile and not big.compile
    # 8 s start-up + 2 × 1 s per graph + 400 × 15 ms per operation = 16 s
    assert "100000 steps left × 2.00 ms" in long.reason and "> 16 s expected to compile 2 step kinds of 400" \
        in long.reason
    assert "≤ 16 s" in short.reason and "≤ 160 s" in big.reason


def test_the_operations_counted_are_those_a_capture_records():
    """`auto` estimates the compile time from the operations an eager outer step's gradient
    sources dispatch (`Compiling.counting`: not the data draws, nor the commits); they
    are, within views, what the capture of the same steps records."""
    eager, compiled = (mloc.load(SMALL, compile=mode) for mode in ("off", "on"))
    eager.program.compiling.mode = "auto"     # as `mloc run` has it (the API has no warm-up to decide by)
    with eager.program.compiling.counting() as ops:
        eager.program.outer_step()
    compiled.program.outer_step()
    captured = sum(r.operations for (kind, _), r in compiled.program.compiling.reports.items() if kind != "commit")
    assert captured > 100 and 0.8 * captured <= ops.n <= 1.5 * captured, (ops.n, captured)


def test_under_data_parallelism_every_rank_decides_by_rank_0s_step_time(tmp_path):
    """The ranks' replicas must run the same kind of step (a compiled one rounds
    differently): `auto` decides by rank 0's median eager step, broadcast to every rank.
    Here this rank timed slow steps (it would compile) and rank 0 fast ones (it does not)."""
    from types import SimpleNamespace

    from mloc.runtime.run.compiling import CompileWatch

    class Dist:
        world, device, is_main = 2, torch.device("cpu"), False

        def broadcast_params(self, tensors):
            for t in tensors:
                t.fill_(1e-4)                       # rank 0's median: 0.1 ms

    switched = []
    compiling = SimpleNamespace(mode="auto", kinds=2, decision=None, counting=None,
                                switch=lambda on, decision: switched.append((on, decision)))
    watch = CompileWatch(SimpleNamespace(dist=Dist(), compiling=compiling), tmp_path, 0, 100_000, None)
    for done in range(1, 7):
        watch.after(done, 1.0)                      # this rank: 1 s per step
    ((on, decision),) = switched
    assert on is False and "99994 steps left × 0.10 ms per eager step" in decision["reason"]
