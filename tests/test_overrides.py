"""`--set` overrides: applied together and checked once (any order gives the same program),
one argument of a call merged into the file's call, recorded in train.py's header and on
the compiled unit, and bad overrides reported with which `--set`, what and how to fix."""

from __future__ import annotations

import ast as pyast
import shlex
from pathlib import Path

import pytest

from mloc.cli import main
from mloc.codegen.compile import compile_program, load_generated
from mloc.codegen.emit import _overrides_doc
from mloc.codegen.overrides import OverrideError, apply_all
from mloc.source import SourceFile
from tests.conftest import PROGRAMS, ROOT

MAML, MWN, HPO = (str(PROGRAMS / f"{n}.mlo") for n in ("maml", "data_reweighting", "hpo"))
OUT = ROOT / "build" / "overrides"


def compiled(path: str, *sets: str):
    return compile_program(path, sets, out_dir=OUT)


def optimizer(c, problem: str):
    node = next(p for p in c.unit.graph.problems() if p.name == problem)
    return node.optimizer.name, dict(node.optimizer.args)


def edge(c, upper: str, lower: str):
    return next(e for e in c.plan.edges if (e.upper, e.lower) == (upper, lower))


# --- applied together ----------------------------------------------------------------------

UNROLL_60 = ("meta->adapt.hypergrad=itd(steps=60)", "meta->adapt.unroll=60")


@pytest.mark.parametrize("sets", [UNROLL_60, UNROLL_60[::-1]], ids=["hypergrad-first", "unroll-first"])
def test_two_overrides_valid_only_together_work_in_either_order(sets):
    """The file says itd(steps=5), unroll=5: each override alone is an error (E402), so a
    check of the intermediate state fails one of the two orders."""
    c = compiled(MAML, *sets)
    assert c.ok, [d.message for d in c.diagnostics]
    e = edge(c, "meta", "adapt")
    assert e.unroll == 60 and dict(e.args)["steps"] == 60


def test_the_order_of_the_overrides_does_not_change_a_byte():
    sets = ("classifier.optimizer.lr=0.05", "train.steps=7", "weight_net->classifier.unroll=2",
            "weight_net.optimizer=adam(lr=1e-3)")
    assert compiled(MWN, *sets).source == compiled(MWN, *reversed(sets)).source


def test_an_override_can_fix_an_error_in_the_file(tmp_path):
    bad = tmp_path / "hpo.mlo"
    bad.write_text((PROGRAMS / "hpo.mlo").read_text().replace("unroll = 50", "unroll = 0"))
    (tmp_path / "penalties.py").write_text((PROGRAMS / "penalties.py").read_text())
    assert [d.code for d in compile_program(str(bad), out_dir=tmp_path).diagnostics] == ["E305"]
    fixed = compile_program(str(bad), ("decay->model.unroll=3",), out_dir=tmp_path)
    assert fixed.ok and edge(fixed, "decay", "model").unroll == 3


# --- one argument of a call ------------------------------------------------------------------

def test_one_argument_merges_into_the_files_call():
    """sgd(lr=0.02, momentum=0.9, weight_decay=5e-4) keeps momentum and weight decay."""
    _, before = optimizer(compiled(MWN), "classifier")
    name, args = optimizer(compiled(MWN, "classifier.optimizer.lr=0.05"), "classifier")
    assert name == "sgd" and args == {**before, "lr": 0.05}
    assert args["momentum"] == 0.9 and args["weight_decay"] == 5e-4


def test_an_argument_the_call_lacks_is_added():
    name, args = optimizer(compiled(MAML, "adapt.optimizer.momentum=0.5"), "adapt")
    assert name == "sgd" and args["lr"] == 0.01 and args["momentum"] == 0.5


@pytest.mark.parametrize("reverse", [False, True])
def test_a_replaced_call_then_one_of_its_arguments_in_either_order(reverse):
    sets = ["classifier.optimizer=adam(lr=1e-3, eps=1e-6)", "classifier.optimizer.lr=0.05"]
    name, args = optimizer(compiled(MWN, *(sets[::-1] if reverse else sets)), "classifier")
    assert name == "adam" and args["lr"] == 0.05 and args["eps"] == 1e-6


def test_method_arguments_and_user_calls_merge_too():
    c = compiled(MAML, "meta->adapt.hypergrad.steps=3", "meta->adapt.unroll=3", "adapt.module.hidden=8",
                 "meta.module.hidden=8")
    assert c.ok and dict(edge(c, "meta", "adapt").args) == {**dict(edge(compiled(MAML), "meta", "adapt").args),
                                                            "steps": 3}
    assert "tasks.SineNet(hidden=8)" in c.source


SMALL = """program p
problem a { module = lib.M(3, 4, width=2), optimizer = sgd(lr=0.1) }
a -> b
b -> c { hypergrad = neumann }
"""


@pytest.mark.parametrize("override, expect", [
    ("a.module.1=5", "lib.M(3, 5, width=2)"),
    ("a.module.depth=2", "lib.M(3, 4, width=2, depth=2)"),
    ("b->c.hypergrad.alpha=0.1", "hypergrad = neumann(alpha=0.1)"),
    ("a->b.unroll=4", "a -> b { unroll = 4 }"),
    ("a.init=b", "optimizer = sgd(lr=0.1), init = b }"),       # after a comma, as the file writes it
    ("b->c.unroll=2", "hypergrad = neumann, unroll = 2 }"),
    ("semantics=per_edge", "\nsemantics = per_edge\n"),
    ("train.steps=3", "\ntrain { steps = 3 }\n"),
])
def test_splices_on_the_text(override, expect):
    assert expect in apply_all(SourceFile("p.mlo", SMALL), (override,)).source.text


# --- recorded ----------------------------------------------------------------------------------

def test_overrides_are_recorded_in_the_header_and_on_the_compiled_unit(tmp_path):
    sets = ("classifier.optimizer.lr=0.05", "weight_net->classifier.hypergrad=neumann(iters=3, alpha=0.1)")
    c = compiled(MWN, *sets)
    assert c.ok and c.overrides == sets[::-1]      # fields, then arguments of calls
    doc = pyast.get_docstring(pyast.parse(c.source))
    assert "--set classifier.optimizer.lr=0.05" in doc
    assert "--set 'weight_net->classifier.hypergrad=neumann(iters=3, alpha=0.1)'" in doc
    assert load_generated(c.source, str(tmp_path / "train.py")).overrides == c.overrides
    assert load_generated(compiled(MWN).source, str(tmp_path / "plain.py")).overrides == ()


def test_mloc_compile_writes_the_overrides_into_train_py(tmp_path, capsys):
    assert main(["compile", HPO, "-o", str(tmp_path), "--set", "decay->model.unroll=5"]) == 0
    declaration = load_generated((tmp_path / "train.py").read_text(), str(tmp_path / "train.py"))
    assert declaration.overrides == ("decay->model.unroll=5",)


@pytest.mark.parametrize("text", ["a.data=lib.d(s='\"\"\"')", "a.data=lib.d(s='\\\\n\\'')", "a.b=x\ny\r"])
def test_any_override_text_is_safe_in_the_docstring(text):
    """Triple quotes, backslashes and line breaks: the module parses, and its docstring
    holds the `--set` exactly as a shell would take it back."""
    module = pyast.parse('"""x\n' + "\n".join(_overrides_doc("p.mlo", (text,))) + '\n"""\nOVERRIDES = 1\n')
    assert "    --set " + shlex.quote(text) in module.body[0].value.value


# --- bad overrides ------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message, help", [
    ("classifier.optimzer=adam(lr=1e-3)", "problem `classifier` has no field `optimzer`", "did you mean `optimizer`?"),
    ("clasifier.optimizer.lr=0.1", "no problem, edge or setting `clasifier`", "did you mean `classifier`?"),
    ("classifier->weight_net.unroll=2", "no edge classifier -> weight_net", "weight_net->classifier"),
    ("train.stepz=5", "the train block has no field `stepz`", "did you mean `steps`?"),
    ("semantic=exact", "no setting `semantic`", "did you mean `semantics`?"),
    ("weight_net.schedule.total=10", "does not set `schedule`", "set the whole value"),
    ("weight_net->classifier.unroll.x=1", "is `1`, not a call", "--set 'weight_net->classifier.unroll=VALUE'"),
    ("classifier.optimizer.lr", "cannot read --set", "PATH=VALUE"),
    ("classifier.optimizer.lr=", "gives no value", "PATH=VALUE"),
    ("classifier=1", "names problem `classifier` but none of its fields", "classifier.FIELD=VALUE"),
])
def test_bad_overrides_say_which_set_what_and_how(override, message, help):
    with pytest.raises(OverrideError) as err:
        compiled(MWN, override)
    assert message in err.value.message and help in err.value.help
    if "=" in override and not override.endswith("="):
        assert f"--set '{override}'" in err.value.message


def test_a_field_set_twice_is_an_error():
    with pytest.raises(OverrideError, match="both set `train.steps`"):
        compiled(MWN, "train.steps=5", "train.steps=6")


def test_a_bad_value_is_a_diagnostic_at_its_set():
    c = compiled(MWN, "classifier.optimizer.momentun=0.5")
    [d] = c.diagnostics
    assert d.code == "E303" and d.help == "did you mean `momentum`?"
    assert d.span.source.path == "--set" and d.span.source.text == "--set 'classifier.optimizer.momentun=0.5'"
    assert d.span.text == "momentun"
    assert d.notes == (f"`classifier.optimizer.momentun` in {MWN}, as set for this command",)


def test_a_bad_value_for_a_field_the_file_lacks_is_rendered_at_the_set_not_at_a_line_it_lacks(tmp_path, capsys):
    """`train.steps=-100` on a file without a train block: the spliced `train { ... }` is on
    no line of the file, so the error shows the `--set` itself."""
    text = Path(HPO).read_text()
    path = tmp_path / "no_train.mlo"
    path.write_text(text[:text.index("train {")])
    for name in ("penalties.py",):
        (tmp_path / name).write_text((PROGRAMS / name).read_text())
    assert main(["plan", str(path), "--color", "never", "--set", "train.steps=-100"]) == 1
    err = capsys.readouterr().err
    assert "error[E305]: `steps` must be at least 1, got -100\n --> --set:1:20\n" in err
    assert "1 | --set 'train.steps=-100'\n  |                    ^^^^ must be at least 1" in err
    assert "train {" not in err


def test_a_field_a_set_adds_is_reported_at_the_set_not_at_an_invented_line(capsys):
    """`warmup` added to maml's edge (E217: `adapt` restarts from `init` every step): the
    error shows the `--set` with the README's note, never line 23 as the splice left it."""
    assert main(["plan", MAML, "--color", "never", "--set", "meta->adapt.warmup=10"]) == 1
    err = capsys.readouterr().err
    assert "error[E217]: `warmup` cannot apply to `meta -> adapt`" in err
    assert " --> --set:1:20\n" in err and "1 | --set 'meta->adapt.warmup=10'\n  |                    ^^^^^^\n" in err
    assert f"= note: `meta->adapt.warmup` in {MAML}, as set for this command" in err
    assert "maml.mlo:23" not in err and "warmup = 10 }" not in err


def test_an_error_on_a_line_a_set_changed_shows_the_files_line_and_names_the_set():
    """E217 at the file's own `warmup`, on a line whose `hypergrad` a --set replaced: the
    line, column and text are the file's, and a note names the --set."""
    path = ROOT / "tests" / "diagnostics" / "E217_warmup_undone_by_reinit.mlo"
    [d] = compiled(str(path), "high->low.hypergrad=neumann(iters=3, alpha=0.1)").diagnostics
    assert d.code == "E217" and d.span.source.text == path.read_text()
    assert (d.span.line, d.span.col, d.span.text) == (21, 31, "warmup")
    assert d.notes == ("this line is changed by --set 'high->low.hypergrad=neumann(iters=3, alpha=0.1)', "
                       "as set for this command",)


def test_a_torch_class_name_in_a_set_gets_did_you_mean_at_the_set(capsys):
    assert main(["plan", HPO, "--color", "never", "--set", "model.optimizer=SGD(lr=0.1)"]) == 1
    err = capsys.readouterr().err
    assert " --> --set:1:24" in err and "did you mean `sgd`?" in err


def test_the_cli_reports_a_missing_field_as_a_usage_error(capsys):
    assert main(["plan", MWN, "--color", "never", "--set", "classifier.optimzer=adam(lr=1e-3)"]) == 2
    err = capsys.readouterr().err
    assert "error: --set 'classifier.optimzer=adam(lr=1e-3)': problem `classifier` has no field `optimzer`" in err
    assert "= help: did you mean `optimizer`?" in err
