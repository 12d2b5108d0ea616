"""The real pipeline (one process per stage, gloo on 127.0.0.1) against the simulation.

Both take every gradient at the parameters of the step before and run the same
primitives in the same order (`mloc.runtime.processes.pipeline`), so in float64 the stages'
parameters after 6 steps agree to 1e-12 (observed: bit for bit), for pairwise and 3-wise
(end-to-end on 3 stages) interlocking. Slow tier: three interpreters start per run.
"""

from __future__ import annotations

import json

import pytest
import torch

import mloc
from mloc.cli.train import write_outputs
from mloc.codegen.compile import compile_program
from mloc.runtime.processes import pipeline
from tests.interlock.programs import NET, write

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("n", [2, 3])
def test_the_pipeline_gives_the_parameters_of_the_simulation(tmp_path, n):
    path = write(tmp_path, NET, n=n, opt="sgd(lr=0.1, momentum=0.9)")
    train = write_outputs(compile_program(str(path), out_dir=tmp_path / "build"), tmp_path / "build")
    record = pipeline.launch(train, 3, 6, tmp_path / "out", dtype="float64", timeout=300)
    sim = mloc.load(path, dtype="float64")
    sim.run(6)
    for k in range(3):
        piped = torch.load(tmp_path / "out" / f"stage{k}.pt")
        for name, p in sim.module(f"stage{k + 1}").state_dict().items():
            assert (piped[name] - p).abs().max().item() <= 1e-12, (k, name)
    ranks = json.loads((tmp_path / "out" / "pipeline.json").read_text())["ranks"]
    assert record["ranks"] == ranks and [r["steps"] for r in ranks] == [6, 6, 6]
    assert all(r["busy_s"] > 0 and r["idle_s"] >= 0 and len(r["step_wall_s"]) == 6 for r in ranks)
