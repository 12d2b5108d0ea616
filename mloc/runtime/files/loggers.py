"""Loggers beside ``metrics.jsonl``: ``--logger csv|tensorboard|wandb``.

Each logger receives every record :class:`~mloc.runtime.run.metrics.MetricsWriter` writes
(the schema is in :mod:`mloc.runtime.run.metrics`) and turns it into scalars named

    PROBLEM/loss, PROBLEM/lr, PROBLEM/grad_norm, PROBLEM/hypergrad_norm   (kind "train"),
    and what the optimizer reports (Shampoo: PROBLEM/roots_rejected, PROBLEM/root_failures)
    eval/METRIC                                                             (kind "eval")
    speed/steps_per_s, and speed/peak_mib on a CUDA device                  (kind "speed")

(:func:`scalars`); a ``summary`` record is not a curve and goes to W&B's run summary only.
They run on the main process only (rank 0 under ``--nproc``), as the metrics file does.

========== ============================== ==========================================================
name       writes                         needs
========== ============================== ==========================================================
csv        ``metrics.csv`` in the run     nothing: long format, one row per scalar,
           folder                         ``step,time,kind,name,value``
tensorboard event files in ``tb/``        the ``tensorboard`` package (``pip install 'mloc[tensorboard]'``),
                                          written through ``torch.utils.tensorboard``
wandb      a W&B run in ``wandb/``        ``wandb`` (``pip install 'mloc[wandb]'``); offline with
                                          ``WANDB_MODE=offline`` (then ``wandb sync`` uploads it)
========== ============================== ==========================================================

A missing package is found before anything runs (:func:`check_available`) and reported as
a usage error naming what to install.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
from pathlib import Path
from typing import Any, Iterable

NAMES = ("csv", "tensorboard", "wandb")
_EXTRA = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}   # name: (module, extra)


class LoggerError(Exception):
    """A ``--logger`` that cannot be used (an unknown name, a missing package); ``help``
    says what to do. A usage error (exit 2)."""

    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.help = help


def parse(values: Iterable[str] | None) -> tuple[str, ...]:
    """``--logger`` values (repeatable, each a comma list) as names, in order, once each."""
    out: list[str] = []
    for value in values or ():
        for name in str(value).split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in NAMES:
                raise LoggerError(f"unknown logger `{name}` in --logger {value}",
                                  f"choose from {', '.join(NAMES)} (several: --logger csv,tensorboard)")
            if name not in out:
                out.append(name)
    return tuple(out)


def check_available(names: Iterable[str]) -> None:
    """Raise :class:`LoggerError` for the first logger whose package is not installed."""
    for name in names:
        if name in _EXTRA:
            module, extra = _EXTRA[name]
            if importlib.util.find_spec(module) is None:
                raise LoggerError(f"--logger {name} needs the `{module}` package, which is not installed",
                                  f"pip install 'mloc[{extra}]' (or pip install {module})")


NOT_CURVES = frozenset({"kind", "problem", "step", "time", "loss_steps"})
"""The fields of a ``train`` record that are not curves; every other number is one."""


def scalars(record: dict) -> dict[str, float]:
    """The record's curves as ``{name: value}`` (None values, NaN/Inf as written, left out)."""
    kind = record.get("kind")
    if kind == "train":
        problem = record.get("problem", "?")
        return {f"{problem}/{k}": float(v) for k, v in record.items()
                if k not in NOT_CURVES and isinstance(v, (int, float)) and not isinstance(v, bool)}
    if kind == "eval" and isinstance(record.get("value"), (int, float)):
        return {f"eval/{record['eval']}": float(record["value"])}
    if kind == "speed":
        return {f"speed/{k}": float(record[k]) for k in ("steps_per_s", "peak_mib")
                if isinstance(record.get(k), (int, float)) and not isinstance(record.get(k), bool)}
    return {}


class CsvLogger:
    """``metrics.csv``: ``step,time,kind,name,value``, one row per scalar, flushed per record
    (appended to on resume; the header written once)."""

    FIELDS = ("step", "time", "kind", "name", "value")

    def __init__(self, out: Path, start: int = 0):
        self.path = Path(out) / "metrics.csv"
        from mloc.runtime.files.runfiles import own_file
        own_file(self.path)                        # a symlink is replaced, its target untouched
        _truncate(self.path, start)
        fresh = not self.path.is_file() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", encoding="utf-8", newline="")
        self._writer = csv.writer(self._file)
        if fresh:
            self._writer.writerow(self.FIELDS)

    def log(self, record: dict) -> None:
        rows = scalars(record)
        for name, value in rows.items():
            self._writer.writerow((record["step"], record["time"], record["kind"], name, repr(value)))
        if rows:
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def _truncate(path: Path, step: int) -> None:
    """Keep the rows up to ``step`` (a resumed run writes the later ones again), as
    ``metrics.jsonl`` is kept one history; none at step 0."""
    if not path.is_file():
        return
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as e:
        from mloc.runtime.files.runfolder import RunIOError
        raise RunIOError(path, f"it is not UTF-8 (byte {e.object[e.start]:#04x} at offset {e.start})", "read") from None
    keep = rows[:1] + [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= step] if step else []
    if keep != rows:
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            csv.writer(f).writerows(keep)
        tmp.replace(path)


class TensorBoardLogger:
    """Scalars into ``tb/`` through ``torch.utils.tensorboard.SummaryWriter`` (wall time
    from the record); view with ``tensorboard --logdir runs``."""

    def __init__(self, out: Path, start: int = 0):
        from torch.utils.tensorboard import SummaryWriter
        self.dir = Path(out) / "tb"
        if not start:                                   # a fresh start: an earlier run's events go
            for old in self.dir.glob("events.out.tfevents.*"):
                old.unlink()
        # a resumed run: TensorBoard hides the earlier events past the checkpoint's step
        self._writer = SummaryWriter(log_dir=str(self.dir), purge_step=start + 1 if start else None)

    def log(self, record: dict) -> None:
        for name, value in scalars(record).items():
            self._writer.add_scalar(name, value, record["step"], walltime=record["time"])

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """A W&B run in the run folder (``dir=out``), named after it, with ``config`` (what
    ``config.json`` records); every record's scalars logged at its step, the summary
    record's ``final`` into the run summary. ``WANDB_MODE=offline`` works without a
    network (W&B reads it itself); W&B refusing to start (no ``wandb login``, no network)
    is a :class:`LoggerError` saying so."""

    def __init__(self, out: Path, config: dict | None = None, project: str = "mloc", module: Any = None):
        wandb = module or importlib.import_module("wandb")
        self._wandb = wandb
        try:
            self._run = wandb.init(project=project, dir=str(out), name=f"{Path(out).parent.name}/{Path(out).name}",
                                   config=config or {}, reinit=True)
        except _wandb_errors(wandb) as e:      # no API key, no network, a bad setting: the user's setup
            raise LoggerError(f"--logger wandb could not start a W&B run: {e}",
                              "run `wandb login`, or set WANDB_MODE=offline (`wandb sync` uploads the run "
                              "later)") from None

    def log(self, record: dict) -> None:
        values = scalars(record)
        if values:
            self._run.log(values, step=record["step"])
        if record.get("kind") == "summary":
            for name, value in (record.get("final") or {}).items():
                self._run.summary[name] = value

    def close(self) -> None:
        self._run.finish()


def _wandb_errors(wandb: Any) -> tuple[type[BaseException], ...]:
    """The errors W&B raises for its setup (``wandb.errors.Error``: UsageError for a missing
    API key, CommError, AuthenticationError), not for a bug."""
    error = getattr(getattr(wandb, "errors", None), "Error", None)
    return (error,) if isinstance(error, type) and issubclass(error, BaseException) else ()


def open_loggers(names: Iterable[str], out: Path, start: int = 0, config: dict | None = None) -> list:
    """The loggers ``names`` for the run folder ``out``, continuing at step ``start`` (call
    on the main process only)."""
    check_available(names)
    made = []
    for name in names:
        if name == "csv":
            made.append(CsvLogger(out, start))
        elif name == "tensorboard":
            made.append(TensorBoardLogger(out, start))
        elif name == "wandb":
            made.append(WandbLogger(out, config))
    return made
