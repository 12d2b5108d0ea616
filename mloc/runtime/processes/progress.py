"""Progress display for training runs: a rich bar on a terminal, plain lines otherwise; and
mloc's own warnings during a run, one line each (:func:`told`)."""

from __future__ import annotations

import sys
from pathlib import Path

from mloc.runtime.files.runfiles import amend_config
from mloc.runtime.files.runfolder import RunIOError
from mloc.shared.warning import shown


class Progress:
    """`progress(done, total, losses, steps_per_s)` after each log interval, `note(text)`
    for anything else worth a line; use as a context manager."""

    def __init__(self, name: str, total: int, enabled: bool = True):
        self.name, self.total, self.enabled = name, total, enabled
        self._bar = None
        self._task = None

    def __enter__(self):
        if self.enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn
            self._bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.name, total=self.total, info="")
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False

    def note(self, text: str) -> None:
        """One line above the bar (an evaluation, the closing summary)."""
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        elif self.enabled:
            sys.stderr.write(text + "\n")

    def __call__(self, done: int, total: int, losses: dict, rate: float) -> None:
        info = "  ".join(f"{k} {v:.4g}" for k, v in losses.items()) + f"  {rate:.1f} steps/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
        elif self.enabled:
            sys.stderr.write(f"{self.name} step {done}/{total}  {info}\n")


def told(dist, out: Path | None):
    """mloc's warnings while a run trains (:func:`mloc.shared.warning.shown`): one line
    each on stderr, said by rank 0 unless about that rank's own state (``dist``: the run's
    rank, world and ``is_main``); rank 0 also records each in ``out``'s ``config.json``, the
    latest start's ``"warnings"`` (a record it cannot write is left out: the line was said,
    and the run's own next write of the folder reports the disk)."""
    said: list[str] = []

    def record(text: str) -> None:
        said.append(text)
        try:
            amend_config(Path(out), warnings=list(said))
        except RunIOError:
            pass
    return shown(dist.rank if dist.world > 1 else None, dist.world, record=record if dist.is_main and out else None)
