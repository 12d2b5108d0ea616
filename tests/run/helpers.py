"""What the reliability tests share: running mloc in a child process, reading checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from mloc.runtime.program.checkpoint import load_checkpoint
from tests.conftest import ROOT

HERE = Path(__file__).resolve().parent
SMALL, FAULTY = HERE / "small.mlo", HERE / "faulty.mlo"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def default_signals() -> None:
    """A child's ``preexec_fn``: SIGINT and SIGHUP take their default action, even when the
    test run inherited them ignored (a background job of a script, ``nohup``), since the
    tests send them and check what they do."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def mloc(*argv, timeout=300, cwd=ROOT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mloc", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=ENV, timeout=timeout, **kw)


def popen(*argv, cwd=ROOT, **kw) -> subprocess.Popen:
    """`mloc ARGV` in the background, in a session of its own (so that a test can signal
    the launcher and its workers as a terminal would), with SIGINT's and SIGHUP's default actions."""
    return subprocess.Popen([sys.executable, "-m", "mloc", *map(str, argv)], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_signals, **kw)


def step_of(run_dir: Path) -> int:
    try:
        return int(load_checkpoint(Path(run_dir) / "checkpoint.pt", None)["step"])
    except Exception:  # noqa: BLE001 - not written yet, or being replaced
        return -1


def params(run_dir: Path) -> dict:
    state = load_checkpoint(Path(run_dir) / "checkpoint.pt", None)
    return {f"{n}.{i}": t for n, p in state["problems"].items() for i, t in enumerate(p["params"])} | \
           {f"{n}.module.{k}": t for n, p in state["problems"].items() for k, t in p["module"].items()}


def same_state(a: Path, b: Path) -> bool:
    """Bitwise the same parameters, buffers, optimizer states and step."""
    sa, sb = load_checkpoint(Path(a) / "checkpoint.pt", None), load_checkpoint(Path(b) / "checkpoint.pt", None)
    if sa["step"] != sb["step"]:
        return False
    pa, pb = params(a), params(b)
    opt = [(sa["problems"][n]["optimizer"], sb["problems"][n]["optimizer"]) for n in sa["problems"]]
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa) and \
        all(_tree_equal(x, y) for x, y in opt)


def _tree_equal(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_tree_equal(a, b) for a, b in zip(x, y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_tree_equal(x[k], y[k]) for k in x)
    return x == y


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
