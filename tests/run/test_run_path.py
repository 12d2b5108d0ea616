"""One run path (issue 24): from `mloc run FILE` down to the first training step, the run
passes through each of mloc's modules once. At the first step the stack holds each module
once; and once the run has started (`mloc.runtime.processes.launch`), no call climbs back into a
module waiting above it, the CLI or the compiler (the run used to go cli/train.py ->
launch -> cli/train.py again, 13 times in all)."""

from __future__ import annotations

import sys

from mloc.cli import main
from mloc.runtime.program import engine
from tests.run.helpers import SMALL

START = "mloc.runtime.processes.launch"      # where both doors start a run (`launch.start`)


def _module(frame) -> str:
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("mloc.") else ""


def _stack(frame) -> list[str]:
    """mloc's modules on the stack below `frame`, outermost first, one per run of frames."""
    names = []
    while frame is not None:
        names.append(_module(frame))
        frame = frame.f_back
    names = [m for m in names[::-1] if m]
    return [m for i, m in enumerate(names) if i == 0 or m != names[i - 1]]


def _walk(monkeypatch, argv) -> tuple[list[str], list[str]]:
    """(the stack at the first outer step, every call on the way there, made below
    `mloc.runtime.processes.launch`, into a module waiting above it)."""
    climbs, at_first_step = [], []
    outer_step = engine.Program.outer_step

    def first_step(self):
        if not at_first_step:
            at_first_step.extend(_stack(sys._getframe()))
            sys.setprofile(None)
        return outer_step(self)

    def watch(frame, event, arg):
        if event == "call" and (callee := _module(frame)):
            caller = _stack(frame.f_back)
            started = caller.index(START) if START in caller else None
            if started is not None and callee in caller[:started]:
                climbs.append(f"{' -> '.join(caller)} -> {callee} ({frame.f_code.co_name})")

    monkeypatch.setattr(engine.Program, "outer_step", first_step)
    sys.setprofile(watch)
    try:
        assert main([str(a) for a in argv]) == 0
    finally:
        sys.setprofile(None)
    return at_first_step, climbs


def test_mloc_run_reaches_the_first_step_visiting_each_module_once(monkeypatch, tmp_path):
    stack, climbs = _walk(monkeypatch, ["run", SMALL, "--steps", 1, "--out", tmp_path / "r", "--quiet",
                                        "--threads", 1])
    assert stack[0] == "mloc.cli" and stack[-1] == "mloc.runtime.run.loop", stack
    assert len(stack) == len(set(stack)), f"a module entered twice on the way down: {stack}"
    assert climbs == [], "calls back up the stack:\n" + "\n".join(dict.fromkeys(climbs))
