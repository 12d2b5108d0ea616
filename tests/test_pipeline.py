"""The compile is one list of named passes: the checks are its prefix, every pass can be
printed and timed, and no pass changes the unit it was given."""

from __future__ import annotations

from mloc.codegen.compile import PASSES, PIPELINE, compile_program
from mloc.ir.printer import dump_text
from mloc.passes.pipeline import CHECKS
from tests.conftest import PROGRAMS


def test_the_checks_are_the_pipelines_prefix_and_the_registry_its_names():
    assert PIPELINE[:len(CHECKS)] == CHECKS
    assert [p.name for p in PIPELINE] == ["parse", "resolve", "lower", "hierarchy", "dataflow", "runnable",
                                         "trace", "support", "plan", "emit"]
    assert list(PASSES) == [p.name for p in PIPELINE]
    assert {p.stage for p in CHECKS} == {"check"}
    assert {p.stage for p in PIPELINE[len(CHECKS):]} == {"compile"}


def test_every_pass_runs_dumps_and_leaves_its_input_alone(tmp_path):
    seen = []

    def observe(p, unit):
        seen.append((p, unit, p.dump(unit), dump_text(unit.graph) if unit.graph is not None else None))

    compiled = compile_program(str(PROGRAMS / "hpo.mlo"), out_dir=tmp_path, observer=observe)
    assert compiled.ok
    assert [p.name for p, *_ in seen] == [p.name for p in PIPELINE]
    assert all(text for _, _, text, _ in seen)
    dumps = {p.name: text for p, _, text, _ in seen}
    assert "composition order" in dumps["plan"] and dumps["emit"] == compiled.source
    assert dumps["trace"].startswith("problem") and "model" in dumps["trace"]
    for p, unit, _, graph in seen:      # what each pass saw is as it was when the pass ran
        assert (dump_text(unit.graph) if unit.graph is not None else None) == graph, p.name
    lowered = next(u for p, u, *_ in seen if p.name == "lower")
    assert lowered.graph.dataflow_edges() == ()
    assert [name for name, _ in compiled.unit.timings] == [p.name for p in PIPELINE]


def test_a_program_with_errors_stops_after_the_checks(tmp_path):
    bad = tmp_path / "bad.mlo"
    bad.write_text((PROGRAMS / "hpo.mlo").read_text().replace("decay -> model", "decay -> modle"))
    ran = []
    compiled = compile_program(str(bad), out_dir=tmp_path, observer=lambda p, u: ran.append(p.name))
    assert not compiled.ok and compiled.source is None and compiled.plan is None
    assert "trace" not in ran and ran[0] == "parse"
