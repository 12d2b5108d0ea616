"""One rank of a 2-process gloo job that builds a program three times in one process (the
Python API under torchrun): every session uses the process group the first one joined.
Prints the parameters after one step of each session, and of one whose `with` block closed."""

from __future__ import annotations

import json

import torch

import mloc
from mloc.runtime.processes.ending import end_rank
from tests.conftest import ROOT

PROGRAM = ROOT / "tests" / "runtime_loop" / "fsdp_hg.mlo"


def _one_step() -> list[float]:
    with mloc.load(PROGRAM) as session:
        session.step()
        return torch.cat([p.detach().reshape(-1) for p in session.module("net").parameters()]).tolist()


def main():
    first = mloc.load(PROGRAM)
    first.step()
    kept = torch.cat([p.detach().reshape(-1) for p in first.module("net").parameters()]).tolist()
    first.close()
    print(json.dumps({"steps": [kept, _one_step(), _one_step()], "rank": torch.distributed.get_rank()}))


if __name__ == "__main__":
    end_rank(main() or 0)               # as a rank of mloc run does (mloc.runtime.processes.ending)
