"""Asynchronous roots under ``mloc run --nproc 2`` (issue 26; slow tier: every run starts
mloc, two ranks and their root workers, 20-40 s each on 2 busy cores).

The program and its settings are tests/shampoo/test_nproc_run.py's (float64, roots every
2 steps, staleness 1, Newton roots: the refresh of step ``t`` due at ``t+1``, so the
checkpoint of step 6 holds a slot still pending). Under ``ddp`` each rank's root worker
computes its share of the roots (test_nproc_run.py's async test compares it with the
synchronous split run); under ``zero`` each rank computes its own tensors' roots. A
checkpoint taken while a refresh is in flight holds it complete (every rank drains, the
shares are exchanged, then rank 0 writes), so resuming from it is bitwise an uninterrupted
run; a SIGKILL of the launcher or of one rank leaves no root worker behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.run.helpers import alive, descendants, popen, step_of
from tests.shampoo.test_nproc_run import HALF_BATCHES, NEWTON, PROGRAM, STALE, STEPS, leaves, params, rel, run

ASYNC = ("--set", "net.optimizer.async_roots=true")
FIELDS = ("stats", "roots", "failures", "graft", "momentum", "pending")


def assert_same(a: dict, b: dict) -> None:
    """Parameters and the whole Shampoo state bitwise."""
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    sa, sb = a["problems"]["net"]["optimizer"], b["problems"]["net"]["optimizer"]
    for field in FIELDS:
        la, lb = leaves(sa[field]), leaves(sb[field])
        assert la and len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb)), field


@pytest.mark.slow
def test_async_split_roots_under_two_ranks_equal_one_process_within_the_averaging_rounding(tmp_path):
    """Not bitwise: the all-reduce of two 8-example mean gradients rounds differently from
    one 16-example mean, and the roots amplify it (test_nproc_run.py's docstring: a
    relative ridge ε lets a relative perturbation δ of a statistic move a root by about
    δ/(pε)); the same bound, 1e-9 in float64, as the synchronous split's."""
    argv = (*STALE, *NEWTON, *ASYNC)
    one, two = run(tmp_path / "one", "--nproc", "1", *argv), run(tmp_path / "two", "--nproc", "2", *HALF_BATCHES, *argv)
    a, b = params(one), params(two)
    assert a.keys() == b.keys() and max(rel(a[k], b[k]) for k in a) <= 1e-9
    ra, rb = (leaves(s["problems"]["net"]["optimizer"]["roots"]) for s in (one, two))
    assert ra and max(rel(x, y) for x, y in zip(ra, rb)) <= 1e-9


@pytest.mark.slow
def test_zero_async_roots_equal_zeros_synchronous_run_bitwise(tmp_path):
    zero = ("--nproc", "2", "--strategy", "zero", *HALF_BATCHES, *STALE, *NEWTON)
    assert_same(run(tmp_path / "sync", *zero), run(tmp_path / "async", *zero, *ASYNC))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "zero"])
def test_a_run_resumed_from_a_checkpoint_mid_refresh_equals_an_uninterrupted_one(tmp_path, strategy):
    argv = ("--nproc", "2", "--strategy", strategy, *HALF_BATCHES, *STALE, *NEWTON, *ASYNC)
    whole = run(tmp_path / "whole", *argv)
    half = run(tmp_path / "half", *argv, steps=STEPS // 2)
    pending = half["problems"]["net"]["optimizer"]["pending"][0]
    assert pending["step"] == STEPS // 2 + 1                 # the refresh of step 6, due at 7
    assert not any(torch.equal(r, torch.zeros_like(r)) for r in leaves(pending["roots"]))  # complete
    assert_same(run(tmp_path / "half", *argv, "--resume", tmp_path / "half"), whole)


def root_workers(pids) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if b"mloc.runtime.optim.rootproc" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            pass
    return out


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["launcher", "rank"])
def test_a_sigkill_mid_refresh_leaves_no_root_worker(tmp_path, victim):
    proc = popen("run", PROGRAM, "--dtype", "float64", "--threads", "1", "--steps", 100000, "--out", tmp_path,
                 "--quiet", "--nproc", 2, *HALF_BATCHES, *STALE, *ASYNC)
    try:
        deadline = time.time() + 240
        while step_of(tmp_path) < 6 or len(root_workers(descendants(proc.pid))) < 2:
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.05)
        family = descendants(proc.pid)
        workers = root_workers(family)
        assert len(workers) == 2                            # one per rank
        ranks = {p for p in family if p not in workers and descendants(p) & workers}
        os.kill(proc.pid if victim == "launcher" else min(ranks), signal.SIGKILL)
        deadline = time.time() + 30
        while any(alive(p) for p in family) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in family), [p for p in family if alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _float32_run(out: Path, *argv) -> dict:
    """test_nproc_run.run's run in float32 (the figures only)."""
    import subprocess
    import sys
    from mloc.runtime.program.checkpoint import load_checkpoint
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(PROGRAM), "--dtype", "float32", "--threads", "1",
                           "--quiet", "--out", str(out), "--steps", str(STEPS), *argv], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_checkpoint(out / "checkpoint.pt", None)


if __name__ == "__main__":
    # The figures in docs/shampoo.md: python -m tests.shampoo.test_async_nproc (about 3 minutes)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for dtype, runner in (("float64", run), ("float32", _float32_run)):
            for what, argv in (("sync", (*STALE, *NEWTON)), ("async", (*STALE, *NEWTON, *ASYNC))):
                one = runner(Path(tmp) / f"one-{dtype}-{what}", "--nproc", "1", *argv)
                two = runner(Path(tmp) / f"two-{dtype}-{what}", "--nproc", "2", *HALF_BATCHES, *argv)
                pa, pb = params(one), params(two)
                ra, rb = (leaves(s["problems"]["net"]["optimizer"]["roots"]) for s in (one, two))
                print(f"{what} roots (staleness 1), {dtype}, 2 ranks against 1 process: parameters "
                      f"{max(rel(pa[k], pb[k]) for k in pa):.1e}, roots {max(rel(x, y) for x, y in zip(ra, rb)):.1e}",
                      flush=True)
