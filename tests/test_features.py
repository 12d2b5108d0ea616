"""`reinit`, `warmup` and `project` (docs/language.md) against a loop written by hand.

The program (tests/features/restart.mlo) is quadratic: the lower problem minimizes
L(w, h) = ½‖w − m‖² + ½ Σᵢ exp(hᵢ) wᵢ² (m the batch mean) with SGD and momentum, the upper
F(w) = ½‖w − m'‖² with plain SGD. Its Hessian H = I + diag(exp h) is diagonal and
∂²L/∂w∂h = diag(exp(h) ⊙ w), so the implicit hypergradient is exactly
−exp(h) ⊙ w ⊙ (w − m') / (1 + exp(h)), which conjugate gradients (d = 3, 10 iterations)
reach to round-off. Everything runs in float64; 1e-12 leaves room for CG's last
iterations and the order of additions, nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mloc
from mloc.passes.pipeline import compile_file

HERE = Path(__file__).parent / "features"
RESTART = HERE / "restart.mlo"
TOL = 1e-12


def _points(seed):
    import importlib.util
    spec = importlib.util.spec_from_file_location("feat_ref", HERE / "feat.py")
    feat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(feat)
    return [b.double() for b in feat.points(seed=seed)]


def hand(outer: int, unroll: int = 3, reinit=None, warmup: int = 0, project=None,
         up_acc: int = 1, low_acc: int = 1):
    """The program's schedule written out: `reinit` None (warm start), "initial" or a
    constant; `warmup` lower steps before the first outer step; `project` (lo, hi) clamps
    the upper after each of its steps; `up_acc` micro-steps per upper step, each after its
    own lower solve (a meta-batch); `low_acc` micro-batches per lower step."""
    low, up = _points(0), _points(1)
    draws = {"low": 0, "up": 0}

    def draw(which, data):
        b = data[draws[which] % len(data)]
        draws[which] += 1
        return b
    w, h = torch.zeros(3, dtype=torch.float64), torch.full((3,), -0.5, dtype=torch.float64)
    buf = None

    def lower_step(w, buf):
        g = sum((w - draw("low", low).mean(0)) + h.exp() * w for _ in range(low_acc)) / low_acc
        buf = g.clone() if buf is None else 0.5 * buf + g
        return w - 0.3 * buf, buf
    for _ in range(warmup):
        w, buf = lower_step(w, buf)
    for _ in range(outer):
        total = torch.zeros(3, dtype=torch.float64)
        for _ in range(up_acc):
            if reinit is not None:
                w = torch.zeros(3, dtype=torch.float64) if reinit == "initial" else torch.full((3,), reinit, dtype=torch.float64)
                buf = None
            for _ in range(unroll):
                w, buf = lower_step(w, buf)
            v = w - draw("up", up).mean(0)
            total = total + (-(h.exp() * w) * v / (1 + h.exp()))
        h = h - 1.0 * total / up_acc
        if project is not None:
            h = h.clamp(*project)
    return w, h


def run(outer: int, *sets: str, path=RESTART):
    s = mloc.load(path, set=list(sets), dtype="float64")
    for _ in range(outer):
        s.step()
    return s.module("model").w.detach(), s.module("hyper").w.detach(), s


def close(a, b):
    return torch.allclose(a, b, rtol=0, atol=TOL)


def test_the_hand_loop_is_the_program_without_the_new_fields():
    w, h, _ = run(3)
    rw, rh = hand(3)
    assert close(w, rw) and close(h, rh)


@pytest.mark.parametrize("value,ref", [("true", "initial"), ("feat.clamp(model, lo=0.25, hi=0.25)", 0.25)])
def test_reinit_starts_the_lower_again_at_each_upper_step(value, ref):
    w, h, s = run(3, f"model.reinit={value}")
    rw, rh = hand(3, reinit=ref)
    assert close(w, rw) and close(h, rh)
    assert not close(h, hand(3)[1])          # it changes the result


def test_warmup_trains_the_lower_alone_first_and_only_once():
    w, h, s = run(3, "hyper->model.warmup=4")
    rw, rh = hand(3, warmup=4)
    assert close(w, rw) and close(h, rh)
    assert s.program.live["model"].steps == 4 + 3 * 3


@pytest.mark.parametrize("sets,kw", [
    (("hyper.accumulate=3",), dict(up_acc=3)),
    (("model.accumulate=2",), dict(low_acc=2)),
    (("hyper.accumulate=2", "model.reinit=true"), dict(up_acc=2, reinit="initial")),   # a meta-batch
], ids=["upper", "lower", "meta-batch"])
def test_accumulate_averages_micro_steps(sets, kw):
    w, h, s = run(3, *sets)
    rw, rh = hand(3, **kw)
    assert close(w, rw) and close(h, rh)
    assert not close(h, hand(3)[1])


def test_project_runs_after_every_step_of_its_problem():
    w, h, _ = run(3, "hyper.project=feat.clamp(hyper, lo=-0.55, hi=-0.45)")
    rw, rh = hand(3, project=(-0.55, -0.45))
    assert close(w, rw) and close(h, rh)
    assert not close(h, hand(3)[1])


def test_the_generated_code_says_what_runs():
    src = run(0, "model.reinit=true", "hyper.project=feat.clamp(hyper)")[2].source
    assert "reinit=True" in src and "project=hyper_project" in src and "p.reset('model')" in src
    assert "def hyper_project(hyper):" in src and "feat.clamp(hyper)" in src
    src = run(0, "hyper->model.warmup=2")[2].source
    assert "if p.step_count == 0:" in src and "for _ in range(2):" in src


@pytest.mark.parametrize("sets,code", [
    (("model.reinit=feat.clamp(hyper)",), "E216"),               # acts on another problem
    (("hyper.reinit=true",), "E216"),                            # the top has no upper
    (("hyper.project=feat.clamp(model)",), "E215"),
    (("hyper.project=feat.broken(hyper)",), "E702"),             # raises when traced
    (("model.reinit=true", "hyper->model.warmup=3"), "E217"),    # reset every step anyway
    (("model.accumulate=2", "hyper->model.hypergrad=itd"), "E218"),
])
def test_misuse_is_a_diagnostic(sets, code):
    with pytest.raises(mloc.api.ProgramError) as err:
        mloc.load(RESTART, set=list(sets))
    assert code in {d.code for d in err.value.diagnostics}


def test_a_batch_dtype_the_loss_cannot_mix_is_caught_at_the_data_field():
    from mloc.codegen.compile import compile_program
    c = compile_program(str(HERE / "dtype_mismatch.mlo"), ())
    assert [(d.code, d.span.line, d.span.col) for d in c.diagnostics] == [("E706", 8, 17)]
    assert "float64" in c.diagnostics[0].message and "float32" in c.diagnostics[0].message
    # promotion that works (float64 batches, float32 vector parameters) is not an error
    assert compile_program(str(RESTART), ("model.data=feat.points64(seed=0)",)).ok


def test_bare_tensor_batches_log_their_losses():
    """Batches that are tensors (not tuples) are valid: `losses()` used to test their truth."""
    s = run(1)[2]
    assert set(s.losses()) == {"model", "hyper"}
    assert set(s.hypergradients()) == {"hyper"}


def test_mloc_run_trains_in_float64_when_asked(tmp_path, mloc_here):
    """`mloc run --dtype float64` (as `python train.py --dtype` and the API's `dtype=`)."""
    from mloc.runtime.program.checkpoint import load_checkpoint
    proc = mloc_here("run", RESTART, "--dtype", "float64", "--steps", "3", "--out", tmp_path / "run", "--quiet")
    assert proc.returncode == 0, proc.stderr
    saved = load_checkpoint(tmp_path / "run" / "checkpoint.pt", None)["problems"]["hyper"]["params"][0]
    assert saved.dtype == torch.float64
    assert torch.equal(saved, run(3)[1])


def test_an_evaluation_may_return_a_dict_of_metrics(tmp_path, mloc_here):
    import json
    proc = mloc_here("run", HERE / "eval_report.mlo", "--out", tmp_path / "run", "--quiet")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = {(r["step"], r["eval"]) for r in records if "eval" in r}
    assert evals == {(s, k) for s in (1, 2) for k in ("w_norm", "w_max")}
    s = mloc.load(HERE / "eval_report.mlo", dtype="float64")
    s.run(2)
    got = s.evaluate()
    assert set(got) == {"w_norm", "w_max"} and got["w_norm"] == float(s.module("model").w.norm())


def test_an_evaluation_returning_something_else_is_the_programs_error(tmp_path, mloc_here):
    """Exit 1 and E707 at the evaluation's line, found when the evaluation is tried at
    compile time (before training), not an internal error (exit 101). The same mistake
    appearing only later in a run is E702 (tests/evals/test_selection.py)."""
    proc = mloc_here("run", HERE / "eval_wrong_report.mlo", "--out", tmp_path / "run", "--quiet")
    assert proc.returncode == 1, proc.stderr
    assert "error[E707]" in proc.stderr and "returns a str" in proc.stderr
    assert "eval_wrong_report.mlo:" in proc.stderr and "E900" not in proc.stderr


def test_data_that_raises_when_drawn_is_reported_at_its_field(tmp_path):
    """An iterable whose first draw raises (here OSError) is E702 at `data`, not a
    message about reading the .mlo file."""
    from mloc.codegen.compile import compile_program
    (tmp_path / "feat.py").write_text((HERE / "feat.py").read_text() + (
        "\n\nclass Broken:\n    def __iter__(self):\n        raise OSError('no such dataset')\n"))
    (tmp_path / "b.mlo").write_text(RESTART.read_text().replace("feat.points(seed=0)", "feat.Broken()"))
    c = compile_program(str(tmp_path / "b.mlo"), ())
    assert [(d.code, d.span.line, d.span.col) for d in c.diagnostics] == [("E702", 9, 17)]
    assert "no such dataset" in c.diagnostics[0].message
