"""The trace pass checks the declared edges against the user's real code (meta tensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mloc.codegen.compile import compile_program

HERE = Path(__file__).parent / "trace"

PROGRAM = """program p
import badlib as lib
problem low {{
    module    = lib.Net(width=4{fail})
    data      = lib.loader(batch_size=8)
    loss      = lib.{loss}(low, {reads}batch)
    optimizer = sgd(lr=0.1)
}}
problem high {{
    module    = lib.Scale(width=4)
    data      = lib.loader()
    loss      = lib.{upper_loss}(low, batch)
    optimizer = adam(lr=1e-3)
}}
high -> low {{ hypergrad = neumann(iters=3, alpha=0.1) }}
"""


def compile_case(tmp_path, loss="weighted", reads="high, ", fail="", upper_loss="val", edit=lambda text: text):
    path = HERE / f"_case_{tmp_path.name}.mlo"
    path.write_text(edit(PROGRAM.format(loss=loss, reads=reads, fail=fail, upper_loss=upper_loss)))
    try:
        return compile_program(str(path), out_dir=tmp_path)
    finally:
        path.unlink()


def codes(compiled):
    return [(d.code, d.span.line, d.span.col) for d in compiled.diagnostics]


def test_a_correct_program_compiles_and_reports_sizes(tmp_path):
    c = compile_case(tmp_path)
    assert c.ok and codes(c) == []
    assert c.sizes.params == {"low": 5, "high": 4}
    assert c.sizes.activations["low"] > 0


def test_detached_edge(tmp_path):
    c = compile_case(tmp_path, loss="detached")
    assert codes(c) == [("E701", 6, 35)]
    assert "no parameter of `high` reaches it" in c.diagnostics[0].message


def test_undeclared_dependency(tmp_path):
    # high's loss reaches high's own parameters through a global registry, unnamed
    c = compile_case(tmp_path, upper_loss="val_hidden")
    assert codes(c) == [("E701", 12, 17)]
    assert "depends on the parameters of `high` without naming it" in c.diagnostics[0].message


def test_a_loss_called_with_too_many_arguments_is_caught_by_the_check(tmp_path):
    # takes (net, batch), called with 3: read from badlib.py's source, before anything runs
    c = compile_case(tmp_path, loss="hidden_scale")
    assert codes(c) == [("E309", 6, 45)]
    assert "`hidden_scale(net, batch)` at badlib.py:" in c.diagnostics[0].help


def test_non_scalar_loss(tmp_path):
    c = compile_case(tmp_path, loss="per_example")
    assert codes(c) == [("E703", 6, 17)]
    assert "shape [8, 1]" in c.diagnostics[0].message


def test_failing_constructor(tmp_path):
    c = compile_case(tmp_path, fail=", fail=true")
    assert codes(c) == [("E702", 4, 17)]
    assert "ValueError: width must be even" in c.diagnostics[0].message


def test_init_between_different_architectures(tmp_path):
    c = compile_case(tmp_path, edit=lambda text: text.replace(
        "    optimizer = sgd(lr=0.1)\n}", "    optimizer = sgd(lr=0.1)\n    init = high\n}", 1))
    assert codes(c) == [("E705", 8, 12)]
    assert "`fc.weight` [1, 4] vs `log_scale` [4]" in c.diagnostics[0].message
