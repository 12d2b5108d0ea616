"""`--dtype`, `--device` and an evaluation's data: the data arguments mloc passes to an
evaluation (`lib.accuracy(classifier, lib.test_digits())`'s `lib.test_digits()`) are moved
to the run's device and cast as the batches are (floating tensors only, an iterable lazily,
batch by batch), in `mloc run` and in the compiled `train.py`; data a function makes in its
own body is not, and the error says so. The evaluations of tests/run/dtypes.mlo report the
dtypes they were given. There is no CUDA here: the move is checked on the meta device
(which `cast_data` accepts; a run refuses it) and by recording `to_device`'s calls."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import mloc
from mloc.cli import main
from mloc.runtime.program import data as data_module
from mloc.runtime.program.data import CastBatches, cast_data

HERE = Path(__file__).parent
SEEN = ("tuple", "loader", "stream")       # tests/run/dtypes.py: 1.0 = x float64 and y int64


def final(run_dir: Path) -> dict:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]["final"]


def test_mloc_run_casts_an_evaluations_data_arguments(tmp_path, capsys):
    rc = main(["run", str(HERE / "dtypes.mlo"), "--quiet", "--dtype", "float64", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    got = final(tmp_path)
    assert {k: got[k] for k in SEEN} == dict.fromkeys(SEEN, 1.0)
    assert got["loader_len"] == 4.0 and got["literal"] == 1.0    # len() of the loader; a literal as written


def test_without_dtype_the_data_is_as_the_code_made_it(tmp_path, capsys):
    rc = main(["run", str(HERE / "dtypes.mlo"), "--quiet", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    assert {k: final(tmp_path)[k] for k in SEEN} == dict.fromkeys(SEEN, 0.0)   # float32 x, as made


def test_the_compiled_train_py_casts_them_too(tmp_path, capsys):
    assert main(["compile", str(HERE / "dtypes.mlo"), "-o", str(tmp_path / "build")]) == 0, capsys.readouterr().err
    source = (tmp_path / "build" / "train.py").read_text()
    assert "p.data(seen.loader(batch_size=8))" in source and "[0.5, 1.5])" in source   # a literal is not wrapped
    proc = subprocess.run([sys.executable, str(tmp_path / "build" / "train.py"), "--dtype", "float64", "--quiet",
                           "--threads", "1", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert {k: final(tmp_path / "run")[k] for k in SEEN} == dict.fromkeys(SEEN, 1.0)


def test_a_problem_named_p_does_not_hide_the_program(tmp_path, capsys):
    """The generated evaluations take the program as `p`; a problem called `p` makes it
    `program` (a keyword, so no problem or import has that name)."""
    for name in ("small.py", "dtypes.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    text = (HERE / "dtypes.mlo").read_text().replace("program dtypes", "program named_p")
    (tmp_path / "p.mlo").write_text(re.sub(r"\bnet\b", "p", text))
    rc = main(["run", str(tmp_path / "p.mlo"), "--quiet", "--dtype", "float64", "--out", str(tmp_path / "run")])
    assert rc == 0, capsys.readouterr().err
    assert "def eval_0(program):\n    p = program.module('p')" in (tmp_path / "run" / "train.py").read_text()
    assert {k: final(tmp_path / "run")[k] for k in SEEN} == dict.fromkeys(SEEN, 1.0)


def test_data_a_function_makes_itself_is_not_cast_and_the_error_says_so(tmp_path, capsys):
    """exit 1 (the program's code), with a note on what `--dtype` casts and what it does
    not, never an internal error."""
    rc = main(["run", str(HERE / "dtypes_own.mlo"), "--quiet", "--dtype", "float64", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and "E702" in err and "E900" not in err and "own_data" in err
    assert "note: `--dtype float64` casts the modules, the batches and an evaluation's data arguments" in err
    assert "a tensor a function makes or loads in its own body keeps its dtype" in err


# --- cast_data ------------------------------------------------------------------------------

F64 = torch.float64


def test_tensors_and_containers_cast_floating_only():
    x, y = torch.randn(3, 2), torch.tensor([0, 1, 2])
    out = cast_data({"batch": (x, y), "mask": torch.ones(3, dtype=torch.bool), "n": 3, "name": "a"}, F64)
    assert out["batch"][0].dtype == F64 and torch.equal(out["batch"][0], x.double())
    assert out["batch"][1] is y and out["mask"].dtype == torch.bool and (out["n"], out["name"]) == (3, "a")
    assert cast_data(x, F64).dtype == F64 and cast_data([x], F64)[0].dtype == F64


def test_an_iterable_of_batches_is_cast_lazily_and_can_be_iterated_again():
    drawn = []

    class Stream:                                   # iterated, not indexed: batches on demand
        def __iter__(self):
            for i in range(3):
                drawn.append(i)
                yield torch.zeros(2), torch.zeros(2, dtype=torch.int64)

    data = cast_data(Stream(), F64)
    assert isinstance(data, CastBatches) and drawn == []            # nothing drawn yet
    x, y = next(iter(data))
    assert (x.dtype, y.dtype) == (F64, torch.int64) and drawn == [0]    # one batch, when asked
    assert len(list(data)) == 3 and len(list(data)) == 3


def test_a_data_loader_keeps_its_length_and_attributes():
    ds = TensorDataset(torch.randn(10, 2), torch.arange(10))
    data = cast_data(DataLoader(ds, batch_size=4), F64)
    assert len(data) == 3 and data.batch_size == 4 and data.dataset is ds
    assert [(x.dtype, y.dtype) for x, y in data] == [(F64, torch.int64)] * 3


def test_a_generator_stays_a_one_shot_iterator():
    gen = (torch.zeros(1) for _ in range(2))
    data = cast_data(gen, F64)
    assert next(data).dtype == F64 and len(list(data)) == 1


@pytest.mark.parametrize("value", [nn.Linear(2, 2), "text", 1.5, None, TensorDataset(torch.randn(2, 2))])
def test_anything_else_is_passed_as_it_is(value):
    assert cast_data(value, F64) is value
    if isinstance(value, nn.Module):
        assert value.weight.dtype == torch.float32


# --- the run's device -----------------------------------------------------------------------

META = torch.device("meta")       # not the CPU, and here without CUDA


def test_tensors_and_containers_are_moved_now_and_cast_after():
    x, y = torch.randn(3, 2), torch.tensor([0, 1, 2])
    out = cast_data({"batch": (x, y), "n": 3}, None, META)
    assert [(t.device.type, t.dtype) for t in out["batch"]] == [("meta", torch.float32), ("meta", torch.int64)]
    assert out["n"] == 3
    both = cast_data([x, y], F64, META)
    assert [(t.device.type, t.dtype) for t in both] == [("meta", F64), ("meta", torch.int64)]
    assert x.device.type == "cpu" and x.dtype == torch.float32          # the caller's own tensors as they were


def test_an_iterable_is_moved_lazily_batch_by_batch_and_can_be_iterated_again():
    drawn = []

    class Stream:
        def __iter__(self):
            for i in range(3):
                drawn.append(i)
                yield torch.zeros(2), torch.zeros(2, dtype=torch.int64)

    data = cast_data(Stream(), F64, META)
    assert isinstance(data, CastBatches) and drawn == []
    x, y = next(iter(data))
    assert (x.device, x.dtype, y.device, y.dtype) == (META, F64, META, torch.int64) and drawn == [0]
    assert [x.device for x, _ in data] == [META] * 3 and [x.device for x, _ in data] == [META] * 3


def test_a_data_loader_on_the_device_keeps_its_length_and_attributes():
    ds = TensorDataset(torch.randn(10, 2), torch.arange(10))
    data = cast_data(DataLoader(ds, batch_size=4), None, META)
    assert len(data) == 3 and data.batch_size == 4 and data.dataset is ds
    assert [(x.device, x.dtype, y.device) for x, y in data] == [(META, torch.float32, META)] * 3


def test_a_generator_on_the_device_stays_a_generator():
    drawn = []

    def gen():
        for i in range(2):
            drawn.append(i)
            yield torch.zeros(1)

    data = cast_data(gen(), None, META)
    assert isinstance(data, types.GeneratorType) and drawn == []
    assert next(data).device == META and drawn == [0] and len(list(data)) == 1


@pytest.mark.parametrize("value", [nn.Linear(2, 2), "text", 1.5, None, TensorDataset(torch.randn(2, 2))])
def test_anything_else_stays_where_it_is(value):
    assert cast_data(value, None, META) is value and cast_data(value, F64, META) is value
    if isinstance(value, nn.Module):
        assert value.weight.device.type == "cpu"


def test_on_the_cpu_without_dtype_p_data_is_the_value_itself():
    program = mloc.load(HERE / "dtypes.mlo", device="cpu").program
    loader, x = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2), torch.randn(2)
    assert program.data(loader) is loader and program.data(x) is x        # no wrapper, no per-batch work
    assert isinstance(mloc.load(HERE / "dtypes.mlo", device="cpu", dtype="float64").program.data(loader),
                      CastBatches)


@pytest.mark.parametrize("dtype", [None, "float64"])
def test_on_another_device_every_data_argument_is_moved_batch_by_batch(dtype, monkeypatch):
    """The compiled evaluation of tests/run/dtypes.mlo, its program's device made cuda:0
    (no CUDA here: `to_device` records the device it is asked for and leaves the batch on
    the CPU, where the net is): the tuple once, each of the 4 batches of the loader and of
    the generator as drawn; the literal list never."""
    program = mloc.load(HERE / "dtypes.mlo", device="cpu", dtype=dtype).program
    asked = []
    monkeypatch.setattr(data_module, "to_device", lambda batch, device: asked.append(device) or batch)
    program.device = torch.device("cuda:0")
    got = program.evaluate()
    assert asked == [torch.device("cuda:0")] * 9
    assert {k: got[k] for k in SEEN} == dict.fromkeys(SEEN, 1.0 if dtype else 0.0) and got["loader_len"] == 4.0


def _raised_by_user_code(tmp_path, message):
    """A RuntimeError raised from a function in a file of the program's own (not mloc's)."""
    source = tmp_path / "userlib_device.py"
    source.write_text(f"def evaluate():\n    raise RuntimeError({message!r})\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    try:
        namespace["evaluate"]()
    except RuntimeError as err:
        return err
    raise AssertionError("not raised")


MISMATCH = ("Expected all tensors to be on the same device, but found at least two devices, "
            "cuda:0 and cpu!")


def test_a_device_mismatch_in_the_programs_code_gets_a_note_off_the_cpu(tmp_path, capsys):
    """On a device other than the CPU, a device mismatch raised by the program's code (a
    tensor an evaluation loads in its own body) is the program's error (exit 1) with a note
    saying what mloc moves and how to move the rest; on the CPU, or for another error, no
    such note (and no --dtype note without --dtype)."""
    from mloc.runtime.base.usercode import user_error
    err = _raised_by_user_code(tmp_path, MISMATCH)
    assert user_error(err, "evaluation acc at step 500", None, torch.device("cuda", 0)) == 1
    text = capsys.readouterr().err
    assert "error[E702]" in text and "userlib_device.py:2 in evaluate" in text
    assert "moves the modules, the batches and an evaluation's data arguments" in text and "to cuda:0" in text
    assert "--dtype" not in text
    assert user_error(err, "step 3", None, torch.device("cpu")) == 1
    assert "= note" not in capsys.readouterr().err
    other = _raised_by_user_code(tmp_path, "mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)")
    assert user_error(other, "step 3", None, torch.device("cuda", 0)) == 1
    assert "= note" not in capsys.readouterr().err
