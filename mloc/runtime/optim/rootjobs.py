"""Where Shampoo's asynchronous root jobs run (``async_roots``): :class:`RootJobs` keeps the
jobs not yet installed, by staleness slot, and sends each to a worker *process* when the
statistics are on the CPU (:class:`RootProcess`), to a background *thread* when they are on
an accelerator (whose kernels the thread only launches) or the process cannot start.

Why a process on the CPU: on a thread the root job's many small operations contend with
training's for Python's GIL. Every torch call releases and retakes it, so the two threads
hand it back and forth, and on 2 cores the training thread's steps ran 2–4 × slower while a
job was running (``bench/shampoo.py``; a small job then cost about as much as computing it
inline). A separate process has its own interpreter: training pays for copying the
statistics out and the roots back in, and two small messages. This is the paper's
arrangement too (Anil et al. 2020: the roots are computed on the host's CPUs while the
accelerators train).

The worker is a fresh Python running :func:`main` with one intra-op thread. It imports
neither ``__main__`` nor the user's code (``multiprocessing``'s start methods would
re-import the main script), ignores SIGINT (Ctrl-C stops training, which drains or drops
the jobs), and exits when its input closes, so it never outlives training. It runs
:meth:`RootWork.compute` with the same settings, so its roots are the synchronous ones bit
for bit.

Data: per staleness slot, two files mapped by both processes (``torch.from_file``,
``shared=True``, in ``/dev/shm`` where there is one), the statistics in and the roots and
statuses out; the worker unlinks each file once it has mapped it, and the folder when
training closes it or goes away. Messages on the worker's stdin/stdout are small pickled
tuples, so neither side ever blocks on a full pipe: a job says which slot, a result which
slot is done. Results come in submission order (:meth:`RootProcess.wait` reads the earlier
ones first). A worker that has not finished starting does not hold training up (the
refresh is computed in the training process), and a worker that dies is reported once (a
warning) and its unanswered jobs are computed in the training process from the
statistics it was sent.
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

_LEN = struct.Struct("<Q")
READY = "ready"


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
            warnings.warn(f"shampoo: the root worker process could not start ({e}); the roots "
                          "are computed on a background thread", RuntimeWarning, stacklevel=4)

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
                warnings.warn(f"shampoo: no room for the root worker's shared files ({e}); the roots "
                              "are computed on a background thread", RuntimeWarning, stacklevel=4)
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


class WorkerGone(RuntimeError):
    """The worker process exited or closed its pipe."""


class Job:
    """A submitted refresh: its ``slot``, root orders ``ps`` and the slot's ``fresh``
    tensors to fill."""

    def __init__(self, slot: int, ps: tuple, fresh: dict):
        self.slot, self.ps, self.fresh, self.done = slot, ps, fresh, False


class Buffers:
    """One slot's shared files, as views: ``stats`` (the statistics in) and ``out`` (the
    roots, then the statuses), laid out by ``specs``."""

    def __init__(self, folder: Path, slot: int, specs):
        self.specs = specs              # per parameter, ((shape, dtype), ...)
        self.paths = (str(folder / f"stats{slot}"), str(folder / f"out{slot}"))
        self.stats = _carve(_mapped(self.paths[0], _flat(specs), create=True), _layout(_flat(specs)))
        self.out = _carve(_mapped(self.paths[1], _out_specs(specs), create=True), _layout(_out_specs(specs)))

    def answer(self) -> tuple:
        """The roots' groups, then the statuses', as new tensors of their own (copies: the
        slot's next job rewrites the file; and a checkpoint then holds the same tensors as
        after a synchronous refresh)."""
        return _regroup([t.clone() for t in self.out], 2 * self.specs)


class RootProcess:
    """The worker process, its shared buffers and its queue of unanswered jobs."""

    def __init__(self, epsilon: float, method: str, every: int, staleness: int):
        self.settings = (epsilon, method, every, staleness)
        self._proc: subprocess.Popen | None = None
        self._folder: Path | None = None
        self._ready = False
        self._buffers: dict[int, Buffers] = {}
        self._queue: deque[Job] = deque()
        self.answered = 0               # jobs the worker computed (tests, benchmarks)

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker; it loads torch meanwhile (:meth:`ready` says when it is done)."""
        if self._proc is not None:
            return
        shm = Path("/dev/shm")
        self._folder = Path(tempfile.mkdtemp(prefix="mloc-roots-",
                                             dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))
        import mloc                     # the worker imports this mloc, wherever it was found
        home = str(Path(mloc.__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": path}
        self._proc = subprocess.Popen([sys.executable, "-c", f"from {__name__} import main; main()",
                                       repr(self.settings), str(self._folder)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether the worker has started and can take a job (waiting up to ``timeout``
        seconds for it; by default not at all)."""
        if self._proc is None:
            return False
        if self._proc.poll() is not None:
            self._gone()
            return False
        if not self._ready and select.select([self._proc.stdout], [], [], timeout)[0]:
            try:
                self._ready = _read(self._proc.stdout) == READY
            except (WorkerGone, OSError, ValueError):
                self._ready = False
        return self._ready

    def close(self) -> None:
        """Stop the worker (its input closes and it exits; killed if it has not within 5 s)
        and remove the shared files. Unanswered jobs are dropped: callers drain first."""
        proc, self._proc, self._ready = self._proc, None, False
        self._queue.clear()
        self._buffers.clear()
        if proc is not None:
            _stop(proc)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _gone(self) -> None:
        """The worker has exited: say so, once; from now on the caller computes the roots."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        what = "stopped" if self._ready else "exited while starting"
        warnings.warn(f"shampoo: the root worker process {what} (exit code {proc.poll()}); the roots "
                      "are computed in the training process from now on (the same roots, no longer "
                      "in the background)", RuntimeWarning, stacklevel=2)
        _stop(proc)

    # --- jobs ---------------------------------------------------------------------------------
    def submit(self, slot: int, stats, ps, fresh: dict) -> Job:
        """Copy ``stats`` (per parameter, a tuple of ``(B, b, b)`` CPU tensors) into the
        slot's shared file and send the job (root orders ``ps``); the caller checked
        :meth:`ready` and that the slot's previous job was waited for."""
        bufs, message = self._buffers.get(slot), (slot,)
        if bufs is None:                # the shapes are the optimizer's: fixed from the start
            specs = tuple(tuple((tuple(s.shape), s.dtype) for s in ss) for ss in stats)
            bufs = self._buffers[slot] = Buffers(self._folder, slot, specs)
            message = (slot, bufs.paths, specs, tuple(ps))
        torch._foreach_copy_(bufs.stats, [s for ss in stats for s in ss])
        job = Job(slot, tuple(ps), fresh)
        self._queue.append(job)
        try:
            _write(self._proc.stdin, message)
        except (OSError, ValueError, AttributeError):
            self.wait(job)              # the worker is gone: computed here
        return job

    def wait(self, job: Job) -> None:
        """Fill ``job``'s slot tensors with its roots and statuses, reading the answers to
        earlier jobs first."""
        while not job.done:
            head = self._queue.popleft()
            bufs = self._buffers[head.slot]
            try:
                if self._proc is None or _read(self._proc.stdout) != head.slot:
                    raise WorkerGone("no answer")
                done = bufs.answer()
                self.answered += 1
            except (WorkerGone, OSError, ValueError, EOFError, pickle.UnpicklingError):
                done = self._computed_here(bufs, head.ps)
            n = len(done) // 2          # the slot's own tensors, replaced (not copied into)
            head.fresh["roots"], head.fresh["status"] = done[:n], done[n:]
            head.done = True

    def _computed_here(self, bufs: Buffers, ps: tuple) -> tuple:
        """The worker is gone: say so (once), then compute the roots of ``bufs``' statistics."""
        self._gone()
        from mloc.runtime.optim.rootwork import RootWork
        done = RootWork(*self.settings).compute(_regroup(bufs.stats, bufs.specs), ps)
        return done["roots"] + done["status"]


def _stop(proc: subprocess.Popen) -> None:
    """Close the worker's pipes and reap it (it exits on end of input; killed after 5 s)."""
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _flat(specs) -> list:
    return [s for ss in specs for s in ss]


def _out_specs(specs) -> list:
    """The output file's layout: every root (as its statistic), then every status."""
    flat = _flat(specs)
    return flat + [((shape[0],), torch.int8) for shape, _ in flat]


def _layout(specs) -> list[tuple]:
    """Where each tensor of ``specs`` (``(shape, dtype)`` each) lies in the bytes of a
    file: ``(start, stop, dtype, shape)``, every start a multiple of 8 (aligned views)."""
    out, offset = [], 0
    for shape, dtype in specs:
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        out.append((offset, offset + size, dtype, shape))
        offset += -(-size // 8) * 8
    return out


def _mapped(path: str, specs, create: bool = False) -> Tensor:
    """The bytes of the file at ``path``, sized for ``specs``, mapped shared. ``create``:
    a new file whose blocks are allocated now (``posix_fallocate``): a full ``/dev/shm`` is
    then an ``OSError`` here, not a SIGBUS at the first write into a mapped page."""
    size = max(-(-_layout(specs)[-1][1] // 8) * 8, 8)
    if create:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def _carve(raw: Tensor, layout) -> list[Tensor]:
    """The tensors of a :func:`_layout`, views of the bytes ``raw``."""
    return [raw[start:stop].view(dtype).view(shape) for start, stop, dtype, shape in layout]


def _regroup(flat, nested) -> tuple:
    """``flat`` grouped like ``nested`` (a tuple of tuples)."""
    it = iter(flat)
    return tuple(tuple(next(it) for _ in ss) for ss in nested)


def _write(stream, message) -> None:
    data = pickle.dumps(message)
    stream.write(_LEN.pack(len(data)) + data)


def _read(stream):
    n = _LEN.unpack(_read_exactly(stream, _LEN.size))[0]
    return pickle.loads(_read_exactly(stream, n))


def _read_exactly(stream, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise WorkerGone("the pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(settings: tuple, folder: str, stdin, stdout) -> None:
    """The worker's loop: for each job, compute the roots of its slot's statistics with
    ``RootWork(*settings)`` into the slot's output file and answer with the slot; on end
    of input, remove ``folder`` and return."""
    from mloc.runtime.optim.rootwork import RootWork
    work, mapped = RootWork(*settings), {}
    _write(stdout, READY)
    try:
        while True:
            try:
                message = _read(stdin)
            except WorkerGone:
                return
            slot = message[0]
            if len(message) > 1:        # a slot's first job: its files and layout
                _, paths, specs, ps = message
                stats = _carve(_mapped(paths[0], _flat(specs)), _layout(_flat(specs)))
                out = _carve(_mapped(paths[1], _out_specs(specs)), _layout(_out_specs(specs)))
                mapped[slot] = (_regroup(stats, specs), out, ps)
                for p in paths:
                    Path(p).unlink(missing_ok=True)
            stats, out, ps = mapped[slot]
            done = work.compute(stats, ps)
            torch._foreach_copy_(out, [t for ts in done["roots"] + done["status"] for t in ts])
            _write(stdout, slot)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    """The worker process's entry (``python -c``, not ``-m``: the package imports this module
    first): ``argv`` holds the settings' ``repr`` and the shared folder."""
    import ast
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    serve(ast.literal_eval(sys.argv[1]), sys.argv[2], sys.stdin.buffer, sys.stdout.buffer)
