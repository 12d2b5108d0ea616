"""mloc's own warnings (`mloc/shared/warning.py`): one category, `MlocWarning`, said as one
line in mloc's voice where mloc owns the terminal, once per run (rank 0) unless about a
rank's own state, recorded in `config.json`; the user's warnings keep Python's format, and
Python's filters (`-W error::...`, `PYTHONWARNINGS`) still apply to mloc's."""

from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mloc.cli import main
from mloc.runtime.processes.workers import _ranks_warnings
from mloc.shared.warning import MlocWarning, line, shown
from tests.conftest import ROOT
from tests.run.helpers import ENV, HERE

UNSEEDED = HERE / "unseeded.mlo"
SHUFFLES = "the data of `{}` shuffles without a seeded generator"
STRICT = "error:the data of:UserWarning"
"""A filter by message: Python resolves a ``-W``/``PYTHONWARNINGS`` category at start-up,
before site-packages is on the path, so only built-in categories (``UserWarning``, which
``MlocWarning`` is) can be named there."""


# --- the category and its line --------------------------------------------------------

def test_the_line_is_said_once_per_run_unless_about_a_ranks_own_state():
    alike, own = MlocWarning("same everywhere"), MlocWarning("my worker died", every_rank=True)
    assert line(alike) == line(alike, 3, 1) == "warning: same everywhere"         # one process
    assert line(alike, 0, 2) == "warning: same everywhere" and line(alike, 1, 2) is None
    assert line(own, 1, 2) == "warning (rank 1 of 2): my worker died"
    assert line(alike, 1, 3, alike=False) == "warning (rank 1 of 3): same everywhere"   # a pipeline stage
    back = pickle.loads(pickle.dumps(own))
    assert type(back) is MlocWarning and str(back) == "my worker died" and back.every_rank


def test_shown_takes_mlocs_warnings_and_passes_the_others_on():
    said, recorded, passed = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, *rest: passed.append((category, str(message)))
        before = warnings.showwarning
        with shown(1, 2, write=said.append, record=recorded.append):
            warnings.warn(MlocWarning("about rank 1", every_rank=True))
            warnings.warn(MlocWarning("rank 0 says this one"))
            warnings.warn("the user's")
            warnings.warn("torch's", FutureWarning)
        assert warnings.showwarning is before
        warnings.warn(MlocWarning("after"))
    assert said == ["warning (rank 1 of 2): about rank 1"] and recorded == ["about rank 1"]
    assert passed == [(UserWarning, "the user's"), (FutureWarning, "torch's"), (MlocWarning, "after")]


def test_a_nested_shown_writes_through_the_enclosing_writer():
    said = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with shown(write=said.append), shown(0, 2):
            warnings.warn(MlocWarning("once"))
    assert said == ["warning: once"]


def test_the_filters_still_apply():
    with warnings.catch_warnings():
        warnings.simplefilter("error", MlocWarning)
        with shown(write=lambda text: pytest.fail(text)), pytest.raises(MlocWarning, match="made an error"):
            warnings.warn(MlocWarning("made an error"))
        warnings.simplefilter("ignore", MlocWarning)
        with shown(write=lambda text: pytest.fail(text)):
            warnings.warn(MlocWarning("silenced"))


def test_the_launcher_adds_the_other_ranks_own_warnings(tmp_path):
    paths = [tmp_path / f"rank{r}.err" for r in range(3)]
    paths[0].write_text("warning (rank 0 of 3): shown live already\n")
    paths[1].write_text("noise\nwarning (rank 1 of 3): my worker died\nwarning: not rank 1's to say\n")
    paths[2].write_text("warning (rank 2 of 3): mine\nerror: rank 2 failed\n")
    assert _ranks_warnings(paths, 0) == "warning (rank 1 of 3): my worker died\nwarning (rank 2 of 3): mine"
    assert _ranks_warnings(paths, 2) == "warning (rank 1 of 3): my worker died"     # rank 2's report has it


# --- a run that says one ----------------------------------------------------------------

@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A 2-step run of the unseeded program, to resume from (copies at the same depth, so
    its train.py finds the program's folder)."""
    out = tmp_path_factory.mktemp("warnings") / "runs" / "fresh"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["run", str(UNSEEDED), "--steps", "2", "--out", str(out), "--quiet"]) == 0
    return out


def _copy(fresh: Path, name: str) -> Path:
    return Path(shutil.copytree(fresh, fresh.parent / name))


def _mloc(*argv, **env) -> subprocess.CompletedProcess:
    """`mloc ARGV` in a child process, with ``env`` added to its environment."""
    return subprocess.run([sys.executable, "-m", "mloc", *map(str, argv)], capture_output=True, text=True,
                          env={**ENV, **env}, cwd=ROOT, timeout=300)


def _train_py(run: Path, *python_flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, str(run / "train.py"), "--steps", "4", "--resume", str(run),
                           "--quiet"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)


def test_a_resume_says_mlocs_warning_in_one_line_and_the_users_in_pythons(fresh):
    """`python train.py` (the run's own context; `mloc run` adds the command's around it)."""
    run = _copy(fresh, "said")
    r = _train_py(run)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    for problem in ("net", "scale"):
        said = [s for s in lines if SHUFFLES.format(problem) in s]
        assert len(said) == 1 and said[0].startswith(f"warning: {SHUFFLES.format(problem)}, so"), r.stderr
    assert not re.search(r"MlocWarning|data\.py|warnings\.warn\(MlocWarning", r.stderr)
    user = [i for i, s in enumerate(lines) if s.endswith("UserWarning: the user's own warning")]
    assert len(user) == 1 and re.match(r".*unseeded\.py:\d+: UserWarning", lines[user[0]])
    assert lines[user[0] + 1].strip() == 'warnings.warn("the user\'s own warning")'    # Python's source line
    latest = json.loads((run / "config.json").read_text())["resumes"][-1]
    assert sorted(w.split(" shuffles")[0] for w in latest["warnings"]) == ["the data of `net`", "the data of `scale`"]
    assert "warnings" not in json.loads((run / "config.json").read_text())["run"]    # the fresh start said none


@pytest.mark.parametrize("door", ["mloc run, PYTHONWARNINGS", "python -W train.py"])
def test_the_warning_filter_makes_mlocs_warning_an_error_of_the_run(fresh, door):
    run = _copy(fresh, f"strict{len(door)}")
    if door.startswith("mloc"):
        r = _mloc("run", UNSEEDED, "--steps", "4", "--resume", run, PYTHONWARNINGS=STRICT)
    else:
        r = _train_py(run, "-W", STRICT)
    assert r.returncode == 1, r.stderr
    assert re.search(rf"(?m)^error: {re.escape(SHUFFLES.format('net'))}.* \(during the resume from ", r.stderr)
    assert "made an error by Python's warning filter" in r.stderr
    assert not re.search(r"Traceback|E900|does not match this program", r.stderr)


@pytest.mark.slow
def test_under_nproc_rank_0_alone_says_a_warning_about_every_rank(fresh):
    """A 1-process checkpoint resumed by 2 processes: each data position's rescale said once,
    by rank 0, unranked (rank 1's stderr reaches the terminal only through the launcher's
    pick of its ranked lines: none). Sharded, the data shuffles by the run's seed: no
    unseeded warning."""
    run = _copy(fresh, "nproc")
    r = _mloc("run", UNSEEDED, "--steps", "4", "--resume", run, "--nproc", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "without a seeded generator" not in r.stderr
    for said in ("the data of `net` was at batch 2 of epoch 0", "the data of `scale` was at batch 2 of epoch 0"):
        assert sum(s.startswith(f"warning: {said}") for s in r.stderr.splitlines()) == 1, r.stderr
    assert "warning (rank" not in r.stderr
    assert len(json.loads((run / "config.json").read_text())["resumes"][-1]["warnings"]) == 2    # by rank 0
