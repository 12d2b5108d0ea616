"""What a resumed run continues with: the run in the folder, as its last start recorded it.

`--resume DIR` continues the run that is in ``DIR``, so the options it was started with
(``DIR/config.json``: the last start's record, the first start's or its latest resume's)
apply unless this command changes them explicitly:

- ``--set``: the recorded overrides are applied again; a ``--set`` of this command adds one,
  or replaces the recorded one with the same path (and those below a whole field it sets:
  ``classifier.optimizer=adam(...)`` drops a recorded ``classifier.optimizer.lr``).
- ``--steps``, ``--device``, ``--precision``, ``--nproc``, ``--strategy``, ``--checkpoint-form`` (:data:`INHERITED`): the recorded
  value, unless given (as the flag, or for steps, device and precision as ``--set train.F``).
- ``--seed`` and ``--dtype`` (:data:`FIXED`) cannot change: the seed drew the initial state
  and the checkpoint holds the random generators' states since, and the checkpoint's tensors
  are in the run's dtype. A different one is refused (exit 2), before anything is compiled
  when it is a flag.

Every change but the number of steps is shown before training (:func:`changes`) and recorded with the resume's
start in ``config.json`` (``"changes"``). A folder without a readable ``config.json`` (a run
of an older mloc) has nothing to inherit: the command's own options apply, as before.
No torch here, and the compiler's `Override` only where `--set`s are read.
"""

from __future__ import annotations

from pathlib import Path

from mloc.runtime.files.runfolder import CONFIG, RunFolderError

INHERITED = ("steps", "device", "precision", "nproc", "strategy", "checkpoint_form")
"""What a resume takes from the run unless the command gives it: a change is shown."""

FIXED = {
    "seed": "the seed drew the run's initial state, and the checkpoint holds the random "
            "generators' states since",
    "dtype": "the checkpoint's tensors are in the run's dtype",
}
"""What a resume cannot change, and why."""

QUIET = ("steps",)
"""Inherited, but a change is no news: more steps is how a run is trained further (the
banner says `(from step N)`, the progress `step K/STEPS`)."""

TRAIN = ("steps", "seed", "device", "precision", "strategy", "checkpoint_form")
"""The options `--set train.F` also sets (the train block's fields of the run's config)."""


def options_of(config) -> dict:
    """The options of a run's config (a `RunConfig`) that a start records and a resume compares."""
    return {k: getattr(config, k) for k in (*TRAIN, "dtype")}


def last_start(directory: Path) -> dict | None:
    """The record of the last start of the run in ``directory`` (its latest resume's, else
    the first start's), or None when ``config.json`` is missing or records no start; one
    that is not what mloc writes is an :class:`~mloc.runtime.files.runread.Unreadable` (exit 2,
    naming the file)."""
    from mloc.runtime.files import runread
    data = runread.config(Path(directory) / CONFIG)
    if data is None or data.get("run") is None:
        return None
    resumes = [r for r in data.get("resumes") or () if isinstance(r, dict)]
    return (resumes or [data["run"]])[-1]


def recorded_sets(record: dict | None) -> tuple[str, ...] | None:
    """The ``--set`` overrides the run was last started with; None when not recorded."""
    program = (record or {}).get("program") or {}
    return tuple(program["set"]) if isinstance(program.get("set"), list) else None


def inherit(record: dict | None, given: dict, set_in_train: set[str] = frozenset()) -> dict:
    """``given`` (option -> value, None when not given) with each :data:`INHERITED` and
    :data:`FIXED` option the command leaves open filled in from ``record``; not those of
    ``set_in_train``, the :data:`TRAIN` options the command's ``--set train.F`` sets."""
    if record is None:
        return dict(given)
    open_ = {k for k, v in given.items() if v is None} - set(set_in_train)
    return {**given, **{k: record[k] for k in open_ & {*INHERITED, *FIXED} if k in record}}


def changes(record: dict | None, effective: dict, directory: Path) -> list[str]:
    """A line for each option of ``effective`` that differs from ``record``; a
    :class:`RunFolderError` (exit 2) when one of them is :data:`FIXED`."""
    if record is None:
        return []
    differ = {k: (record[k], v) for k, v in effective.items()
              if k in record and k not in QUIET and record[k] != v}
    fixed = [k for k in FIXED if k in differ]
    if fixed:
        said = "; ".join(f"this command's {k} is {_shown(differ[k][1])}, the run's {_shown(differ[k][0])}"
                         for k in fixed)
        given = " or ".join(_flag(k) + (f" (or --set train.{k})" if k in TRAIN else "") for k in fixed)
        raise RunFolderError(
            f"cannot resume {directory} with another {' and '.join(fixed)}: {said} "
            f"({'; '.join(FIXED[k] for k in fixed)}); nothing was written",
            f"resume without {given} to continue the run, or start a new run (another --out)")
    return [f"{_flag(k)} {_shown(new)} (the run's was {_shown(old)})" for k, (old, new) in differ.items()]


def _flag(option: str) -> str:
    return f"--{option}"


def _shown(value) -> str:
    return "none (as built)" if value is None else str(value)


def changes_note(directory: Path, lines: list[str]) -> str:
    """The note a resume prints about what it changed from the run's last start."""
    return f"note: resuming {directory} with changes from its last start:\n" + "\n".join(f"  {x}" for x in lines)
