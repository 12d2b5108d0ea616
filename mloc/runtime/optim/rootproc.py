"""Shampoo's root worker process (:class:`RootProcess`), for statistics on the CPU
(:mod:`.rootjobs` says when it is used, and why not a thread).

The worker is a fresh Python running :func:`main` with one intra-op thread. It imports
neither ``__main__`` nor the user's code (``multiprocessing``'s start methods would
re-import the main script), ignores SIGINT (Ctrl-C stops training, which drains or drops
the jobs), and exits when its input closes, so it never outlives training. It runs
:meth:`~.rootbatch.RootBatch.local` with the same settings, so its roots are the synchronous ones bit
for bit (under data parallelism this rank's share of them; the training process exchanges
the shares, :mod:`.rootwork`).

Data: per staleness slot, two files mapped by both processes (``torch.from_file``,
``shared=True``, in ``/dev/shm`` where there is one; their blocks allocated when they are
made), the statistics in and the roots and statuses out; the worker unlinks each file once
it has mapped it, and the folder when training closes it or goes away. The folder names
the training process (:mod:`mloc.runtime.files.scratch`): when a SIGKILL of the whole process
group leaves it, the next start of a root worker on the machine removes it. Messages on the
worker's stdin/stdout are small pickled tuples, so neither side ever blocks on a full pipe:
a job says which slot, a result which slot is done. Results come in submission order
(:meth:`RootProcess.wait` reads the earlier ones first). A worker that has not finished
starting does not hold training up (the caller computes that refresh), and a worker that
dies is reported once (a warning) and its unanswered jobs are computed in the training
process from the statistics it was sent.
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
import warnings
from collections import deque
from pathlib import Path

import torch
from torch import Tensor

from mloc.runtime.files import scratch
from mloc.runtime.optim.rootbatch import RootBatch
from mloc.shared.warning import MlocWarning

_LEN = struct.Struct("<Q")
FOLDER_PREFIX = "mloc-roots"     # the shared folder: mloc-roots-PID-START-RANDOM (mloc.runtime.files.scratch)
READY = "ready"


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
        self.stats = _shared(self.paths[0], _flat(specs), create=True)
        self.out = _shared(self.paths[1], _out_specs(specs), create=True)

    def answer(self) -> tuple:
        """The roots' groups, then the statuses', as new tensors of their own (copies: the
        slot's next job rewrites the file; and a checkpoint then holds the same tensors as
        after a synchronous refresh)."""
        return _regroup([t.clone() for t in self.out], 2 * self.specs)


class RootProcess:
    """The worker process, its shared buffers and its queue of unanswered jobs."""

    def __init__(self, epsilon: float, method: str, shard: tuple[int, int] | None = None):
        self.settings = (epsilon, method, shard)
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
        shm = Path("/dev/shm")          # named by this process: a later start removes it if we are killed
        self._folder = scratch.make(FOLDER_PREFIX, shm if shm.is_dir() and os.access(shm, os.W_OK) else None)
        home = str(Path(__file__).resolve().parents[3])   # the worker imports this mloc, wherever it was found
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
        warnings.warn(MlocWarning(f"shampoo: the root worker process {what} (exit code {proc.poll()}); the "
                                  "roots are computed in the training process from now on (the same roots, no "
                                  "longer in the background)", every_rank=True), stacklevel=2)
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
        done = RootBatch(*self.settings).local(_regroup(bufs.stats, bufs.specs), ps)
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


def _shared(path: str, specs, create: bool = False) -> list[Tensor]:
    """The tensors of ``specs`` (``(shape, dtype)`` each), views of the file at ``path``
    mapped shared. ``create``: a new file whose blocks are allocated now
    (``posix_fallocate``): a full ``/dev/shm`` is then an ``OSError`` here, not a SIGBUS at
    the first write into a mapped page."""
    layout = _layout(specs)
    size = max(-(-layout[-1][1] // 8) * 8, 8)
    if create:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    raw = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    return [raw[start:stop].view(dtype).view(shape) for start, stop, dtype, shape in layout]


def _regroup(flat, nested) -> tuple:
    """``flat`` grouped like ``nested`` (a tuple of tuples)."""
    it = iter(flat)
    return tuple(tuple(next(it) for _ in ss) for ss in nested)


def _write(stream, message) -> None:
    """One message, flushed (the worker's stdout is block-buffered unless PYTHONUNBUFFERED)."""
    data = pickle.dumps(message)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


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
    ``RootBatch(*settings)`` into the slot's output file and answer with the slot; on end
    of input, remove ``folder`` and return."""
    work, mapped = RootBatch(*settings), {}
    try:
        _write(stdout, READY)
        while True:
            try:
                message = _read(stdin)
            except WorkerGone:
                return
            slot = message[0]
            if len(message) > 1:        # a slot's first job: its files and layout
                _, paths, specs, ps = message
                stats, out = _shared(paths[0], _flat(specs)), _shared(paths[1], _out_specs(specs))
                mapped[slot] = (_regroup(stats, specs), out, ps)
                for p in paths:
                    Path(p).unlink(missing_ok=True)
            stats, out, ps = mapped[slot]
            done = work.local(stats, ps)      # this rank's share under data parallelism
            torch._foreach_copy_(out, [t for ts in done["roots"] + done["status"] for t in ts])
            _write(stdout, slot)
    except (BrokenPipeError, FileNotFoundError):    # training closed the pipe or the folder:
        return                                      # it has finished or gone, and so do we
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    """The worker process's entry (``python -c``, not ``-m``: the package imports this module
    first): ``argv`` holds the settings' ``repr`` and the shared folder."""
    import ast
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    serve(ast.literal_eval(sys.argv[1]), sys.argv[2], sys.stdin.buffer, sys.stdout.buffer)
    try:
        sys.stdout.flush()
    except BrokenPipeError:                         # nothing left to say to a closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
