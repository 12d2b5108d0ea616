"""The plan verifier (mloc/passes/verify_plan.py), JAX-style: every example's plan passes,
and a plan corrupted on purpose, one invariant at a time, is caught with a message that
says what broke. A broken plan stops the compile as a bug in mloc (exit 101)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mloc.passes.pipeline import compile_source
from mloc.passes.plan import plan_program
from mloc.passes.schedule import Action, Loop
from mloc.passes.verify_plan import LIMIT, verify_plan
from mloc.source import SourceFile
from tests.conftest import ROOT

PROGRAMS = ROOT / "programs"
EXAMPLES = sorted(p.name for p in PROGRAMS.glob("*.mlo"))


def planned(path):
    unit = compile_source(SourceFile.read(str(path)))
    assert unit.ok, [d.message for d in unit.diagnostics]
    return plan_program(unit.graph), unit.graph


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_plan_verifies(name):
    plan, g = planned(PROGRAMS / name)
    assert verify_plan(plan, g) == []


def _edge(plan, **changes):
    return replace(plan, edges=(replace(plan.edges[0], **changes), *plan.edges[1:]))


def _composition(plan, which, **changes):
    return replace(plan, compositions={**plan.compositions, which: replace(plan.compositions[which], **changes)})


def _schedule(plan, body):
    return replace(plan, schedule=Loop(plan.schedule.repeat, body))


TRILEVEL = {  # strength -> weight_net -> classifier, `exact`
    "problems reordered": (lambda p: replace(p, problems=p.problems[::-1]), "the plan's problems"),
    "an edge dropped": (lambda p: replace(p, edges=p.edges[1:]), "is planned 0 time(s) and declared 1"),
    "an edge twice": (lambda p: replace(p, edges=p.edges + p.edges[:1]), "is planned 2 time(s)"),
    "auto left": (lambda p: _edge(p, method="auto"), "`auto`, which the runtime does not execute"),
    "no such method": (lambda p: _edge(p, method="magic"), "`magic`, which the runtime does not execute"),
    "order reversed": (lambda p: replace(p, order=p.order[::-1]), "puts `weight_net` before its lower"),
    "order short": (lambda p: replace(p, order=p.order[1:]), "is not every problem once"),
    "a composition missing": (lambda p: replace(p, compositions={"strength": p.compositions["strength"]}),
                              "compositions are planned for ['strength']"),
    "top renamed": (lambda p: _composition(p, "strength", top="weight_net"), "names `weight_net` as its top"),
    "down short": (lambda p: _composition(p, "strength", down=("weight_net",)), "is not the problems below it"),
    "down twice": (lambda p: _composition(p, "strength", down=("weight_net", "classifier", "classifier")),
                   "is not the problems below it"),
    "down upside down": (lambda p: _composition(p, "strength", down=("classifier", "weight_net")),
                         "puts `classifier` before its upper `weight_net`"),
    "a step out of scope": (lambda p: _composition(p, "weight_net", up=(("classifier", ("strength",), True),)),
                            "the step of `classifier` (to ['strength']) leaves the problems below it"),
    "steps out of order": (lambda p: _composition(p, "strength", up=p.compositions["strength"].up[::-1]),
                           "whose step comes before it"),
    "a step twice": (lambda p: _composition(p, "strength", up=p.compositions["strength"].up * 2),
                     "`up` steps a problem twice"),
    "a seed not read": (lambda p: _composition(p, "weight_net", seeds=("strength",)),
                        "are not problems its loss reads, at or below it"),
    "nested under per_edge": (lambda p: replace(p, runtime_semantics="per_edge"),
                              "nested passes under `per_edge` semantics"),
    "nested out of scope": (lambda p: _composition(p, "strength", nested=(("strength", (), ()),)),
                            "the nested pass of `strength` leaves the problems below it"),
    "another shape": (lambda p: _composition(p, "weight_net", shape="single"),
                      "the composition of `weight_net` is not what compose() gives"),
    "live seeds flipped": (lambda p: _composition(p, "strength", live_seeds=False),
                           "the composition of `strength` is not what compose() gives"),
    "periods changed": (lambda p: replace(p, periods={**p.periods, "classifier": 2}), "the periods"),
    "an action dropped": (lambda p: _schedule(p, p.schedule.body[:-1]), "steps `strength` 0 time(s)"),
    "an action twice": (lambda p: _schedule(p, p.schedule.body + p.schedule.body[-1:]),
                        "steps `strength` 2 time(s) per outer step, not 1"),
    "an unknown problem": (lambda p: _schedule(p, p.schedule.body + (Action("lower_step", "ghost"),)),
                           "names `ghost`, which is not a problem"),
}


@pytest.mark.parametrize("case", TRILEVEL)
def test_a_corrupted_plan_is_caught(case):
    plan, g = planned(PROGRAMS / "trilevel.mlo")
    corrupt, message = TRILEVEL[case]
    found = verify_plan(corrupt(plan), g)
    assert found and any(message in f for f in found), found


def test_an_unresolved_itd_mode_is_caught():
    plan, g = planned(PROGRAMS / "maml.mlo")
    broken = _edge(plan, args=tuple((k, "auto" if k == "mode" else v) for k, v in plan.edges[0].args))
    assert "edge meta -> adapt keeps `mode = auto`: the planner did not choose a mode" in verify_plan(broken, g)


def test_a_method_the_lower_optimizer_cannot_serve_is_caught():
    plan, g = planned(ROOT / "tests" / "torch_optim" / "quad.mlo")     # torch.optim: no sama diagonal
    assert verify_plan(plan, g) == []
    found = verify_plan(_edge(plan, method="sama"), g)
    assert any("`sama` needs ['sama_diag'] of the lower's optimizer" in f for f in found), found


def test_a_meta_batch_with_too_few_micro_steps_is_caught():
    plan, g = planned(PROGRAMS / "imaml.mlo")               # accumulate = 4
    assert verify_plan(plan, g) == []

    def fewer(loop):
        body = tuple(fewer(i) if isinstance(i, Loop) else i for i in loop.body)
        return replace(loop, body=body, repeat=3 if loop.repeat == 4 else loop.repeat)
    found = verify_plan(replace(plan, schedule=fewer(plan.schedule)), g)
    assert any("micro-step(s) of `meta` per outer step, not 4" in f or "steps `adapt`" in f for f in found), found


def test_a_chain_step_dropped_is_caught():
    plan, g = planned(PROGRAMS / "interlock.mlo")
    assert verify_plan(plan, g) == []
    found = verify_plan(_schedule(plan, ()), g)
    assert {f.split("`")[1] for f in found} == {"stage1", "stage2", "stage3"}, found


def test_messages_are_bounded():
    plan, g = planned(PROGRAMS / "trilevel.mlo")
    ghosts = tuple(Action("lower_step", f"ghost{i}") for i in range(2 * LIMIT))
    assert len(verify_plan(_schedule(plan, plan.schedule.body + ghosts), g)) == LIMIT


def test_a_broken_plan_stops_the_compile_as_an_internal_error(monkeypatch, capsys):
    import mloc.passes.pipeline as pipeline
    from mloc.cli import main

    real = pipeline.plan_program
    monkeypatch.setattr(pipeline, "plan_program", lambda g, sizes, *a: replace(real(g, sizes, *a), order=()))
    assert main(["plan", str(PROGRAMS / "trilevel.mlo")]) == 101
    err = capsys.readouterr().err
    assert "after pass `plan`" in err and "the composition order [] is not every problem once" in err
