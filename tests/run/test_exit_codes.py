"""A user's mistake or environment is never exit 101: NaN evaluations, output paths that
cannot be written, W&B without a login, a closed stdout and a misspelt `--set` in a sweep
each end with the exit code and the message the CLI promises (docs: `mloc.cli`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mloc.cli import main
from mloc.runtime.files.loggers import LoggerError, WandbLogger
from mloc.runtime.run.metrics import MetricsWriter
from tests.conftest import ROOT
from tests.run.helpers import ENV, HERE, SMALL

NAN_EVAL = HERE / "nan_eval.mlo"


def strict(line: str):
    """The line as strict JSON: a NaN or Infinity token fails."""
    def refuse(token):
        raise ValueError(f"{token} in {line}")
    return json.loads(line, parse_constant=refuse)


# --- NaN evaluations ----------------------------------------------------------------------

def test_nan_inside_a_record_is_written_as_null_at_any_depth(tmp_path):
    seen = []

    class Logger:
        def log(self, record):
            seen.append(record)

        def close(self):
            pass

    with MetricsWriter(tmp_path / "metrics.jsonl", loggers=[Logger()]) as w:
        w.write(3, "*", "summary", final={"a": math.nan, "b": [math.inf, 1.0], "c": {"d": -math.inf, "e": 2}})
    record = strict((tmp_path / "metrics.jsonl").read_text())
    assert record["final"] == {"a": None, "b": [None, 1.0], "c": {"d": None, "e": 2}}
    assert seen[0]["final"] == record["final"]


def test_a_nan_evaluation_finishes_the_run_and_is_never_the_best(tmp_path, capsys):
    """`broken` is NaN at every evaluation, `score` at every other one: the run ends 0, the
    files are strict JSON, and `checkpoint best on max score` picks the largest number."""
    rc = main(["run", str(NAN_EVAL), "--quiet", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 0, err
    records = [strict(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert {r["value"] for r in evals if r["eval"] == "broken"} == {None}
    scores = [(r["value"], r["step"]) for r in evals if r["eval"] == "score"]
    numbers = [(v, s) for v, s in scores if v is not None]
    assert numbers and len(numbers) < len(scores)
    summary = strict((tmp_path / "summary.json").read_text())
    assert summary["final"]["broken"] is None and summary["status"] == "finished"
    assert [r["final"]["broken"] for r in records if r["kind"] == "summary"] == [None]
    assert (summary["best"]["value"], summary["best"]["step"]) == max(numbers)
    assert (tmp_path / "best.pt").is_file()


# --- output paths that cannot be written --------------------------------------------------

def _paths(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "notes.txt").write_text("mine")
    return {"a_file": tmp_path / "notes.txt", "under_a_file": tmp_path / "notes.txt" / "sub",
            "unmakeable": Path("/proc/mloc-test")}


def _one_usage_error(err: str, path: Path) -> None:
    assert "E900" not in err and "Traceback" not in err, err
    assert err.startswith("error: cannot ") and f" {path}: " in err and "\n  = help: " in err, err


@pytest.mark.parametrize("case", ["a_file", "under_a_file", "unmakeable"])
def test_compile_to_a_folder_that_cannot_be_made(tmp_path, capsys, case):
    out = _paths(tmp_path)[case]
    assert main(["compile", str(SMALL), "-o", str(out)]) == 2
    _one_usage_error(capsys.readouterr().err, out)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("case", ["a_file", "under_a_file"])
def test_sweep_into_a_file_is_not_a_directory(tmp_path, capsys, case):
    out = _paths(tmp_path)[case]
    assert main(["sweep", str(SMALL), "--out", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    _one_usage_error(err, out)
    assert "Not a directory" in err and "sweep:" not in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_plot_under_a_file_is_not_a_directory(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "time": 0.0, "problem": "net", "loss": 1.0 / s}) + "\n"
        for s in (1, 2, 3)))
    target = _paths(tmp_path)["a_file"] / "x.png"
    assert main(["plot", str(run), "-o", str(target)]) == 2
    err = capsys.readouterr().err
    _one_usage_error(err, target)
    assert f"{target}: Not a directory" in err


# --- a misspelt --set in a sweep ----------------------------------------------------------

def test_a_sweep_checks_its_set_paths_before_running_anything(tmp_path, capsys):
    bad = "net.optimizr.lr"
    assert main(["run", str(SMALL), "--set", f"{bad}=0.1", "--steps", "1", "--out", str(tmp_path / "r")]) == 2
    expected = capsys.readouterr().err
    assert "has no field `optimizr`" in expected
    assert main(["sweep", str(SMALL), "--set", f"{bad}=0.1,0.2", "--steps", "1", "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == expected
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


# --- W&B without a login ------------------------------------------------------------------

class _FakeWandb:
    """`wandb` whose `init` fails as the real one does without `wandb login` (no network)."""

    class errors:
        class Error(Exception):
            pass

        class UsageError(Error):
            pass

    @classmethod
    def init(cls, **kw):
        raise cls.errors.UsageError("No API key configured. Use `wandb login` to log in.")


def test_wandb_without_a_login_is_a_logger_error(tmp_path):
    with pytest.raises(LoggerError) as e:
        WandbLogger(tmp_path, module=_FakeWandb)
    assert "No API key configured" in str(e.value)
    assert "wandb login" in e.value.help and "WANDB_MODE=offline" in e.value.help


FAKE_WANDB = '''
class errors:
    class Error(Exception):
        pass

    class UsageError(Error):
        pass


def init(**kw):
    raise errors.UsageError("No API key configured. Use `wandb login` to log in.")
'''


def test_mloc_run_with_wandb_and_no_login_exits_2(tmp_path):
    """The whole `mloc run --logger wandb`, with a stand-in `wandb` package first on the path
    (the real one would need a login or the network)."""
    fake = tmp_path / "fake" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_WANDB)
    env = {**ENV, "PYTHONPATH": f"{fake.parent}:{ROOT}", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(SMALL), "--quiet", "--steps", "2",
                           "--logger", "wandb", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "No API key configured" in proc.stderr and "wandb login" in proc.stderr
    assert "WANDB_MODE=offline" in proc.stderr and "E900" not in proc.stderr


# --- a reader that goes away --------------------------------------------------------------

def test_a_closed_stdout_ends_quietly_as_sigpipe_would():
    """`mloc codes | head -2`: the reader is gone before mloc writes (141 = 128 + SIGPIPE)."""
    proc = subprocess.Popen([sys.executable, "-m", "mloc", "codes"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141 and err == b""
