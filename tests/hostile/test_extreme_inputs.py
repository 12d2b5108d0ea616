"""Extreme inputs are diagnostics, never exit 101 (issue 23 item 9; docs/reliability.md,
"Extreme inputs"): an integer beyond 64 bits (E006), brackets nested past 64 levels (E007),
a Python module whose parser runs out of stack (E109), a count past mloc's bounds or a seed
past 2**63 - 1 (E305 in the program, exit 1; a usage error on the command line, exit 2).
Each goes through the command where a user meets it; on 7b53c50 each was exit 101, was
accepted (and then overflowed torch or ran for ages), or gave an unhelpful E304."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mloc.cli import main
from tests.run.helpers import ENV, SMALL, mloc

SOURCE = SMALL.read_text(encoding="utf-8")
HUGE = "1" + "0" * 309                        # OverflowError in float() on 7b53c50
LONG = "1" * 4400                             # beyond Python's 4300-digit int() limit
EDGE = "weights->net"


@pytest.fixture
def program(tmp_path):
    """Write small.mlo with `edit` applied (and its module) to tmp_path; return its path."""
    (tmp_path / "small.py").write_text((SMALL.parent / "small.py").read_text(encoding="utf-8"), encoding="utf-8")

    def write(old: str = "", new: str = "") -> str:
        assert old in SOURCE
        path = tmp_path / "small.mlo"
        path.write_text(SOURCE.replace(old, new, 1), encoding="utf-8")
        return str(path)
    return write


def _check(path: str, capsys) -> tuple[int, str]:
    code = main(["check", path, "--color", "never"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("old, new, code, message", [
    ("steps = 30", f"steps = {HUGE}", "E006", "the integer 100000000000...000000 (310 digits) does not fit in 64 bits"),
    ("steps = 30", f"steps = {LONG}", "E006", "(4400 digits) does not fit in 64 bits"),
    ("seed = 0", "seed = 99999999999999999999999", "E006", "the integer 99999999999999999999999 does not fit"),
    ("seed = 0", f"seed = {2**63}", "E305", "`seed` must be at most 9223372036854775807, got 9223372036854775808"),
    ("steps = 30", "steps = 10000000000", "E305", "`steps` must be at most 1000000000, got 10000000000"),
    ("unroll = 2", "unroll = 10000000", "E305", "`unroll` must be at most 1000000, got 10000000"),
    ("iters=3", "iters=1e20", "E305", "`iters` of `neumann` must be at most 1000000, got 1e20"),
    ("device = cpu", 'device = cpu\n    memory_budget = "' + "9" * 400 + 'GB"', "E305",
     "`memory_budget` must be at most 2**64 bytes"),
], ids=["steps_1e309", "steps_4400_digits", "seed_beyond_64_bits", "seed_2_63", "steps_1e10", "unroll_1e7",
        "iters_1e20", "memory_budget_400_digits"])
def test_an_extreme_number_in_the_file_is_a_diagnostic(program, capsys, old, new, code, message):
    status, err = _check(program(old, new), capsys)
    assert status == 1, err
    assert f"error[{code}]: " in err and message in err, err


@pytest.mark.parametrize("depth, opener, closer", [(250, "lib.f(", ")"), (500, "[", "]")],
                         ids=["250_nested_calls", "500_nested_lists"])
def test_deep_nesting_is_a_diagnostic_at_level_65(program, capsys, depth, opener, closer):
    status, err = _check(program("lib.Net(width=8)", f"lib.Net(width={opener * depth}8{closer * depth})"), capsys)
    assert status == 1, err
    assert "error[E007]: brackets are nested more than 64 deep here" in err and "level 65" in err, err


def test_nesting_up_to_the_limit_is_read(program, capsys):
    """The block and the call are 2 levels; 62 lists more make 64, which is allowed."""
    status, err = _check(program("lib.Net(width=8)", f"lib.Net(width={'[' * 62}8{']' * 62})"), capsys)
    assert "E007" not in err, err


def test_a_module_the_python_parser_cannot_hold_is_e109(program, tmp_path, capsys):
    """200 000 terms `1+1+...`: Python's parser raises RecursionError, not SyntaxError."""
    path = program()
    with open(tmp_path / "small.py", "a", encoding="utf-8") as f:
        f.write("\nX = " + "+".join(["1"] * 200_000) + "\n")
    status, err = _check(path, capsys)
    assert status == 1, err
    assert "error[E109]: the Python module `small` does not parse: Python's parser cannot hold it" in err, err
    assert "RecursionError" in err and "Python gives up on this module" in err, err


@pytest.mark.parametrize("value, message", [
    (HUGE, "error[E006]: the integer 100000000000...000000 (310 digits) does not fit in 64 bits"),
    (LONG, "error[E006]: the integer 111111111111...111111 (4400 digits) does not fit in 64 bits"),
], ids=["steps_1e309", "steps_4400_digits"])
def test_an_extreme_number_through_set_is_a_diagnostic_at_the_set(program, tmp_path, capsys, value, message):
    out = tmp_path / "run"
    status = main(["run", program(), "--out", str(out), "--color", "never", "--set", f"train.steps={value}"])
    err = capsys.readouterr().err
    assert status == 1, err
    assert message in err and "--> --set:1:20" in err, err
    assert not out.exists()


@pytest.mark.parametrize("value", ["1e20", "100000000000000000000", "10000000"])
def test_an_unroll_past_the_bound_through_set_says_the_bound(program, tmp_path, capsys, value):
    """`--set 'a->b.unroll=1e20'` was E304 with the help `write a whole number, e.g.
    100000000000000000000`, and that (or 10**7) was accepted and never ended."""
    status = main(["compile", program(), "-o", str(tmp_path / "build"), "--color", "never",
                   "--set", f"{EDGE}.unroll={value}"])
    err = capsys.readouterr().err
    assert status == 1, err
    if value == "100000000000000000000":           # beyond 64 bits: the literal itself
        assert "error[E006]" in err, err
    else:
        assert f"error[E305]: `unroll` must be at most 1000000, got {value}" in err, err
        assert "mloc's bound on a count repeated in every outer step" in err, err


@pytest.mark.parametrize("argv, message", [
    (["run", "--steps", "2", "--seed", "99999999999999999999999"],
     "error: --seed must be at most 9223372036854775807, got 99999999999999999999999"),
    (["run", "--steps", "2", "--seed", "-1"], "error: --seed must be at least 0, got -1"),
    (["hypergrad", "--seed", str(2**64)], f"error: --seed must be at most 9223372036854775807, got {2**64}"),
], ids=["run_seed_1e23", "run_seed_negative", "hypergrad_seed_2_64"])
def test_a_seed_past_its_bound_is_a_usage_error(program, tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    status = main([argv[0], program(), *argv[1:], *(["--out", str(out)] if argv[0] == "run" else [])])
    err = capsys.readouterr().err
    assert status == 2, err
    assert message in err, err
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["run", "--steps", str(10**13)], f"error: --steps must be at most 1000000000, got {10**13}"),
    (["hypergrad", "--after", str(10**12)], f"error: --after must be at most 1000000000, got {10**12}"),
], ids=["run_steps_1e13", "hypergrad_after_1e12"])
def test_a_step_count_past_its_bound_is_a_usage_error(program, tmp_path, argv, message):
    """In a child process with a time limit: on 7b53c50 each was accepted and trained for ages."""
    out = tmp_path / "run"
    r = mloc(argv[0], program(), *argv[1:], *(["--out", str(out)] if argv[0] == "run" else []), timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not out.exists()


def test_train_py_refuses_a_seed_past_the_bound(program, tmp_path, capsys):
    """`python train.py --seed ...` obeys the bound `mloc run` does (was 101: torch.manual_seed)."""
    build = tmp_path / "build"
    assert main(["compile", program(), "-o", str(build)]) == 0, capsys.readouterr().err
    r = subprocess.run([sys.executable, str(build / "train.py"), "--seed", "99999999999999999999999",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path, env=ENV,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "error: --seed must be at most 9223372036854775807, got 99999999999999999999999" in r.stderr
    assert not (tmp_path / "run").exists()
