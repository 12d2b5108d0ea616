"""Shampoo end to end under ``mloc run --nproc 2`` (slow tier: each run starts mloc, and
``--nproc 2`` two more interpreters; about 50 s for the two slow tests on 2 busy cores).

The program (``tests/shampoo/shampoo_nproc.mlo``, float64 through ``--dtype float64``):
Shampoo at the lower level of a two-level program under SAMA, roots every 2 steps,
blocks of 4, 12 steps, a checkpoint at the end. Its weights ``(24, 4)`` and ``(3, 24)``
give 18 statistics of size 4 (and 6 of size 3): a refresh computes the size-4 roots in
two chunks (16, and 2 padded with identities), so with synchronous roots rank 0 computes
one and rank 1 the other, and they are all-gathered (mloc/runtime/optim/rootbatch.py).
The data are read in order, so two ranks with batches of 8 see, step by step, the same 16
examples as one process with batches of 16 (mloc/runtime/program/data.py).

**2 ranks against 1 process** (synchronous, sharded roots; the default ``root_method``,
``auto``: eigh on the CPU): not bit-identical, and not expected to be: the gradients are
averaged by an all-reduce of two 8-example means, which rounds differently from one
16-example mean. Measured (float64): after step 1 the statistics differ by 4.4e-16
relatively, the roots and parameters not at all; the same program with ``sgd`` in place
of Shampoo ends 3.2e-16 (net) and 5.5e-15 (weights, through SAMA's finite differences)
apart. Shampoo amplifies these roundings through its roots: with the relative ridge
``ε = 1e-6`` a root's condition number is up to about ``1/ε``, so a relative perturbation
``δ`` of a statistic can move its root by up to about ``δ/(pε)``. After 4 steps the roots
differ by 1.3e-10, after 12 by 2.5e-11, and the parameters by 3.8e-14 (net) and 9.4e-13
(weights) (max |difference| / max |value| per tensor). The tolerance, 1e-9, is 1000×
above that and far below what a wrong root gives: the same run with roots one refresh
late (``staleness=1``) differs by 0.31.

**Asynchronous roots under 2 ranks** (each rank's root worker computes its share of the
roots, exchanged in the training process when they are due, issue 26) against synchronous
sharded roots with the same staleness (1), both with Newton roots (``root_method="newton"``, whose iteration stops per
matrix): bit-identical, parameters and the whole Shampoo state (statistics, roots, the
pending slot, grafting accumulators, momentum), measured and asserted: a root does not
depend on which rank computed it (the fixed chunk shape).

The figures: ``python -m tests.shampoo.test_nproc_run`` (about 90 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mloc.runtime.program.checkpoint import load_checkpoint
from mloc.runtime.optim import blocks
from mloc.runtime.optim.rootbatch import ROOT_CHUNK
from tests.conftest import ROOT

PROGRAM = Path(__file__).parent / "shampoo_nproc.mlo"
HALF_BATCHES = ("--set", "net.data=lib.data(seed=0, batch_size=8)",
                "--set", "weights.data=lib.data(seed=10, batch_size=8)")
STALE = ("--set", "net.optimizer.staleness=1")
NEWTON = ("--set", 'net.optimizer.root_method="newton"')
STEPS = 12


def run(out: Path, *argv, steps: int = STEPS, shampoo: bool = True) -> dict:
    """``mloc run`` of the program in float64; it exits 0 with a checkpoint of step
    ``steps`` (holding the Shampoo state), which is returned."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(PROGRAM), "--dtype", "float64",
                           "--threads", "1", "--quiet", "--out", str(out), "--steps", str(steps), *argv],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "checkpoint.pt").is_file()
    state = load_checkpoint(out / "checkpoint.pt", None)
    assert state["step"] == steps
    opt = state["problems"]["net"]["optimizer"]
    assert not shampoo or (opt["_type"] == "ShampooState" and opt["count"] == steps)
    return state


def params(state) -> dict:
    return {f"{n}.{i}": t for n, p in state["problems"].items() for i, t in enumerate(p["params"])}


def leaves(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in leaves(x[k])]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in leaves(v)]
    return []


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-300))


def test_the_program_gives_each_rank_a_chunk_of_roots():
    """The premise of the sharding test (no run): the net's statistics of size 4 are more
    than one chunk."""
    sizes = []
    for shape in [(24, 4), (24,), (3, 24), (3,)]:
        lay = blocks.layout(shape, 4, 8192, 0)
        sizes += [b for b in lay.block for _ in range(lay.count)] if lay.policy == "shampoo" else []
    assert sizes.count(4) == 18 > ROOT_CHUNK and sizes.count(3) == 6


@pytest.mark.slow
def test_two_ranks_with_sharded_roots_equal_one_process_on_the_same_batch(tmp_path):
    one = run(tmp_path / "one", "--nproc", "1")
    two = run(tmp_path / "two", "--nproc", "2", *HALF_BATCHES)
    a, b = params(one), params(two)
    assert a.keys() == b.keys() and len(a) == 8
    errs = {k: rel(a[k], b[k]) for k in a}
    assert max(errs.values()) <= 1e-9, errs
    ra, rb = (leaves(s["problems"]["net"]["optimizer"]["roots"]) for s in (one, two))
    assert len(ra) == 4 and max(rel(x, y) for x, y in zip(ra, rb)) <= 1e-9
    assert not any(torch.equal(x, torch.eye(x.shape[-1], dtype=x.dtype).expand_as(x)) for x in ra)


@pytest.mark.slow
def test_async_roots_under_two_ranks_equal_synchronous_sharded_roots_bit_for_bit(tmp_path):
    sync = run(tmp_path / "sync", "--nproc", "2", *HALF_BATCHES, *STALE, *NEWTON)
    asyn = run(tmp_path / "async", "--nproc", "2", *HALF_BATCHES, *STALE, *NEWTON,
               "--set", "net.optimizer.async_roots=true")
    a, b = params(sync), params(asyn)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = sync["problems"]["net"]["optimizer"], asyn["problems"]["net"]["optimizer"]
    assert sa["pending"][0]["step"] == sb["pending"][0]["step"] == STEPS + 1   # refreshed at 12
    for field in ("stats", "roots", "failures", "graft", "momentum", "pending"):
        la, lb = leaves(sa[field]), leaves(sb[field])
        assert la and len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb)), field


if __name__ == "__main__":
    # The docstring's figures: python -m tests.shampoo.test_nproc_run (about a minute)
    import tempfile

    def report(what, a, b):
        pa, pb = params(a), params(b)
        line = (f"{what}: net {max(rel(pa[k], pb[k]) for k in pa if k.startswith('net')):.1e}, "
                f"weights {max(rel(pa[k], pb[k]) for k in pa if k.startswith('weights')):.1e}")
        for field in ("stats", "roots"):
            la, lb = (leaves(s["problems"]["net"]["optimizer"].get(field, ())) for s in (a, b))
            line += f", {field} {max(rel(x, y) for x, y in zip(la, lb)):.1e}" if la else ""
        print(line, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        one, two = run(out / "1", "--nproc", "1"), run(out / "2", "--nproc", "2", *HALF_BATCHES)
        report("2 ranks against 1 process", one, two)
        report("the same after step 1", run(out / "1a", "--nproc", "1", steps=1),
               run(out / "2a", "--nproc", "2", *HALF_BATCHES, steps=1))
        report("the same after step 4", run(out / "1b", "--nproc", "1", steps=4),
               run(out / "2b", "--nproc", "2", *HALF_BATCHES, steps=4))
        report("roots one refresh late (staleness 1, 2 ranks)", two,
               run(out / "2s", "--nproc", "2", *HALF_BATCHES, *STALE))
        sgd = ("--set", "net.optimizer=sgd(lr=0.05, momentum=0.9)")
        report("sgd in place of shampoo, 2 ranks against 1 process",
               run(out / "1g", "--nproc", "1", *sgd, shampoo=False),
               run(out / "2g", "--nproc", "2", *HALF_BATCHES, *sgd, shampoo=False))
