"""Shampoo's root work: when roots are refreshed, where pending stale roots wait (the
background jobs themselves: :mod:`.rootjobs`; the roots of a refresh, batched:
:mod:`.rootbatch`), and how rejected roots are counted and reported.

:class:`RootWork` is held by :class:`~mloc.runtime.optim.shampoo.Shampoo` (one per
optimizer). A refresh at step ``t`` (a multiple of ``update_every``) produces, for every
statistic, a root and a status (1 accepted, 0 rejected, -1 an all-zero statistic); with
staleness ``s > 0`` it goes into slot ``(t / update_every) mod ⌈s/update_every⌉`` of the
state's ``pending`` tuple, due at ``t+s``, computed now or by a background job (which fills
that slot's fresh tensors; installing waits for it). Installing merges accepted roots and
counts a consecutive failure per rejected matrix.

Under data parallelism (a process group of ``W > 1`` ranks, every rank holding the same
statistics) the roots of a refresh are split across the ranks
(:meth:`.RootBatch.local`, each rank computing the chunks of matrices that
:func:`.rootsplit.assign` gives it by estimated cost) and exchanged
(:meth:`.RootBatch.exchange`, one collective per refresh), synchronous or not: a background
job computes its rank's share only, and the exchange happens in the training process when
the slot is settled (:meth:`RootWork._settle`: at its install, or at :meth:`RootWork.drain`),
at the same step on every rank whichever rank's job finished first, so the asynchronous run
equals the synchronous split run bit for bit. Under ``strategy = zero`` (:meth:`own_roots`)
each rank holds only its own tensors' statistics and computes all their roots, no split.
"""

from __future__ import annotations

import warnings

import torch

from mloc.runtime.optim.rootbatch import RootBatch
from mloc.shared.roots import shampoo_roots_due
from mloc.shared.warning import MlocWarning
from mloc.runtime.optim.rootjobs import RootJobs

class RootWork:
    """See the module docstring."""

    def __init__(self, epsilon: float, method: str, every: int, staleness: int):
        self.every, self.staleness = every, staleness
        self.slots = -(-staleness // every) if staleness else 0
        self.batch = RootBatch(epsilon, method)         # the roots themselves
        self.jobs = RootJobs((epsilon, method, None), self._fill_local)
        self.split = True           # split across data-parallel ranks (not under zero: own_roots)
        self._unshared: dict[int, tuple] = {}   # slot: (fresh, ps), its share not yet exchanged
        self._warned_at = 0

    def refresh(self, t, stats, ps, pending, background):
        """At a refresh step (:func:`~mloc.shared.roots.shampoo_roots_due`: ``t`` a
        multiple of ``update_every``), the new roots, due at ``t + staleness``: in a
        one-off slot (staleness 0), or in their staleness slot, computed now or by a
        background job that writes into the slot's tensors."""
        due = shampoo_roots_due(t, self.every, self.staleness)
        if due is None or not any(stats):
            return pending
        if not self.slots:
            return ({"step": due, **self.batch.compute(stats, ps)},)
        slot = (t // self.every) % self.slots
        self.jobs.wait(slot)                   # installed already; its job is done
        self._unshared.pop(slot, None)
        fresh = {"step": due,
                 "roots": tuple(tuple(torch.empty_like(s) for s in ss) for ss in stats),
                 "status": tuple(tuple(torch.zeros(s.shape[0], dtype=torch.int8, device=s.device)
                                       for s in ss) for ss in stats)}
        if background:
            self.jobs.submit(slot, stats, ps, fresh)
            if self.batch.shard is not None:   # this rank's share only, until settled
                self._unshared[slot] = (fresh, ps)
        else:
            self._fill(fresh, stats, ps)
        return pending[:slot] + (fresh,) + pending[slot + 1:]

    def _fill(self, slot: dict, stats, ps, local: bool = False) -> None:
        """Compute the roots of ``stats`` into ``slot``'s tensors (``local``: this rank's
        share only, a background job's body)."""
        done = (self.batch.local if local else self.batch.compute)(stats, ps)
        for key in ("roots", "status"):
            for dst, src in zip(slot[key], done[key]):
                for d, s in zip(dst, src):
                    d.copy_(s)

    def _fill_local(self, slot: dict, stats, ps) -> None:
        self._fill(slot, stats, ps, local=True)

    def _settle(self, slot: int) -> None:
        """Wait for ``slot``'s job; under data parallelism exchange its share with the other
        ranks' (a collective: every rank settles the same slots at the same step)."""
        self.jobs.wait(slot)
        share = self._unshared.pop(slot, None)
        if share is not None:
            fresh, ps = share
            done = self.batch.exchange({"roots": fresh["roots"], "status": fresh["status"]}, ps)
            fresh["roots"], fresh["status"] = done["roots"], done["status"]

    def install(self, t, roots, failures, pending):
        """Install the slots due at ``t`` (waiting for their jobs): accepted roots replace
        the old, a rejected one keeps it and adds a consecutive failure, an all-zero
        statistic (no gradient yet) does neither. Staleness 0's one-off slot is dropped."""
        due = [i for i, s in enumerate(pending) if s["step"] == t]
        if not due:
            return roots, failures, pending
        clean = True
        for i in due:
            self._settle(i)
            slot = pending[i]
            roots, failures, accepted = merge(roots, failures, slot["roots"], slot["status"])
            clean = clean and accepted
            pending = pending[:i] + ({**slot, "step": -1},) + pending[i + 1:]
        if not self.slots:
            pending = ()
        if clean:                   # every failure count restarted at zero
            self._warned_at = 0
        else:
            self._report(failures)
        return roots, failures, pending

    def _report(self, failures) -> None:
        """Warn when a root was rejected: the first time, then every 10 more consecutive
        failures of the worst matrix (one host read per install)."""
        counts = failure_counts(failures)
        if counts is None:
            return
        bad, worst = counts
        if worst and (self._warned_at == 0 or worst >= self._warned_at + 10):
            self._warned_at = worst
            # split: every rank installs the same exchanged roots; own roots (zero): its own
            warnings.warn(MlocWarning(f"shampoo: {bad} inverse root(s) rejected (non-finite or inaccurate); "
                                      f"the previous roots are kept (worst: {worst} consecutive failures). "
                                      "Check the gradients for NaN/Inf, raise `epsilon`, or refresh the "
                                      "roots less often.", every_rank=not self.split), stacklevel=2)
        elif worst == 0:
            self._warned_at = 0

    def start(self, background: bool) -> None:
        """Under a process group of several ranks (unless :meth:`own_roots`) split the root
        work; start the background worker (``async_roots``, :meth:`.RootJobs.start`),
        which then computes this rank's share."""
        import torch.distributed as dist
        if self.split and dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
            self.batch.shard = (dist.get_rank(), world) if world > 1 else None
        self.jobs.settings = (self.batch.epsilon, self.batch.method, self.batch.shard)
        if background:
            self.jobs.start()

    def own_roots(self) -> None:
        """Compute every root of the statistics this rank holds, no split (``strategy = zero``:
        each rank holds its own tensors' statistics); a worker started with a share restarts."""
        self.split = False
        if self.batch.shard is not None:
            self.drain()
            self.batch.shard = None
            self.jobs.restart((self.batch.epsilon, self.batch.method, None))

    def drain(self) -> None:
        """Wait for every root job and exchange the shares (every rank calls it at the same
        point under data parallelism): the state's pending slots are then complete."""
        self.jobs.drain()
        for slot in sorted(self._unshared):
            self._settle(slot)

    def close(self) -> None:
        """Stop the worker; shares not exchanged are dropped (no collective: a failing rank
        closes alone)."""
        self._unshared.clear()
        self.jobs.close()


def failure_counts(failures) -> tuple[int, int] | None:
    """``(rejected, worst)`` with one host read: how many matrices' last refresh was
    rejected (their previous root is in use), and the most consecutive rejections of one
    matrix; None without a preconditioned tensor."""
    flat = [f.reshape(-1) for fs in failures for f in fs]
    if not flat:
        return None
    f = torch.cat(flat)
    rejected, worst = torch.stack([(f > 0).sum(), f.max()]).tolist()
    return rejected, worst


def clone_tuple(ts):
    return tuple(t.clone() for t in ts)


def merge(roots, failures, new_roots, status):
    """``(roots, failures, all accepted)``: ``new_roots`` installed where the status is 1, a
    failure counted where it is 0. When every root was accepted (one host read) they are
    installed as they are and the failure counts restart at zero."""
    flat = [s.reshape(-1) for ss in status for s in ss]
    if flat and bool(torch.cat(flat).eq(1).all()):
        return (tuple(map(tuple, new_roots)),      # tuples whatever a checkpoint restored
                tuple(tuple(torch.zeros_like(f) for f in fs) for fs in failures), True)
    out_r, out_f = [], []
    for rs, fs, ns, ss in zip(roots, failures, new_roots, status):
        out_r.append(tuple(torch.where((s == 1)[:, None, None], n, r) for r, n, s in zip(rs, ns, ss)))
        out_f.append(tuple(torch.where(s == 1, 0, torch.where(s == 0, f + 1, f))
                           for f, s in zip(fs, ss)))
    return tuple(out_r), tuple(out_f), False


def merge_due(t, roots, failures, pending):
    for slot in pending:
        if slot["step"] == t:
            roots, failures, _ = merge(roots, failures, slot["roots"], slot["status"])
    return roots, failures, pending
