"""Names a user gets wrong get the right answer (issue 22, item 14): the import a
conventional alias needs, the method a paper's name means, a problem name through the
Python API; one error for one cause; a plan of a chain that says what applies to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mloc.builtins import METHODS, TABLES
from mloc.passes.pipeline import compile_source
from mloc.source import SourceFile
from tests.conftest import ROOT

PROGRAM = """\
program p

import lib

problem low {{
    module    = lib.Net(width=4)
    data      = lib.loader(batch_size=8, transform={transform})
    loss      = lib.loss(low, high, batch)
    optimizer = sgd(lr=0.1)
}}

problem high {{
    module    = lib.Hyper(width=4)
    data      = lib.loader(batch_size=8)
    loss      = lib.loss(low, batch)
    optimizer = adam(lr=1e-3)
}}

high -> low {{ hypergrad = {method} }}
"""

LIB = """\
def Net(width=4): ...
def Hyper(width=4): ...
def loader(batch_size=8, transform=None): ...
def loss(*problems_and_batch): ...
"""


def mloc(*argv, cwd=ROOT, prelude: str = "") -> subprocess.CompletedProcess:
    """The CLI in a fresh process; `prelude` runs first (e.g. to hide a package)."""
    code = f"{prelude}\nimport sys\nfrom mloc.cli import main\nsys.exit(main({list(argv)!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})


def check_json(tmp_path, **fields) -> tuple[int, list[dict]]:
    (tmp_path / "lib.py").write_text(LIB, encoding="utf-8")
    (tmp_path / "p.mlo").write_text(PROGRAM.format(**{"transform": "None", "method": "cg", **fields}),
                                    encoding="utf-8")
    proc = mloc("check", "--format", "json", "p.mlo", cwd=tmp_path)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("name, line", [
    ("F.relu", "import torch.nn.functional as F"),
    ("nn.ReLU", "import torch.nn as nn"),
    ("np.float32", "import numpy as np"),
    ("torch.relu", "import torch"),
    ("augment.scale", "import augment"),
])
def test_an_undefined_module_gets_the_import_that_binds_it(tmp_path, name, line):
    rc, diags = check_json(tmp_path, transform=name)
    head = name.split(".")[0]
    assert rc == 1
    assert [(d["code"], d["message"], d["help"]) for d in diags] == [
        ("E101", f"undefined module `{head}`", f"add `{line}` at the top of the file")]


@pytest.mark.parametrize("written, meant", [
    ("darts", "finite_diff"), ("DARTS", "finite_diff"), ("maml", "itd"), ("iMAML", "cg"),
    ("fomaml", "first_order"), ("mwn", "itd(steps=1)"),
])
def test_a_method_named_as_in_its_paper_suggests_the_method(tmp_path, written, meant):
    rc, diags = check_json(tmp_path, method=written)
    assert rc == 1
    assert [(d["code"], d["message"]) for d in diags] == [("E302", f"unknown hypergradient method `{written}`")]
    assert diags[0]["help"].startswith(f"did you mean `{meant}`? It is ")


def test_every_alias_is_a_call_that_checks_and_names_no_builtin():
    """Each alias's call is a valid method (what the help tells the user to write) and no
    alias is also a built-in's name in any table."""
    from tests.test_builtins_registry import HERE, TEMPLATE

    names = {n for table in TABLES.values() for n in table}
    aliases = [a for d in METHODS.values() for a in d.aliases]
    assert {a.name for a in aliases} >= {"darts", "maml", "imaml", "fomaml"}
    for a in aliases:
        assert a.name not in names and a.name == a.name.lower()
        text = TEMPLATE.format(lower="sgd(lr=0.1)", schedule="", method=a.call)
        unit = compile_source(SourceFile(str(HERE / "p.mlo"), text))
        assert unit.ok, (a, [d.message for d in unit.diagnostics])


def test_a_missing_package_raised_by_every_stage_s_data_is_one_error():
    """interlock4.mlo's four stages call the same `ds.sk_digits(...)`; without scikit-learn
    each call raises the same ImportError: one E702, naming the other three places."""
    hide = "import sys\nsys.modules['sklearn'] = None\nsys.modules['sklearn.datasets'] = None"
    proc = mloc("plan", "programs/interlock4.mlo", prelude=hide)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("error[E702]") == 1, proc.stderr
    assert "raised ImportError: sk_digits needs scikit-learn" in proc.stderr
    assert ("note: the same error also at programs/interlock4.mlo:19:17, programs/interlock4.mlo:26:17, "
            "programs/interlock4.mlo:33:17") in proc.stderr
    assert "programs/interlock4.mlo: failed (1 error)" in proc.stderr


def test_the_plan_of_a_chain_shows_what_applies_to_a_chain():
    proc = mloc("plan", "programs/interlock.mlo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "edge  method" not in out and "composition order (" not in out and "semantics:" not in out
    assert out.startswith("no hierarchy edges: the problems train in interlocking chains")
    assert "chain [stage1, stage2, stage3], interlock = 2 (pairwise interlocking):" in out
    assert "schedule, one outer step:\n  chain_step stage1" in out


def test_a_program_with_edges_still_shows_its_edges_and_order():
    proc = mloc("plan", "programs/hpo.mlo")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("edge ") and "composition order (adjoints, bottom-up): model -> decay" in proc.stdout


def test_the_api_answers_a_misspelt_problem_with_a_did_you_mean():
    import mloc as api
    from mloc.api import UnknownProblem
    from tests.test_run import SMALL

    prog = api.load(SMALL)
    with pytest.raises(KeyError) as err:
        prog.module("nett")
    assert isinstance(err.value, UnknownProblem)
    assert str(err.value) == ("program `small_reweighting` has no problem `nett`: did you mean `net`? "
                              "(its problems: `net`, `weights`)")
    assert prog.module("net") is prog.program.module("net")
