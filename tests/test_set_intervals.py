"""`--set train.log_every=N` and `train.checkpoint_every=N`: the names `mloc graph` prints for
`log every N` and `checkpoint every N` are accepted by `--set` (they were refused: "the train
block has no field `log_every`"), spliced into the file's entry or added to the train block,
and checked like the file (issue 22, item 14)."""

from __future__ import annotations

import json

import pytest

from mloc.cli import main
from mloc.codegen.overrides import OverrideError, apply_all
from mloc.lang.vocabulary import TRAIN_INTERVALS
from mloc.source import SourceFile
from tests.conftest import PROGRAMS
from tests.run.helpers import SMALL, mloc

PROGRAM = """program p
problem a { module = lib.M(3), optimizer = sgd(lr=0.1) }
train { steps = 3, log every 5 }
"""


@pytest.mark.parametrize("override, expect", [
    ("train.log_every=25", "train { steps = 3, log every 25 }"),          # the file's entry, changed
    ("train.checkpoint_every=7", "train { steps = 3, log every 5, checkpoint every 7 }"),   # added
])
def test_an_interval_is_spliced_into_its_entry_or_added(override, expect):
    assert expect in apply_all(SourceFile("p.mlo", PROGRAM), (override,)).source.text


def test_every_interval_graph_prints_is_a_field_of_set(capsys):
    """`mloc graph` prints the train spec's fields; each interval among them is settable."""
    assert main(["graph", str(PROGRAMS / "data_reweighting.mlo")]) == 0
    train = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("train "))
    printed = {item.split("=")[0] for item in train.split()[1:]}
    assert set(TRAIN_INTERVALS) <= printed and {"log_every", "checkpoint_every"} <= printed


def test_an_interval_is_no_call():
    with pytest.raises(OverrideError) as err:
        apply_all(SourceFile("p.mlo", PROGRAM), ("train.log_every.x=1",))
    assert "`train.log_every` is `5`, not a call" in err.value.message


def test_a_bad_interval_is_a_diagnostic_at_its_set(capsys):
    assert main(["plan", str(PROGRAMS / "hpo.mlo"), "--color", "never", "--set", "train.log_every=0"]) == 1
    err = capsys.readouterr().err
    assert "error[E305]: the interval of `log` must be at least 1, got 0" in err
    assert "1 | --set 'train.log_every=0'" in err


def test_mloc_run_logs_at_the_set_interval(tmp_path, mloc_here):
    """small.mlo logs every 5 steps; with the --set it logs at 2, 4 and 6, and config.json
    records the --set."""
    proc = mloc_here("run", SMALL, "--steps", 6, "--set", "train.log_every=2", "--out", tmp_path, "--quiet")
    assert proc.returncode == 0, proc.stderr
    logged = sorted({r["step"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
                     if r["kind"] == "train"})
    assert logged == [2, 4, 6]
    assert json.loads((tmp_path / "config.json").read_text())["run"]["program"]["set"] == ["train.log_every=2"]
