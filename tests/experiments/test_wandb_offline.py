"""`--logger wandb` with the real `wandb` package, offline (skipped when it is not installed).

The run's offline record file (`wandb/offline-run-*/run-*.wandb`) is read back without
wandb's own reader (wandb ≥ 0.20 keeps it in its Go core): a 7-byte header (":W&B", a
magic, a version), then LevelDB-log blocks of 32 KiB whose chunks (7-byte header: CRC,
length, type full/first/middle/last) carry `wandb.proto.Record` messages. The history
records must hold what `metrics.jsonl` holds, step for step.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mloc.runtime.run.records import read_metrics
from tests.conftest import ROOT

wandb = pytest.importorskip("wandb")
SMALL = Path(__file__).resolve().parents[1] / "run" / "small.mlo"


def _chunks(raw: bytes, block: int = 32768):
    pos, partial = 7, b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:               # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind == 1:
            yield data
        elif kind == 2:
            partial = data
        elif kind == 3:
            partial += data
        elif kind == 4:
            yield partial + data


def _history(run_dir: Path) -> dict[int, dict]:
    from wandb.proto import wandb_internal_pb2 as pb
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    out = {}
    for data in _chunks(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            out[items["_step"]] = items
    return out


def test_wandb_offline_history_equals_metrics_jsonl(tmp_path):
    # `mloc run` in its own process, as a user runs it: W&B's service has written the
    # offline file by the time the process has exited (read right after `finish()` in this
    # process, the file was once found without its history on a loaded CI machine)
    run = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-m", "mloc", "run", str(SMALL), "--steps", "20", "--out", str(run),
                           "--logger", "wandb", "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    history = _history(run)
    train = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert train and sorted(history) == sorted({r["step"] for r in train})
    for r in train:
        logged = history[r["step"]]
        assert logged[f"{r['problem']}/loss"] == pytest.approx(r["loss"], rel=1e-12)
        assert logged[f"{r['problem']}/lr"] == pytest.approx(r["lr"], rel=1e-12)
