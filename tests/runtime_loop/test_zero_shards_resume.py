"""Sharded checkpoints under `--strategy zero --checkpoint-form sharded` (slow tier): each
rank writes its optimizer-state shard beside checkpoint.pt and its manifest; a resumed run
equals an uninterrupted one bitwise whichever form wrote the checkpoint and whichever
strategy resumes it, another world size resumes a sharded checkpoint as it resumes the
gathered one of the same state, and a damaged shard or manifest is an error naming the
file (exit 2), with nothing deleted."""

from __future__ import annotations

import json

import pytest

from mloc.runtime.program import sharded
from mloc.runtime.program.checkpoint import load_checkpoint, save_checkpoint
from tests.run.helpers import SMALL, _tree_equal, mloc

SETS = ("--set", "net.optimizer=adam(lr=0.01)", "--set", "weights->net.hypergrad=sama")
DATA = ("--set", "net.data=lib.data(seed=0, n=960, batch_size=16)",
        "--set", "weights.data=lib.data(seed=10, n=960, batch_size=16)")


def _run(out, steps: int, strategy: str, *extra, nproc: int = 2, ok: bool = True):
    proc = mloc("run", SMALL, "--steps", steps, "--out", out, "--quiet", "--compile", "off", "--nproc", nproc,
                "--strategy", strategy, *SETS, *extra)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _shards(out) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint.shard-*.pt"))


def _same(a, b) -> bool:
    """Bitwise the same step, parameters, buffers and whole optimizer states (a sharded
    checkpoint's joined from its shards)."""
    sa, sb = sharded.gathered(a), sharded.gathered(b)
    keys = ("params", "module", "optimizer", "steps")
    return sa["step"] == sb["step"] and sa["problems"].keys() == sb["problems"].keys() and all(
        _tree_equal(sa["problems"][n][k], sb["problems"][n][k]) for n in sa["problems"] for k in keys) \
        and _tree_equal(sa["data"], sb["data"]) and _tree_equal(sa["rng"], sb["rng"])


@pytest.mark.slow
def test_a_resumed_sharded_run_equals_an_uninterrupted_one_bitwise(tmp_path):
    """zero -> zero (N=2, each rank reading its own shard), zero -> ddp (N=2), and a gathered
    checkpoint resumed writing shards; the uninterrupted run writes gathered."""
    whole = tmp_path / "whole"
    _run(whole, 10, "zero")
    cases = {"sharded-zero": (("--checkpoint-form", "sharded"), ("zero",)),
             "sharded-ddp": (("--checkpoint-form", "sharded"), ("ddp",)),
             "gathered-sharded": ((), ("zero", "--checkpoint-form", "sharded"))}
    for case, (first, then) in cases.items():
        out = tmp_path / case
        _run(out, 5, "zero", *first)
        assert bool(_shards(out)) == bool(first), case
        _run(out, 10, *then, "--resume", out)
        assert _same(out, whole), case
        state = load_checkpoint(out / "checkpoint.pt", None)
        names = [f["file"] for f in json.loads(state["shards"])["files"]] if "shards" in state else []
        assert _shards(out) == sorted(names), case          # the previous checkpoint's shards removed
        assert ("shards" in state) == (case != "sharded-ddp"), case


@pytest.mark.slow
def test_a_sharded_checkpoint_holds_a_shard_per_rank_and_resumes_into_other_world_sizes(tmp_path):
    """Each rank's file holds its parameters' state only (their sum, the whole); N=3 and
    one process resume it exactly as they resume the gathered checkpoint of the same state
    (60 batches an epoch, so that the data positions exist under every world size: a rank
    draws every N-th batch)."""
    shard, gather = tmp_path / "sharded", tmp_path / "gathered"
    _run(shard, 5, "zero", "--checkpoint-form", "sharded", *DATA)
    _run(gather, 5, "zero", *DATA)
    assert _same(shard, gather)
    manifest = json.loads(load_checkpoint(shard / "checkpoint.pt", None)["shards"])
    assert manifest["world"] == 2 and [f["rank"] for f in manifest["files"]] == [0, 1]
    held = [len(load_checkpoint(shard / f["file"], None)["problems"]["net"]["index"]) for f in manifest["files"]]
    assert sum(held) == len(manifest["partition"]["net"]) and min(held) > 0
    for nproc, strategy in ((3, "zero"), (1, "zero")):
        a, b = tmp_path / f"s{nproc}", tmp_path / f"g{nproc}"
        _run(a, 8, strategy, "--resume", shard, *DATA, nproc=nproc)
        _run(b, 8, strategy, "--resume", gather, *DATA, nproc=nproc)
        assert _same(a, b), nproc
        assert _shards(a) == [] if nproc == 1 else len(_shards(a)) == 3, nproc


@pytest.mark.slow
def test_a_damaged_shard_or_manifest_is_an_error_naming_the_file(tmp_path):
    out = tmp_path / "run"
    _run(out, 5, "zero", "--checkpoint-form", "sharded")
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    shard = out / _shards(out)[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    proc = _run(out, 8, "zero", "--resume", out, ok=False)
    assert proc.returncode == 2 and f"{shard} is damaged" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and shard.read_bytes() == bytes(data)
    shard.write_bytes(files[shard.name])

    state = load_checkpoint(out / "checkpoint.pt", None)
    manifest = json.loads(state["shards"])
    manifest["files"].pop(1)                               # a manifest entry gone (the file still there)
    save_checkpoint(out / "checkpoint.pt", {**state, "shards": json.dumps(manifest)}, state["program"])
    proc = _run(out, 8, "zero", "--resume", out, ok=False)
    assert proc.returncode == 2 and "lists no shard file for rank 1 of its 2" in proc.stderr, proc.stderr[-3000:]
    assert all((out / name).is_file() for name in files)   # nothing deleted
