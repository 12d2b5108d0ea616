"""A vectorized meta-batch (`vmap = true`) against the same meta-batch solved task by task.

Both runs start from the same seed, in float64, and take three meta steps; the sequential
schedule (reset, K lower steps, hypergradient, per task; one step on the mean) is the
reference, itself tested against closed forms and a hand-written iMAML step
(tests/test_imaml.py). Tolerances: the two differ only in the order of floating-point
sums inside batched kernels (≈1e-16 relative per operation); the meta step with lr 0.1
then feeds them back for three steps, and CG run to convergence amplifies rounding by at
most its condition number (below 1e3 here): 1e-10 for cg, 1e-12 for the rest.
"""

from __future__ import annotations

import pytest
import torch

import mloc
from mloc.api import ProgramError
from tests.conftest import PROGRAMS
from tests.test_imaml import SETS as IMAML_SETS, _hand_meta_gradient

@pytest.fixture(autouse=True)
def one_thread():
    """Batched matmuls of a few tasks are microseconds of work; with two OpenMP threads on
    a busy 2-core machine each waits milliseconds for a core (measured: 24 ms per 4×10×8
    bmm), which says nothing about mloc."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMALL = ["meta.module=tasks.SineNet(hidden=8)", "adapt.module=tasks.SineNet(hidden=8)",
         "meta.optimizer=sgd(lr=0.1)"]


def _pair(extra):
    seq = mloc.load(PROGRAMS / "imaml.mlo", set=[*SMALL, *extra, "meta.vmap=false"], dtype="float64")
    vec = mloc.load(PROGRAMS / "imaml.mlo", set=[*SMALL, *extra, "meta.vmap=true"], dtype="float64")
    return seq, vec


def _gap(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("method, tol", [
    ("cg(iters=60, tol=1e-14)", 1e-10),
    ("neumann(iters=4, alpha=0.01)", 1e-12),
    ("first_order", 1e-12),
])
def test_vmap_meta_batch_equals_the_sequential_one(method, tol):
    seq, vec = _pair([f"meta->adapt.hypergrad={method}", "adapt.optimizer=sgd(lr=0.01, momentum=0.9)"])
    assert "p.meta_batch('meta', tasks=4, steps=5)" in vec.source
    assert "p.meta_batch" not in seq.source
    for _ in range(3):
        seq.step()
        vec.step()
        assert _gap(seq.module("meta").parameters(), vec.module("meta").parameters()) < tol
    a, b = seq.program.live["adapt"], vec.program.live["adapt"]
    # the lower problem ends as the last task left it: solution, momentum, step count
    assert _gap(a.problem.params, b.problem.params) < tol
    assert a.problem.state.count == b.problem.state.count == 5
    assert _gap(a.problem.state.momentum, b.problem.state.momentum) < tol
    assert a.steps == b.steps == 3 * 4 * 5
    # the data streams were drawn in the same order: the next batches are the same
    for name in ("meta", "adapt"):
        seq.program.draw(name)
        vec.program.draw(name)
        assert all(torch.equal(x, y) for x, y in zip(seq.program.live[name].batch, vec.program.live[name].batch))


def test_vmap_imaml_step_equals_the_hand_written_one():
    # CG converges here in 60 steps (the sequential test runs 300): 1.4e-14 from the solve
    sets = [x for x in IMAML_SETS if "hypergrad" not in x] + ["meta->adapt.hypergrad=cg(iters=60, tol=1e-14)"]
    s = mloc.load(PROGRAMS / "imaml.mlo", set=[*sets, "meta.vmap=true"], dtype="float64")
    meta = s.module("meta")
    phi0 = {n: p.detach().clone() for n, p in meta.named_parameters()}
    s.step()
    step = torch.cat([(phi0[n] - p.detach()).reshape(-1) for n, p in meta.named_parameters()])
    want = _hand_meta_gradient(meta, phi0)
    assert torch.allclose(step, want, rtol=0, atol=1e-10), (step - want).abs().max()


def test_a_module_with_buffers_falls_back_to_the_sequential_meta_batch(capfd):
    seq, vec = _pair(["meta->adapt.hypergrad=first_order"])
    for s in (seq, vec):
        s.program.live["adapt"].module.register_buffer("seen", torch.zeros(()))
    seq.step()
    vec.step()
    assert "solves its 4 tasks one after another, not with vmap: `adapt`'s module has buffers" in capfd.readouterr().err
    assert _gap(seq.module("meta").parameters(), vec.module("meta").parameters()) == 0


def test_the_checker_says_where_vmap_cannot_apply():
    with pytest.raises(ProgramError) as e:
        mloc.load(PROGRAMS / "imaml.mlo", set=["meta.vmap=true", "meta->adapt.hypergrad=itd"])
    (d,) = [d for d in e.value.diagnostics if d.code == "E219"]
    assert "`itd` on `meta -> adapt` does not vectorize" in d.message
    assert "`cg`, `neumann` or `first_order`" in d.help


def test_plan_shows_one_vectorized_action():
    s = mloc.load(PROGRAMS / "imaml.mlo", set=["meta.vmap=true"])
    from mloc.passes.plan import plan_table
    text = plan_table(s.plan)
    assert "meta_batch meta x4   (4 tasks of 5 `adapt` steps each, vectorized (vmap)" in text


def test_tasks_whose_batches_differ_in_shape_are_the_programs_error(capsys):
    """Stacking the tasks needs equal shapes: a clear error (exit 1 through the launcher's
    rule for the program's errors), not an internal one."""
    from mloc.runtime.base.usercode import user_error
    from mloc.runtime.grad.metabatch import MetaBatchError
    s = mloc.load(PROGRAMS / "imaml.mlo", set=[*SMALL, "meta.vmap=true", "meta->adapt.hypergrad=first_order"])
    stream, drawn = s.program.streams["adapt"], []

    def uneven():
        x, y = original()
        drawn.append(1)
        return (x[:5], y[:5]) if len(drawn) > 5 else (x, y)     # the second task has 5 shots
    original, stream.next = stream.next, uneven
    with pytest.raises(MetaBatchError, match="the tasks' batches of `adapt` cannot be stacked") as e:
        s.step()
    assert user_error(e.value, "step 1") == 1
    assert "every task's batches of `adapt` must have the same shapes" in capsys.readouterr().err


def _meta_update(vmap: str, precision: str, method: str) -> torch.Tensor:
    s = mloc.load(PROGRAMS / "imaml.mlo", set=[*SMALL, f"meta->adapt.hypergrad={method}", f"meta.vmap={vmap}"],
                  precision=precision)
    before = torch.cat([p.detach().reshape(-1).clone() for p in s.module("meta").parameters()])
    s.step()
    return torch.cat([p.detach().reshape(-1) for p in s.module("meta").parameters()]) - before


@pytest.mark.parametrize("method", ["first_order", "cg(iters=10)"])
def test_a_vmapped_meta_batch_runs_its_training_steps_in_bf16(method):
    """``--precision bf16`` reaches the vectorized solves (it used to be ignored there: the
    update equalled float32's bit for bit), and the meta-update stays within ``4u`` (u =
    2⁻⁸) of float32's: the upper's loss and the linearization run in full precision (under
    vmap a decomposed ``mse_loss`` would escape autocast's float32 list: 2.3 % off)."""
    fp32, bf16 = _meta_update("true", "fp32", method), _meta_update("true", "bf16", method)
    assert not torch.equal(bf16, fp32)
    err = float((bf16 - fp32).norm() / fp32.norm())
    assert err <= 4 * 2.0 ** -8, err     # measured 8.5e-4 (first_order), 1.8e-3 (cg(10))
