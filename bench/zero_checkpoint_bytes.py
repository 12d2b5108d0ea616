"""Per-rank checkpoint bytes under `--strategy zero`: gathered against sharded, N = 2, 4.

``mloc run bench/overlap.mlo --nproc N --strategy zero --checkpoint-form F`` (gloo, one
thread a process) with its classifier a 256-W-...-W-10 MLP (``--width`` W = 512, ``--depth``
= 8) under ``--optimizer`` (default Adam: two floats of state per parameter), ``--steps`` 2;
then the files in the run folder, as each rank wrote them:

- gathered: rank 0 writes ``checkpoint.pt``, the whole state; the other ranks write nothing;
- sharded: rank 0 writes ``checkpoint.pt`` (the replicated part: parameters, buffers, data
  positions, random generators, and the manifest) and its shard; rank r its shard only
  (the sizes the manifest records, checked against the files).

It prints each rank's bytes, the replicated part, and the largest shard over the whole
optimizer state in the gathered file (gathered minus replicated): about 1/N, above it by at
most one tensor's state (the partition is by whole tensors: docs/runtime.md).

    python bench/zero_checkpoint_bytes.py                 # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "bench" / "overlap.mlo"


def run(out: Path, world: int, form: str, args) -> None:
    cmd = [sys.executable, "-m", "mloc", "run", str(PROGRAM), "--steps", str(args.steps), "--nproc", str(world),
           "--strategy", "zero", "--checkpoint-form", form, "--out", str(out), "--quiet", "--compile", "off",
           "--set", f"classifier.module=lib.MLP(width={args.width}, depth={args.depth})",
           "--set", f"classifier.optimizer={args.optimizer}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def per_rank(out: Path, world: int) -> tuple[list[int], int]:
    """Each rank's bytes written, and the replicated part's (checkpoint.pt)."""
    from mloc.runtime.program.checkpoint import load_checkpoint
    common = (out / "checkpoint.pt").stat().st_size
    payload = load_checkpoint(out / "checkpoint.pt", None)
    if "shards" not in payload:
        return [common] + [0] * (world - 1), common
    files = json.loads(payload["shards"])["files"]
    sizes = [f["bytes"] for f in files]
    assert sizes == [(out / f["file"]).stat().st_size for f in files], "the manifest's sizes are the files'"
    return [common + sizes[0], *sizes[1:]], common


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--optimizer", default="adam(lr=1e-3)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    print(f"classifier MLP 256-{args.width}x{args.depth}-10 under {args.optimizer}, weight net under adam; "
          f"checkpoint bytes each rank writes after {args.steps} steps of --strategy zero")
    print(f"{'N':>2} {'form':>8} {'rank 0':>12} {'other ranks (each)':>30} {'replicated':>11} "
          f"{'largest shard / state':>22} {'1/N':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.worlds:
            gathered, _ = per_rank(_ran(Path(tmp), world, "gathered", args), world)
            sharded, common = per_rank(_ran(Path(tmp), world, "sharded", args), world)
            state = gathered[0] - common
            shards = [sharded[0] - common, *sharded[1:]]
            print(f"{world:>2} {'gathered':>8} {gathered[0]:>12,} {', '.join(f'{b:,}' for b in gathered[1:]):>30}")
            print(f"{world:>2} {'sharded':>8} {sharded[0]:>12,} {', '.join(f'{b:,}' for b in sharded[1:]):>30} "
                  f"{common:>11,} {max(shards) / state:>22.3f} {1 / world:>6.3f}")


def _ran(tmp: Path, world: int, form: str, args) -> Path:
    out = tmp / f"{form}-{world}"
    run(out, world, form, args)
    return out


if __name__ == "__main__":
    main()
