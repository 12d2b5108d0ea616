"""Diagnostics the trace pass gives about the user's values (`mloc.passes.trace_checks`):
each points at the field to fix and says what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mloc
from mloc.codegen.compile import compile_program

HERE = Path(__file__).parent / "trace"

PROGRAM = """program p
import userlib as lib
problem model {{
    module    = lib.{module}
    data      = {data}
    loss      = lib.{loss}(model, {reads}batch)
    optimizer = sgd(lr=0.1)
{extra}}}
problem hyper {{
    module    = lib.{upper_module}
    data      = lib.loader()
    loss      = lib.{upper_loss}(model, batch)
    optimizer = adam(lr=1e-3)
}}
hyper -> model {{ hypergrad = {method} }}
"""
DEFAULTS = dict(module="Net()", data="lib.loader()", loss="loss", reads="hyper, ", extra="",
                upper_module="Hyper()", upper_loss="upper", method="neumann(iters=3, alpha=0.1)")


def compile_case(tmp_path, **fields):
    path = HERE / f"_userlib_case_{tmp_path.name}.mlo"
    path.write_text(PROGRAM.format(**{**DEFAULTS, **fields}))
    try:
        return compile_program(str(path), out_dir=tmp_path)
    finally:
        path.unlink()


def only(compiled, code):
    found = [d for d in compiled.diagnostics if d.code == code]
    assert len(found) == 1, [(d.code, d.message) for d in compiled.diagnostics]
    return found[0]


def test_the_template_compiles(tmp_path):
    assert compile_case(tmp_path).ok


def test_a_loss_detached_by_item_says_so(tmp_path):
    d = only(compile_case(tmp_path, loss="loss_item"), "E703")
    assert (d.span.line, d.span.col) == (6, 17)
    assert "returns a Python float" in d.message and "`.item()`" in d.message
    assert "drop `.item()`" in d.help


def test_an_error_in_user_code_during_the_trace_shows_the_users_frames(tmp_path):
    d = only(compile_case(tmp_path, loss="loss_raises"), "E702")
    assert (d.span.line, d.span.col) == (6, 17)
    lines = {ln: n for n, ln in enumerate((HERE / "userlib.py").read_text().splitlines(), 1)}
    where = [f"userlib.py:{lines['    return x.reshape(3, 7)']} in helper",
             f"userlib.py:{lines['    return helper(x).sum() + loss(model, hyper, batch)']} in loss_raises"]
    assert all(any(w in note for note in d.notes) for w in where), d.notes
    # no frame of mloc's or torch's own code, wherever the checkout lies (a clone named `mloc`
    # has `mloc/` in the user's own paths, so the test looks for the packages' folders)
    inside = [str(Path(pkg.__file__).resolve().parent) + "/" for pkg in (mloc, torch)]
    assert not any(where in note for note in d.notes for where in inside), d.notes


@pytest.mark.parametrize("call, got", [
    ("lib.an_int()", "returned an int"),
    ("lib.arrays()", "returned a numpy array (shape [8, 4])"),     # a tuple of tensors: the corpus's E709 case
])
def test_wrong_data_is_blamed_on_the_data_field_with_the_expected_type(tmp_path, call, got):
    c = compile_case(tmp_path, data=call)
    d = only(c, "E709")
    assert (d.span.line, d.span.col) == (5, 17) and not c.ok
    assert got in d.message and "must be an iterable of batches" in d.message
    assert any("DataLoader" in n for n in d.notes)


@pytest.mark.parametrize("call", ["lib.no_batches()", "lib.nothing()"])
def test_data_without_a_batch_says_it_is_empty(tmp_path, call):
    """An empty list or a generator that yields nothing: not "raised StopIteration" (and a
    help to read a traceback that has none) but what is wrong."""
    d = only(compile_case(tmp_path, data=call), "E702")
    assert (d.span.line, d.span.col) == (5, 17)
    assert d.message == f"`{call}` yields no batch: the data is empty" and "StopIteration" not in d.message


def test_batches_of_numpy_arrays_are_blamed_on_the_data_field(tmp_path):
    d = only(compile_case(tmp_path, data="lib.array_batches()"), "E709")
    assert (d.span.line, d.span.col) == (5, 17) and "numpy arrays" in d.message


def test_a_dataset_where_batches_are_expected_is_a_warning(tmp_path):
    c = compile_case(tmp_path, data="lib.dataset()")
    d = only(c, "W104")
    assert (d.span.line, d.span.col) == (5, 17) and c.ok
    assert "DataLoader(lib.dataset()" in d.help


@pytest.mark.parametrize("module, message", [
    ("Renamed()", "the same shapes but different names: `lin.weight` vs `fc.weight`, `lin.bias` vs `fc.bias`"),
    ("Same(width=3)", "`fc.weight` [1, 3] vs `fc.weight` [1, 4]; different shapes: `fc.weight`"),
])
def test_init_mismatch_names_the_parameters_that_differ(tmp_path, module, message):
    c = compile_case(tmp_path, module=module, loss="task_loss", reads="", extra="    init = hyper\n",
                     upper_module="Same()", method="itd(steps=1)")
    d = only(c, "E705")
    assert message in d.message, d.message


# --- W105: --steps shorter than a schedule ------------------------------------------------

@pytest.mark.parametrize("unroll, total, steps, taken", [
    (1, 30, 10, 10),        # one step of `model` per outer step: 10 < 30
    (5, 60, 10, 50),        # five per outer step: 50 < 60
    (5, 50, 10, None),      # 50 == 50: the schedule ends with the run
])
def test_steps_shorter_than_a_schedule_warn(tmp_path, unroll, total, steps, taken):
    from mloc.passes.runlength import short_schedules

    c = compile_case(tmp_path, extra=f"    schedule = cosine(total={total})\n",
                     method=f"neumann(iters=3, alpha=0.1), unroll = {unroll}")
    assert c.ok
    found = short_schedules(c.unit.graph, c.plan.periods, steps, f"--steps {steps}")
    if taken is None:
        assert found == []
        return
    [d] = found
    assert d.code == "W105" and (d.span.line, d.span.col) == (8, 16)
    assert f"spans {total} of its steps, but --steps {steps} gives it {taken}" in d.message
    assert f"run at least {-(-total // unroll)} outer steps" in d.help


def test_mloc_run_warns_when_steps_end_a_schedule_early(tmp_path, capsys, monkeypatch):
    from mloc.cli import main

    path = HERE / f"_userlib_case_{tmp_path.name}.mlo"
    path.write_text(PROGRAM.format(**{**DEFAULTS, "extra": "    schedule = cosine(total=30)\n"}))
    try:
        status = main(["run", str(path), "--steps", "2", "--out", str(tmp_path / "run"), "--quiet", "--color", "never"])
    finally:
        path.unlink()
    err = capsys.readouterr().err
    assert status == 0, err
    assert "warning[W105]: `model`'s schedule spans 30 of its steps, but --steps 2 gives it 2" in err
