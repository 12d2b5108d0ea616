"""The example programs: they check clean, their dumps are pinned, and compiling is
deterministic down to the byte."""

from __future__ import annotations

import pytest

from mloc.frontend.printer import dump_ast
from mloc.ir.printer import FORMATS
from mloc.passes.pipeline import compile_file
from tests.conftest import PROGRAMS, assert_golden

EXAMPLES = sorted(PROGRAMS.glob("*.mlo"))
IDS = [p.stem for p in EXAMPLES]


def test_the_required_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"data_reweighting", "maml", "hpo", "trilevel"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_checks_without_diagnostics(path):
    unit = compile_file(str(path))
    assert unit.diagnostics == ()
    assert unit.graph is not None and unit.graph.verify() == []


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_golden_ast_and_graph(path):
    unit = compile_file(str(path))
    assert_golden(f"{path.stem}.ast", dump_ast(unit.ast))
    assert_golden(f"{path.stem}.graph", FORMATS["text"](unit.graph))


_DUMP_EVERYTHING = """
import sys
from mloc.codegen.compile import compile_program
from mloc.frontend.printer import dump_ast
from mloc.ir.printer import FORMATS
from mloc.passes.pipeline import compile_file
for path in sys.argv[1:]:
    unit = compile_file(path)
    print(dump_ast(unit.ast))
    for fmt in sorted(FORMATS):
        print(FORMATS[fmt](unit.graph))
    compiled = compile_program(path)
    print(compiled.source or [d.code for d in compiled.diagnostics])
"""


def test_compiling_twice_gives_identical_bytes(tmp_path):
    """Two fresh processes with different hash seeds (set and dict orders of strings
    differ between them) print the same AST, graph in every format and train.py."""
    import os
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _DUMP_EVERYTHING, *map(str, EXAMPLES)],
                              env={**os.environ, "PYTHONHASHSEED": seed}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path) for seed in ("1", "2")]
    outputs = []
    try:
        for proc in procs:              # both at once: each compiles every example (~25 s)
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert "def outer_step" in outputs[0]      # the generated code is part of what is compared
    assert outputs[0] == outputs[1]


def test_trilevel_has_three_levels_and_feedback():
    g = compile_file(str(PROGRAMS / "trilevel.mlo")).graph
    assert g.levels() == {"classifier": 0, "weight_net": 1, "strength": 2}
    kinds = {(d.src, d.dst): d.kind for d in g.dataflow_edges()}
    # the middle problem reads the bottom one: the feedback that separates exact from per-edge
    assert kinds[("classifier", "weight_net")] == "l2u"
    assert kinds[("strength", "weight_net")] == "u2l"
    assert kinds[("classifier", "strength")] == "l2u"
    assert g.info.semantics == "exact"


def test_maml_lower_reads_upper_through_init():
    g = compile_file(str(PROGRAMS / "maml.mlo")).graph
    flows = {(d.src, d.dst, d.kind, d.via) for d in g.dataflow_edges()}
    assert ("meta", "adapt", "u2l", "init") in flows
    (edge,) = g.hierarchy_edges()
    assert edge.method.name == "itd" and edge.method.get("steps") == 5 and edge.unroll == 5
