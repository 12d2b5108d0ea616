"""Data-parallel throughput and memory of sama, finite_diff and neumann, mloc against Betty's
`distributed` strategy on the same program: the GPU run of issue 26 (`bench/device_check.sh`
calls it; nothing in the test suite needs a GPU).

data_reweighting.mlo (batch 100 per process) for each hypergradient method, on 1 process and
on 2 (one GPU each, nccl) when the machine has 2 GPUs:

- mloc: ``mloc run programs/data_reweighting.mlo --device DEVICE --nproc W --steps S
  --set 'weight_net->classifier.hypergrad=METHOD'`` (``--compile`` as given, default off);
  milliseconds per outer step from the run's speed records (the wall time between the
  first record after ``--warmup`` steps and the last, over the steps between them), peak
  memory from their ``peak_mib`` (rank 0's GPU);
- Betty: ``bench/betty_gpu.py`` (the same program written for Betty; mloc's
  finite_diff is Betty's ``darts``), one process with ``--strategy default``, two under
  ``torchrun --nproc-per-node 2`` with ``--strategy distributed``.

    python3 bench/dp_gpu.py [--device cuda] [--steps 600] [--out dp_gpu]

With ``--device cpu`` (a check of the script: no Betty, whose distributed strategy needs
CUDA, and gloo for two processes) it runs mloc only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "programs" / "data_reweighting.mlo"
METHODS = {"finite_diff": ("finite_diff(eps=0.01)", "darts"), "sama": ("sama(eps=0.01)", "sama"),
           "neumann": ("neumann(iters=3, alpha=0.1)", "neumann")}


def mloc_row(method: str, world: int, args) -> dict:
    out = Path(args.out) / f"mloc-{method}-{world}"
    cmd = [sys.executable, "-m", "mloc", "run", str(PROGRAM), "--device", args.device, "--nproc", str(world),
           "--steps", str(args.steps), "--compile", args.compile, "--quiet", "--overwrite", "--out", str(out),
           "--set", f"weight_net->classifier.hypergrad={METHODS[method][0]}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    speed = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "speed"]
    timed = [r for r in speed if r["step"] >= args.warmup]
    if len(timed) < 2:
        return {"error": "too few speed records: raise --steps"}
    row = {"ms_per_step": (timed[-1]["time"] - timed[0]["time"]) / (timed[-1]["step"] - timed[0]["step"]) * 1e3}
    if "peak_mib" in timed[-1]:
        row["peak_mib"] = timed[-1]["peak_mib"]
    return row


def betty_row(method: str, world: int, args) -> dict:
    script = [str(ROOT / "bench" / "betty_gpu.py"), "--method", METHODS[method][1], "--steps", str(args.steps),
              "--warmup", str(args.warmup)]
    if world == 1:
        cmd = [sys.executable, *script, "--device", args.device]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), *script,
               "--strategy", "distributed"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=100, help="steps left out of the timing")
    parser.add_argument("--compile", default="off", choices=("off", "on", "auto"))
    parser.add_argument("--worlds", default=None, help="e.g. 1,2 (default: 1, and 2 with two GPUs or on the CPU)")
    parser.add_argument("--out", default="dp_gpu", help="where mloc's runs go")
    args = parser.parse_args()
    if args.worlds:
        worlds = [int(w) for w in args.worlds.split(",")]
    else:
        import torch
        worlds = [1, 2] if args.device == "cpu" or torch.cuda.device_count() >= 2 else [1]
    print(f"data_reweighting.mlo, batch 100 per process, {args.steps} steps ({args.warmup} untimed), "
          f"device {args.device}, mloc --compile {args.compile}")
    print(f"{'method':<12}{'procs':>6}{'mloc ms':>10}{'Betty ms':>10}{'ratio':>7}{'mloc MiB':>10}{'Betty MiB':>10}")
    for method in METHODS:
        for world in worlds:
            m = mloc_row(method, world, args)
            b = betty_row(method, world, args) if args.device != "cpu" else {"error": "cpu: not run"}
            ratio = m["ms_per_step"] / b["ms_per_step"] if "ms_per_step" in m and "ms_per_step" in b else None

            def num(row, key, spec=".2f"):
                return format(row[key], spec) if key in row else "-"
            print(f"{method:<12}{world:>6}{num(m, 'ms_per_step'):>10}{num(b, 'ms_per_step'):>10}"
                  f"{format(ratio, '.2f') if ratio else '-':>7}{num(m, 'peak_mib', '.1f'):>10}{num(b, 'peak_mib', '.1f'):>10}")
            for who, row in (("mloc", m), ("Betty", b)):
                if "error" in row and row["error"] != "cpu: not run":
                    print(f"    {who}: {row['error']}")


if __name__ == "__main__":
    main()
