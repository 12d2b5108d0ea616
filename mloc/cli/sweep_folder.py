"""A sweep's folder: what the sweep is (``OUT/sweep.json``), and what a rerun does with
each of its points. No torch here.

**What it is.** ``OUT/sweep.json`` is written when the sweep starts, with its
:data:`DEFINITION`: the program's path, the ``--set`` axes as given, the seeds and
``--steps``, and ``search`` (null for a grid; else ``--search``, ``--trials``,
``--search-seed`` and Optuna's objective and pruning); and ``"status": "running"``. It is rewritten when the sweep ends, with the
table's data and ``"status"`` ``finished`` (every run finished), ``failed`` (one did not)
or ``interrupted`` (Ctrl-C or SIGTERM).

**A rerun.** ``mloc sweep`` with ``--out`` naming a folder that holds a sweep of the same
definition continues it (so does ``--resume``, which also takes the definition's omitted
parts from the record and, without ``--out``, picks the latest ``runs/PROGRAM/sweepN``); a
folder holding another sweep, or anything but a sweep, is refused (exit 2). Each point's run
folder then decides (:func:`next_step`): a run that finished (``summary.json`` status
``finished`` or ``stopped_early``) is skipped and tabulated as it is; one that stopped with a
checkpoint (interrupted, or killed with the sweep) continues from it (``mloc run --resume``,
which keeps its ``--set``, seed and steps); one that failed, or left no checkpoint, starts
again (``--overwrite``: a failure is not resumed from the state that failed).

**One sweep at a time.** The sweep holds its folder's lock (``OUT/.lock``,
:func:`mloc.runtime.files.runfolder.held`) while it runs: a second sweep in the same folder is
refused naming the first, and none is ever left holding it, however the sweep ended.
"""

from __future__ import annotations

import json
from pathlib import Path

from mloc.cli.output import UsageError, io_error

RECORD = "sweep.json"
DEFINITION = ("file", "set", "seeds", "steps")      # what a rerun must share to continue a sweep
OPTIONAL = ("search",)          # ... and this, absent (a grid) from the records of before --search
DONE = ("finished", "stopped_early")                # a run's summary.json statuses that need nothing more


def read_record(root: Path) -> dict | None:
    """``root/sweep.json``, or None when there is none (or it is not a sweep's record)."""
    try:
        data = json.loads((Path(root) / RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        raise UsageError(f"cannot read {Path(root) / RECORD}: not a sweep's record",
                         help="choose another --out") from None
    return data if isinstance(data, dict) and all(k in data for k in DEFINITION) else None


def latest(base: Path) -> Path | None:
    """The ``base/sweepN`` with the largest N that holds a sweep's record."""
    found = [p for p in Path(base).glob("sweep*") if p.name[5:].isdigit() and (p / RECORD).is_file()]
    return max(found, key=lambda p: int(p.name[5:]), default=None)


def admit(root: Path, definition: dict, resume: bool) -> dict:
    """Check that ``root`` may take the sweep ``definition`` (module docstring) and return
    the definition to run: ``definition`` itself, with, under ``resume``, its None fields
    taken from the record. A :class:`UsageError` (exit 2) says why not."""
    record = read_record(root) if root.is_dir() else None
    if record is None:
        if resume:
            raise UsageError(f"{root} holds no sweep to resume (no {RECORD})",
                             help="start it without --resume; --out names the sweep's folder")
        if root.is_dir() and any(p.name != ".lock" for p in root.iterdir()):
            raise UsageError(f"{root} is not empty and holds no sweep; a sweep writes into a fresh folder",
                             help="choose another --out")
        return definition
    if resume:
        definition = {k: record.get(k) if definition.get(k) is None else definition[k] for k in DEFINITION + OPTIONAL}
    differ = [k for k in DEFINITION + OPTIONAL if definition.get(k) != record.get(k)]
    if differ:
        what = "; ".join(f"{_flag(k)}: {_flag_value(k, record.get(k))} there, {_flag_value(k, definition.get(k))} here"
                         for k in differ)
        raise UsageError(f"{root} holds another sweep ({what})",
                         help="rerun it with the same program, --set, --seeds, --steps and --search to continue it, "
                              "or choose another --out")
    return definition


def _flag(key: str) -> str:
    return "program" if key == "file" else f"--{key}"


def _show(value) -> str:
    return "the program's" if value in (None, [None]) else json.dumps(value)


def _flag_value(key: str, value) -> str:
    return ("a grid" if value is None else json.dumps(value)) if key == "search" else _show(value)


def next_step(run_dir: Path) -> str:
    """What a rerun does with a point whose run folder is ``run_dir``: ``skip`` (it
    finished), ``resume`` (it stopped with a checkpoint: interrupted, or killed),
    ``overwrite`` (it failed, or trained without leaving a checkpoint) or ``start`` (it
    never trained)."""
    from mloc.runtime.files.runfolder import CHECKPOINT, holds_run
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        status = summary.get("status") if isinstance(summary, dict) else None
    except (OSError, ValueError):
        status = None
    if status in DONE:
        return "skip"
    if status != "failed" and (run_dir / CHECKPOINT).is_file():
        return "resume"
    return "overwrite" if holds_run(run_dir) else "start"


def write_record(root: Path, record: dict) -> None:
    """Write ``root/sweep.json`` (a temporary file, then a rename: a kill never leaves half)."""
    tmp = root / f".{RECORD}.tmp"
    try:
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        tmp.replace(root / RECORD)
    except OSError as e:
        raise io_error(e, root / RECORD) from None
