"""The diagnostics around a program, at the command line: `mloc explain` has a paragraph
and an example for every code, the commands that any help text names exist, and
`mloc check` over a shell glob skips what is not a program."""

from __future__ import annotations

import argparse
import re

import pytest

from mloc.cli import EXIT_OK, EXIT_USAGE, build_parser, main
from mloc.diagnostics import CODES
from mloc.diagnostics.explain import EXPLANATIONS, explain
from tests.conftest import ROOT


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_has_a_paragraph_and_an_example(code, capsys):
    e = EXPLANATIONS.get(code)
    assert e is not None, f"{code} has no explanation in mloc/diagnostics/explain.py"
    assert len(e.text.split()) >= 10 and e.wrong.strip()
    assert main(["explain", code.lower()]) == EXIT_OK
    printed = capsys.readouterr().out
    assert printed.startswith(f"{code} ({CODES[code].name}, {CODES[code].severity})")
    assert e.wrong.splitlines()[0] in printed and "example" in printed
    assert printed == explain(code) + "\n"


def test_explain_of_an_unknown_code_is_a_usage_error_naming_the_right_command(capsys):
    assert main(["explain", "E999"]) == EXIT_USAGE
    assert "`mloc codes` lists them" in capsys.readouterr().err


def _texts_naming_commands() -> list[tuple[str, str]]:
    """(where, text) for every help text of the parser and its subcommands, every
    explanation, and the string literals of the CLI's modules (usage errors' hints)."""
    parser = build_parser()
    out = [("mloc --help", parser.format_help())]
    out += [(f"mloc {name} --help", p.format_help()) for name, p in _subcommands(parser).items()]
    out += [(f"explain {c}", f"{e.text}\n{e.wrong}\n{e.right}") for c, e in EXPLANATIONS.items()]
    for path in sorted((ROOT / "mloc" / "cli").glob("*.py")) + sorted((ROOT / "mloc" / "diagnostics").glob("*.py")):
        out.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    return out


# `mloc X` in backticks, or starting an example line (also as `\n  mloc X` in source text)
_COMMAND = re.compile(r"(?:`|^[ \t]+|\\n[ \t]*)mloc ([a-z][a-z-]*)\b", re.M)


def test_every_mloc_command_named_in_help_texts_exists():
    commands = set(_subcommands(build_parser()))
    named = [(where, m.group(1)) for where, text in _texts_naming_commands()
             for m in _COMMAND.finditer(text)]
    assert len(named) > 20, "the help texts name commands; the pattern finds none"
    missing = sorted({(where, cmd) for where, cmd in named if cmd not in commands})
    assert missing == [], f"help texts name commands that do not exist: {missing}"


def test_check_over_a_glob_skips_non_programs_with_one_note(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "programs").iterdir() if p.suffix in {".mlo", ".py"})
    assert any(f.endswith(".py") for f in files)
    status = main(["check", "--color", "never", *files])
    err = capsys.readouterr().err
    assert err.count("note: skipped") == 1
    assert f"skipped {sum(f.endswith('.py') for f in files)} files that do not end in .mlo" in err
    assert not any(line.startswith("error") for line in err.splitlines())
    assert all(f"{f}: ok" in err for f in files if f.endswith(".mlo"))
    assert status == EXIT_OK
    assert main(["check", "--color", "never", "programs/reweighting.py", "programs/hpo.py"]) == EXIT_USAGE
    assert "none of the files given ends in .mlo" in capsys.readouterr().err


def test_the_diagnostics_doc_names_only_existing_cases_and_codes():
    doc = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    cases = re.findall(r"`([EW]\d{3}_\w+\.mlo)`", doc)
    assert len(cases) >= 5 and all((ROOT / "tests" / "diagnostics" / c).is_file() for c in cases), cases
    codes = set(re.findall(r"\b([EW]\d{3})\b", doc))
    assert codes <= set(CODES), codes - set(CODES)
    commands = set(_subcommands(build_parser()))
    assert {m.group(1) for m in _COMMAND.finditer(doc)} <= commands


def test_every_code_belongs_to_a_group_reported_by_passes_that_exist():
    """codes.py's groups name the pipeline's passes (or `run`), and cover every code."""
    from mloc.codegen.compile import PASSES
    from mloc.diagnostics.codes import CODES, GROUPS
    for prefix, _, passes in GROUPS:
        assert set(passes) <= {*PASSES, "run"}, (prefix, sorted(set(passes) - {*PASSES, "run"}))
    assert all(any(code.startswith(g[0]) for g in GROUPS) for code in CODES)
