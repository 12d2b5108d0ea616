"""`mloc check` on a program whose Python module does not parse (E109).

Importing such a module raises `SyntaxError`, so the program cannot start; `mloc check`
(which never imports the module) must fail with the error at the module's own
file:line:col, as Python's parser reports it, not say `ok`. Each case runs the CLI in a
fresh process that also asserts that neither torch nor the user's module was imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROGRAM = """\
program p

import {module} as lib

problem low {{
    module    = lib.Net(width=4)
    data      = lib.loader(batch_size=8)
    loss      = lib.loss(low, batch)
    optimizer = sgd(lr=0.1)
}}
"""

GOOD = """\
import torch


class Net(torch.nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc = torch.nn.Linear(width, 1)


def loader(batch_size=8):
    return [(torch.zeros(batch_size, 4), torch.zeros(batch_size))]


def loss(model, batch):
    return model.fc(batch[0]).square().mean()
"""


def mloc_check(folder, program: str, fmt: str = "json") -> subprocess.CompletedProcess:
    """`mloc check --format FMT PROGRAM` run in `folder`, in a fresh process that fails
    (exit 3) if torch or one of the user's modules got imported."""
    code = textwrap.dedent(f"""\
        import sys
        from mloc.cli import main
        rc = main(['check', '--format', {fmt!r}, {program!r}])
        leaked = [m for m in ('torch', 'lib', 'broken', 'helpers', 'latin') if m in sys.modules]
        if leaked:
            print('imported:', leaked, file=sys.stderr)
            sys.exit(3)
        sys.exit(rc)
        """)
    return subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=120)


def check(folder, module: str, program: str = PROGRAM) -> tuple[int, list[dict], str]:
    """`mloc check` of a program importing `module as lib` (written to `folder`/prog.mlo):
    the exit code, the diagnostics (JSON), stderr."""
    (folder / "prog.mlo").write_text(program.format(module=module), encoding="utf-8")
    proc = mloc_check(folder, "prog.mlo")
    diags = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, diags, proc.stderr


def test_a_module_with_a_syntax_error_fails_the_check_at_its_own_line_and_column(tmp_path):
    broken = GOOD.replace("def loader(batch_size=8):", "def loader(batch_size=8:")
    (tmp_path / "broken.py").write_text(broken, encoding="utf-8")
    rc, diags, err = check(tmp_path, "broken")
    assert rc == 1, err
    assert [(d["code"], d["file"], d["line"], d["col"]) for d in diags] == [("E109", "broken.py", 10, 24)]
    (d,) = diags
    assert "does not parse: invalid syntax" in d["message"] and "`broken`" in d["message"]
    assert d["notes"] == ["imported at prog.mlo:3:1"]
    # the same place as Python's own parser gives
    try:
        compile(broken, "broken.py", "exec")
    except SyntaxError as e:
        assert (e.lineno, e.offset) == (d["line"], d["col"])


def test_the_path_shown_is_the_one_the_program_was_given_by(tmp_path):
    (tmp_path / "progs").mkdir()
    (tmp_path / "progs" / "broken.py").write_text("def f(:\n    pass\n", encoding="utf-8")
    (tmp_path / "progs" / "prog.mlo").write_text(PROGRAM.format(module="broken"), encoding="utf-8")
    proc = mloc_check(tmp_path, "progs/prog.mlo", "concise")
    assert proc.returncode == 1, proc.stderr
    assert "progs/broken.py:1:7: error[E109]: the Python module `broken` does not parse" in proc.stderr


def test_a_syntax_error_in_a_module_that_the_imported_one_imports_is_found(tmp_path):
    """`lib` parses but imports the user's `helpers` at module level, which does not:
    the import of `lib` raises, so the check fails at helpers.py, naming the import chain.
    An import inside a function runs only when called and is not followed."""
    (tmp_path / "lib.py").write_text("import os\nimport helpers\n\n\ndef later():\n    import latin\n\n"
                                     + GOOD, encoding="utf-8")
    (tmp_path / "helpers.py").write_text("x = 1\n\nif x:\n    y = [1, 2\n", encoding="utf-8")
    (tmp_path / "latin.py").write_text("def f(:\n", encoding="utf-8")
    rc, diags, err = check(tmp_path, "lib")
    assert rc == 1, err
    assert [(d["code"], d["file"], d["line"], d["col"]) for d in diags] == [("E109", "helpers.py", 4, 9)]
    assert diags[0]["message"] == "the Python module `helpers` does not parse: '[' was never closed"
    assert diags[0]["notes"] == ["imported at lib.py:2, imported by prog.mlo:3:1"]


def test_a_module_in_a_declared_encoding_parses_and_its_names_are_checked(tmp_path):
    """A `# -*- coding: latin-1 -*-` module is valid Python: no E109, and since its names
    are then known, a misspelt one is E106 (with the syntax error, names are unknown)."""
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nNAME = '\xe9'\n" + GOOD.encode())
    rc, diags, err = check(tmp_path, "latin")
    assert (rc, diags) == (0, []), err
    rc, diags, err = check(tmp_path, "latin", PROGRAM.replace("lib.Net(", "lib.Nett("))
    assert rc == 1, err
    assert [(d["code"], d["message"]) for d in diags] == [("E106", "module `latin` has no attribute `Nett`")]


def test_bytes_that_are_not_utf8_are_where_python_stops(tmp_path):
    (tmp_path / "broken.py").write_bytes(GOOD.encode().replace(b"width=4):", b"width=4):  # \xe9"))
    rc, diags, err = check(tmp_path, "broken")
    assert rc == 1, err
    assert [(d["code"], d["line"]) for d in diags] == [("E109", 5)]
    assert "not valid utf-8" in diags[0]["message"]
