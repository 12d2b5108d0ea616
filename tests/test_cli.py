"""The command line: exit codes, formats, help texts, graph output, no torch in `check`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mloc.cli import build_parser, main
from mloc.codegen.compile import PIPELINE
from mloc.passes.pipeline import CHECKS
from tests.conftest import PROGRAMS, ROOT

MWN = str(PROGRAMS / "data_reweighting.mlo")
BAD = "program p\nproblem a { module = lib.X() }\n"


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mloc", *argv], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120)


def test_check_ok_exit_0(capsys):
    assert main(["check", MWN, "--color", "never"]) == 0
    assert "ok" in capsys.readouterr().err


def test_check_errors_exit_1_and_all_formats(tmp_path, capsys):
    f = tmp_path / "bad.mlo"
    f.write_text(BAD)
    assert main(["check", str(f), "--format", "concise", "--color", "never"]) == 1
    err = capsys.readouterr().err
    assert f"{f}:2:22: error[E101]: undefined module `lib`" in err
    assert main(["check", str(f), "--format", "json"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    objs = [json.loads(x) for x in lines]
    assert {o["code"] for o in objs} == {"E101", "E201"}
    assert all({"file", "line", "col", "message", "severity"} <= o.keys() for o in objs)


def test_usage_and_io_errors_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing.mlo")]) == 2
    assert "no such file" in capsys.readouterr().err
    binary = tmp_path / "bin.mlo"
    binary.write_bytes(b"\xff\xfe\x00program")
    assert main(["check", str(binary)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["check"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["graph", MWN, "--format", "png"])
    assert e.value.code == 2


def test_internal_error_exit_101_and_debug_traceback(monkeypatch, capsys):
    import mloc.passes.pipeline as pipeline

    def boom(*a, **k):
        raise RuntimeError("kaboom")
    monkeypatch.setattr(pipeline, "resolve", boom)
    assert main(["check", MWN]) == 101
    err = capsys.readouterr().err
    assert "internal compiler error" in err and "MLOC_DEBUG=1" in err and "Traceback" not in err
    monkeypatch.setenv("MLOC_DEBUG", "1")
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["check", MWN])


def test_broken_invariant_is_an_internal_error(monkeypatch, capsys):
    from mloc.ir.graph import ProgramGraph
    monkeypatch.setattr(ProgramGraph, "verify", lambda self: ["node 'x' lacks a payload"])
    assert main(["check", MWN]) == 101
    assert "after pass `lower`" in capsys.readouterr().err


@pytest.mark.parametrize("fmt,needle", [("text", "hierarchy weight_net -> classifier"),
                                        ("dot", 'digraph "data_reweighting"'),
                                        ("mermaid", "flowchart TB"), ("json", '"hierarchy"')])
def test_graph_formats(fmt, needle, capsys):
    assert main(["graph", MWN, "--format", fmt]) == 0
    assert needle in capsys.readouterr().out


def test_graph_output_files(tmp_path, capsys):
    for suffix, needle in ((".dot", "digraph"), (".mmd", "flowchart"), (".json", '"program"')):
        target = tmp_path / f"g{suffix}"
        assert main(["graph", MWN, "-o", str(target)]) == 0
        assert needle in target.read_text()
    assert main(["graph", MWN, "-o", str(tmp_path / "g.xyz")]) == 2


def test_graph_image_without_graphviz_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert main(["graph", MWN, "-o", str(tmp_path / "g.png")]) == 2
    err = capsys.readouterr().err
    assert "Graphviz" in err and "apt-get install graphviz" in err
    assert not (tmp_path / "g.png").exists()


@pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="Graphviz is not installed")
def test_graph_image_with_graphviz(tmp_path):
    target = tmp_path / "g.svg"
    assert main(["graph", MWN, "-o", str(target)]) == 0
    assert "<svg" in target.read_text()


def test_graph_of_a_bad_program_exits_1(tmp_path, capsys):
    f = tmp_path / "bad.mlo"
    f.write_text(BAD)
    assert main(["graph", str(f)]) == 1
    assert capsys.readouterr().out == ""


def test_every_command_has_help_with_an_example():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        text = p.format_help()
        assert p.description and "example" in text, name
    assert "mloc check" in parser.format_help()


def test_print_after_and_time_passes(capsys):
    assert main(["check", MWN, "--print-after", "parse", "--color", "never"]) == 0
    assert capsys.readouterr().out.startswith("Module @1:1")
    assert main(["check", MWN, "--print-after", "dataflow", "--time-passes", "--color", "never"]) == 0
    cap = capsys.readouterr()
    assert "dataflow  classifier -> weight_net" in cap.out
    assert all(p.name in cap.err for p in CHECKS)


def test_check_stops_before_trace_so_it_cannot_print_after_plan(capsys):
    with pytest.raises(SystemExit):
        main(["check", MWN, "--print-after", "plan"])
    assert "invalid choice" in capsys.readouterr().err


def test_compile_prints_after_any_pass_and_times_every_pass(tmp_path, capsys):
    hpo = str(PROGRAMS / "hpo.mlo")
    assert main(["compile", hpo, "-o", str(tmp_path), "--print-after", "plan", "--time-passes", "--color", "never"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("edge ") and "composition order" in cap.out
    assert all(f"  {p.name} " in cap.err for p in PIPELINE)
    assert main(["plan", hpo, "--print-after", "emit", "--color", "never"]) == 0
    assert capsys.readouterr().out.startswith('"""weight_decay_hpo: generated by mloc')


def test_explain_and_codes(capsys):
    assert main(["explain", "e305"]) == 0
    assert "out-of-range" in capsys.readouterr().out
    assert main(["explain", "E999"]) == 2
    assert main(["codes"]) == 0
    assert "E203" in capsys.readouterr().out


def test_check_does_not_import_torch_or_user_code():
    code = ("import sys\nfrom mloc.cli import main\n"
            f"rc = main(['check', {str(PROGRAMS / 'data_reweighting.mlo')!r}, {str(PROGRAMS / 'maml.mlo')!r}])\n"
            "assert rc == 0, rc\n"
            "leaked = [m for m in ('torch', 'reweighting', 'sinusoid', 'synthetic') if m in sys.modules]\n"
            "assert not leaked, leaked\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_python_dash_m_and_version():
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("mloc ")
    proc = run("check", MWN, "--format", "concise")
    assert proc.returncode == 0


def test_graph_plan_labels_edges_with_the_planner_decisions(capsys):
    assert main(["graph", str(PROGRAMS / "hpo.mlo"), "--plan", "--format", "dot"]) == 0
    out = capsys.readouterr().out
    assert '"decay" -> "model" [label="cg(iters=30, tol=1e-10) ×50, ' in out
    assert main(["graph", str(PROGRAMS / "hpo.mlo"), "--plan"]) == 0
    assert "plan      decay -> model  cg(iters=30, tol=1e-10) ×50" in capsys.readouterr().out
