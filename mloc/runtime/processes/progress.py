"""Progress display for training runs: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys


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
