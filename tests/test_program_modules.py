"""The example programs' Python modules hold real models, data and losses.

For every problem of every example: build its module and data exactly as the .mlo file
says, draw a batch, evaluate its loss over the problems it names, and check the loss is a
finite scalar whose gradient reaches the parameters the dataflow edges say it reaches.
"""

from __future__ import annotations

import re

import math

import pytest
import torch

from mloc.passes.loader import evaluate, import_modules
from mloc.passes.pipeline import compile_file
from tests.conftest import PROGRAMS

EXAMPLES = sorted(PROGRAMS.glob("*.mlo"))


def _instantiate(graph):
    mods = import_modules(graph.info)
    torch.manual_seed(0)
    models = {p.name: evaluate(p.module.call, mods) for p in graph.problems()}
    return mods, models


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_loss_is_a_finite_scalar_reaching_what_it_reads(path):
    g = compile_file(str(path)).graph
    mods, models = _instantiate(g)
    for p in g.problems():
        assert isinstance(models[p.name], torch.nn.Module)
        batch = next(iter(evaluate(p.data.call, mods)))
        namespace = {**mods, **models, "batch": batch}
        loss = evaluate(p.loss.call, namespace)
        assert loss.dim() == 0 and torch.isfinite(loss), f"{p.name}: bad loss {loss}"
        for m in models.values():
            m.zero_grad(set_to_none=True)
        loss.backward()
        for q in p.loss.read_names():
            grads = [t.grad for t in models[q].parameters() if t.grad is not None]
            assert grads and any(gr.abs().sum() > 0 for gr in grads), f"{p.name}'s loss does not reach {q}"


WITH_EVALUATIONS = [p for p in EXAMPLES if re.search(r"^\s*eval\s+(\w+\s+)?every\b", p.read_text(), re.M)]


def test_the_examples_with_evaluations_are_found():
    assert {p.stem for p in WITH_EVALUATIONS} >= {"data_reweighting", "maml"}


@pytest.mark.parametrize("path", WITH_EVALUATIONS, ids=[p.stem for p in WITH_EVALUATIONS])
def test_evaluations_run(path):
    g = compile_file(str(path)).graph
    mods, models = _instantiate(g)
    assert g.info.train.evals, f"{path.name} declares `eval every` but none was parsed"
    for e in g.info.train.evals:
        value = evaluate(e.call.call, {**mods, **models})
        assert isinstance(value, float) and math.isfinite(value)
