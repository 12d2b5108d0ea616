#!/usr/bin/env bash
# The checks that need a CUDA device, as one short script for a session that is lent one
# (about 9 minutes on one GPU; nothing here is needed by the test suite, which never
# requires a GPU). Run from the repository root after the README's set-up:
#
#     bash bench/device_check.sh [OUT]      # OUT: where the logs go (default: device_check/)
#
# 1. fp16 with loss scaling and bf16, each example that has a GPU-relevant path, 50 steps;
# 2. two-process data parallelism: nccl with a GPU per process (Shampoo's program too); on a
#    one-GPU machine, the clear device error and gloo on the CPU beside the GPU;
# 3. bench/shampoo.py on CUDA (issue 11's step-time targets; roots: coupled Newton);
# 4. bench/dp_gpu.py: sama, finite_diff and neumann on 1 GPU (and on 2, nccl, when there are
#    two), time per step and peak memory, mloc against Betty's default/`distributed` strategy
#    (Betty is an optional benchmark dependency: its rows say so when it is not installed).
# Every command's exit code is printed; the script exits 1 if any failed.
set -u
out=${1:-device_check}
mkdir -p "$out"
python - <<'PY' || { echo "device_check: this torch sees no CUDA device"; exit 2; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" >> "$out/gpu.txt"
failed=0
check() {       # check NAME WANT COMMAND...: run, log to OUT/NAME.log, compare the exit code with WANT
    local name=$1 want=$2; shift 2
    local t0=$SECONDS
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3s (want %s) %4ss  %s\n' "$name" "$rc" "$want" "$((SECONDS - t0))" "$*" | tee -a "$out/summary.txt"
    [ "$rc" -eq "$want" ] || failed=1
}
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
for p in data_reweighting hpo shampoo_reweighting; do
    check "$p-fp16" 0 mloc run "programs/$p.mlo" --device cuda --precision fp16 --steps 50 --quiet --out "$out/runs/$p-fp16"
    check "$p-bf16" 0 mloc run "programs/$p.mlo" --device cuda --precision bf16 --steps 50 --quiet --out "$out/runs/$p-bf16"
done
if [ "$gpus" -ge 2 ]; then     # nccl: one GPU per process
    check mwn-nccl-2 0 mloc run programs/data_reweighting.mlo --device cuda --nproc 2 --steps 50 --quiet --out "$out/runs/mwn-nccl"
    check shampoo-nccl-2 0 mloc run programs/shampoo_reweighting.mlo --device cuda --nproc 2 --steps 50 --quiet --out "$out/runs/shampoo-nccl"
else                           # one GPU: a clear device error (exit 2), and gloo on the CPU beside the GPU
    check nccl-one-gpu 2 mloc run programs/data_reweighting.mlo --device cuda --nproc 2 --steps 5 --quiet --out "$out/runs/one-gpu"
    check gloo-beside-gpu 0 mloc run programs/data_reweighting.mlo --device cpu --nproc 2 --steps 20 --quiet --out "$out/runs/gloo"
fi
check bench-shampoo-cuda 0 python bench/shampoo.py --device cuda --runs 5
tail -n 40 "$out/bench-shampoo-cuda.log"
check bench-dp-gpu 0 python bench/dp_gpu.py --device cuda --steps 600 --out "$out/runs/dp_gpu"
cat "$out/bench-dp-gpu.log"
exit $failed
