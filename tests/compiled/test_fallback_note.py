"""A step compiled at first that runs eagerly from a later step on is said when it happens
(`compile: from step N: ...`) and recorded in config.json, not only at the run's end."""

from __future__ import annotations

import json
from types import SimpleNamespace

from mloc.runtime.compiled.step import StepReport
from mloc.runtime.run.compiling import CompileWatch


class _Notes:
    def __init__(self):
        self.lines = []

    def note(self, line):
        self.lines.append(line)


def test_a_later_fallback_is_said_once_when_it_happens(tmp_path):
    upper = StepReport("upper", "weights")
    upper.counts.graphs = 1
    reports = {"upper": upper}
    compiling = SimpleNamespace(mode="on", decision=None, reports=reports,
                                ran=lambda: list(reports.values()),
                                report=lambda: [{"step": r.name, "reason": r.reason} for r in reports.values()])
    program = SimpleNamespace(compiling=compiling, dist=SimpleNamespace(is_main=True, world=1))
    (tmp_path / "config.json").write_text(json.dumps({"run": {"steps": 9}, "resumes": []}))
    notes = _Notes()
    watch = CompileWatch(program, tmp_path, 0, 9, notes)
    watch.after(1, 0.1)
    assert notes.lines == [f"compile: {upper.line()}"]
    watch.after(2, 0.1)
    upper.reason = "a tensor's value is read back to Python"
    watch.after(3, 0.1)
    watch.after(4, 0.1)
    assert notes.lines[1:] == ["compile: from step 3: upper step of weights: eager (a tensor's value is read back to Python)"]
    recorded = json.loads((tmp_path / "config.json").read_text())["run"]["compiled"]
    assert recorded == [{"step": "weights", "reason": "a tensor's value is read back to Python"}]
