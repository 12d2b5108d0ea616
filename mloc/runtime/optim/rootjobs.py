"""Where Shampoo's asynchronous root jobs run (``async_roots``): :class:`RootJobs` keeps the
jobs not yet installed, by staleness slot, and sends each to a worker *process* when the
statistics are on the CPU (:class:`~.rootproc.RootProcess`), to a background *thread* when
they are on an accelerator (whose kernels the thread only launches), or when the process
cannot start or has no room for its shared files.

Why a process on the CPU: on a thread the root job's many small operations contend with
training's for Python's GIL. Every torch call releases and retakes it, so the two threads
hand it back and forth, and on 2 cores the training thread's steps ran 2–4 × slower while a
job was running (``bench/shampoo.py``; a small job then cost about as much as computing it
inline). A separate process has its own interpreter: training pays for copying the
statistics out and the roots back in, and two small messages. This is the paper's
arrangement too (Anil et al. 2020: the roots are computed on the host's CPUs while the
accelerators train).
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from mloc.runtime.optim.rootproc import Job, RootProcess
from mloc.shared.warning import MlocWarning


class RootJobs:
    """The background jobs of one optimizer's root work, by staleness slot (see the module
    docstring). ``fill(fresh, stats, ps)`` computes a refresh into a slot's tensors (the
    thread's job, and the fallback)."""

    use_process = True
    """Jobs on the CPU go to the worker process; False: to the thread (tests)."""

    def __init__(self, settings: tuple, fill: Callable):
        self.settings, self._fill = settings, fill
        self._pool: ThreadPoolExecutor | None = None
        self._process: RootProcess | None = None
        self._spawn = False             # start the process at the first refresh on the CPU
        self._jobs: dict[int, Future | Job] = {}

    def start(self) -> None:
        """Start the worker process now, so that it loads torch while training starts; on a
        machine with a GPU (statistics likely there) only at the first refresh on the CPU."""
        if self.use_process and self._process is None:
            self._spawn = True
            if not torch.cuda.is_available():
                self._start_process()

    def _start_process(self) -> None:
        """The worker process; a warning and the thread where it cannot start."""
        self._spawn = False
        process = RootProcess(*self.settings)
        try:
            process.start()
            self._process = process
        except OSError as e:
            warnings.warn(MlocWarning(f"shampoo: the root worker process could not start ({e}); the roots "
                                      "are computed on a background thread", every_rank=True), stacklevel=4)

    def restart(self, settings: tuple) -> None:
        """New ``settings`` (:class:`.RootBatch`'s arguments); a running worker process is
        stopped and started again with them."""
        self.settings = settings
        if self._process is not None:
            self.close()
            self.start()

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether the worker process takes jobs (waiting up to ``timeout`` seconds for it to
        start); false without one."""
        return self._process is not None and self._process.ready(timeout)

    def submit(self, slot: int, stats, ps, fresh: dict) -> None:
        """Start computing the roots of ``stats`` into ``fresh`` (slot ``slot``): in the
        process (a copy of the statistics goes to it), on the thread (from a snapshot: the
        step updates the statistics in place), or here while the process is starting."""
        on_cpu = next(s for ss in stats for s in ss).device.type == "cpu"
        if on_cpu and self._spawn:
            self._start_process()
        if not on_cpu and self._process is not None:
            self._process.close()               # an accelerator's statistics: the thread
            self._process = None
        if on_cpu and self._process is not None:
            if not self._process.ready():
                self._fill(fresh, stats, ps)
                return
            try:
                self._jobs[slot] = self._process.submit(slot, stats, ps, fresh)
                return
            except OSError as e:            # no room for the shared files: the thread instead
                warnings.warn(MlocWarning(f"shampoo: no room for the root worker's shared files ({e}); the "
                                          "roots are computed on a background thread", every_rank=True), stacklevel=4)
                self.drain()
                self._process.close()
                self._process = None
        if self._pool is None:
            # One intra-op thread: a new thread does not inherit torch.set_num_threads, and
            # a second OpenMP team spin-waiting beside training's made a 1.3 ms root job
            # take 30-80 ms of wall time on 2 cores (measured, bench/shampoo.py's logreg).
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shampoo-roots",
                                            initializer=torch.set_num_threads, initargs=(1,))
        snapshot = tuple(tuple(s.detach().clone() for s in ss) for ss in stats)
        self._jobs[slot] = self._pool.submit(self._fill, fresh, snapshot, ps)

    def wait(self, slot: int) -> None:
        """Wait for ``slot``'s job if it has one (its slot tensors are then filled)."""
        job = self._jobs.pop(slot, None)
        if isinstance(job, Job):
            self._process.wait(job)
        elif job is not None:
            job.result()

    def drain(self) -> None:
        """Wait for every job."""
        for slot in sorted(self._jobs):
            self.wait(slot)

    def close(self) -> None:
        """Drain, then stop the thread and the process."""
        try:
            self.drain()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._process is not None:
                self._process.close()
                self._process = None
