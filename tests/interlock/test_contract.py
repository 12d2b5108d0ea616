"""The chain contract: a loss that a chain step cannot cut as written is an error, never
another function trained silently (issue 22, item 2).

A chain step evaluates stage t's loss with the earlier stages replaced by their stored
features (`mloc.runtime.grad.interlock`). That is the loss as written only if it calls stages
1..t once each, in order, each on the previous one's output, and reads nothing of an
earlier stage past the cut (`mloc.runtime.grad.chain_contract`). Each way to break that is
tested on its own, through `mloc run` (the trace pass catches it at compile: E702 at the
loss, with the contract as help) and through the compiled `train.py` with the loss
switched after compiling (the runtime's own check, which the pipeline shares: E702,
exit 1). All of them ran to exit 0 before, training stage3 on another function.

Where the contract allows something that looks alike, the last stage's output used twice
(its head and a penalty), the loss is computed as written: checked against a hand
computation on the reference's scalar-multiply stages.
"""

from __future__ import annotations

import json
import math
import runpy
import sys

import pytest
import torch

from mloc.cli import main
from mloc.runtime.program.checkpoint import load_checkpoint
from tests.interlock.programs import HAND, write

LIB = '''
import os

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width=6, classes=3):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.head = nn.Linear(width, classes)

    def forward(self, h):
        return self.block(h)


def data():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g))]


def score(stage, h, y):
    return F.cross_entropy(stage.head(h), y)


def loss1(s1, batch):
    x, y = batch
    return score(s1, s1(x), y)


def loss2(s1, s2, batch):
    x, y = batch
    return score(s2, s2(s1(x)), y)


def declared(s1, s2, s3, x, y):
    return score(s3, s3(s2(s1(x))), y)


def twice(s1, s2, s3, x, y):
    return score(s3, s3(s2(s2(s1(x)))), y)


def last_twice(s1, s2, s3, x, y):
    return score(s3, s3(s3(s2(s1(x)))), y)


def out_of_order(s1, s2, s3, x, y):
    return score(s3, s3(s1(s2(x))), y)


def skipped(s1, s2, s3, x, y):
    return score(s3, s3(s1(x)), y)


def not_on_previous(s1, s2, s3, x, y):
    s1(x)
    return score(s3, s3(s2(x)), y)


def skip_connection(s1, s2, s3, x, y):
    h1 = s1(x)
    return score(s3, s3(s2(h1) + h1), y)


def earlier_output(s1, s2, s3, x, y):
    h2 = s2(s1(x))
    return score(s3, s3(h2), y) + h2.pow(2).mean()


def other_between(s1, s2, s3, x, y):
    return score(s3, s3(s2(2 * s1(x))), y)


def earlier_parameters(s1, s2, s3, x, y):
    return score(s3, s3(s2(s1(x))), y) + 1e-3 * s1.block[0].weight.pow(2).sum()


def allowed(s1, s2, s3, x, y):
    """What the contract allows: anything between stage2 and stage3 (loss2 ends at stage2),
    stage3's own output read twice."""
    o = s3(torch.tanh(s2(s1(x))).reshape(-1, 6) * 1.5)
    return score(s3, o, y) + o.pow(2).mean()


def loss3(s1, s2, s3, batch):
    x, y = batch
    return globals()[os.environ.get("CHAIN_LOSS", "declared")](s1, s2, s3, x, y)
'''

PROGRAM = """program contract
import chainlib as c
problem stage1 {
    module    = c.Block()
    data      = c.data()
    loss      = c.loss1(stage1, batch)
    optimizer = sgd(lr=0.1)
}
problem stage2 {
    module    = c.Block()
    data      = c.data()
    loss      = c.loss2(stage1, stage2, batch)
    optimizer = sgd(lr=0.1)
}
problem stage3 {
    module    = c.Block()
    data      = c.data()
    loss      = c.loss3(stage1, stage2, stage3, batch)
    optimizer = sgd(lr=0.1)
}
chain [stage1, stage2, stage3] { interlock = 2 }
train { steps = 2, seed = 0 }
"""

CONTRACT = ("the loss of `stage3` calls `stage1`, `stage2`, `stage3` once each, in that order, each on what "
            "the one before returned")

# Each way to break the contract, and what the error says the loss does.
BREACHES = {
    "twice": "calls stage `stage2` twice (the stages it calls, in order: stage1, stage2, stage2, stage3)",
    "last_twice": "calls stage `stage3` twice",
    "out_of_order": "calls stage `stage1` after `stage2` (the stages it calls, in order: stage2, stage1, stage3)",
    "skipped": "never calls stage `stage2` (the stages it calls, in order: stage1, stage3)",
    "not_on_previous": "calls `stage2` on something that is not computed from the output of `stage1`",
    "skip_connection": "feeds the output of `stage1` into `stage3`, besides passing it on to `stage2`",
    "earlier_output": "uses the output of `stage2` beyond the input of `stage3`",
    "earlier_parameters": "reads the parameters of `stage1` (`block.0.weight`) outside its call",
    "other_between": ("computes the input of `stage2` from `stage1`'s output differently from the loss of "
                      "`stage2` (Mul, where that loss does nothing): a chain step computes `stage2` once"),
}


def _program(folder):
    (folder / "chainlib.py").write_text(LIB, encoding="utf-8")
    path = folder / "contract.mlo"
    path.write_text(PROGRAM, encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", sorted(BREACHES))
def test_mloc_run_refuses_a_loss_that_breaks_the_chain_contract(kind, tmp_path, capsys, monkeypatch):
    """Caught at compile (the trace cuts each loss as a step does, on the meta device):
    E702 at stage3's loss, the breach in the message, the contract in the help, exit 1."""
    path = _program(tmp_path)
    monkeypatch.setenv("CHAIN_LOSS", kind)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"error[E702]: the loss of `stage3` {BREACHES[kind]}" in err, err
    assert "contract.mlo:18:17" in err and "breaks the chain contract" in err
    assert f"= help: {CONTRACT}" in err
    assert "failed (1 error)" in err and "E701" not in err      # one defect, one error (a skip is not also E701)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_the_error_points_at_the_users_call(tmp_path, capsys, monkeypatch):
    path = _program(tmp_path)
    monkeypatch.setenv("CHAIN_LOSS", "twice")
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "= note: in " in err and "chainlib.py:" in err and "return score(s3, s3(s2(s2(s1(x)))), y)" in err


@pytest.mark.parametrize("kind", sorted(BREACHES))
def test_the_runtime_refuses_it_too(kind, tmp_path, capsys, monkeypatch):
    """The same program compiled with a valid loss, its `train.py` run with the loss
    switched: the chain step's own check stops at step 1 (E702, exit 1, the contract)."""
    path = _program(tmp_path)
    assert main(["compile", str(path), "-o", str(tmp_path / "build")]) == 0
    train = tmp_path / "build" / "train.py"
    monkeypatch.setenv("CHAIN_LOSS", kind)
    argv = sys.argv
    try:
        sys.argv = [str(train), "--out", str(tmp_path / "run"), "--quiet"]
        ns = runpy.run_path(str(train), run_name="not_main")
        assert ns["main"](ns["PROGRAM"], str(train), sys.argv[1:]) == 1
    finally:
        sys.argv = argv
    err = capsys.readouterr().err
    assert "error[E702]" in err and f"the loss of `stage3` {BREACHES[kind]}" in err, err
    assert f"--> the chain contract (docs/interlocking.md): {CONTRACT}" in err


@pytest.mark.parametrize("kind", ["declared", "allowed"])
def test_a_loss_that_keeps_the_contract_trains(kind, tmp_path, monkeypatch):
    """The checks refuse no valid chain: the loss as declared, and one that computes
    something between stage2 and stage3 and reads stage3's output twice."""
    monkeypatch.setenv("CHAIN_LOSS", kind)
    path = _program(tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert (tmp_path / "run" / "checkpoint.pt").is_file()


TWICE_USED = '''
import torch.nn.functional as F

from hand import Scale, one_example, aux1, aux2   # noqa: F401


def final3(stage1, stage2, stage3, batch):
    """Stage3's output read twice after it: its cross-entropy and a penalty on it."""
    x, y = batch
    o = stage3(stage2(stage1(x)))
    return F.cross_entropy(o, y) + 0.5 * o.pow(2).mean()
'''


def test_the_last_stages_output_used_twice_is_computed_as_written(tmp_path):
    """Allowed by the contract, and exact: with stages w1 = 2, w2 = 3, w3 = 4 on x = [1, 1],
    y = 1, the loss as written is l3 = CE(o, 1) + mean(o^2)/2 with o = w3 * [6, 6] = [24, 24]:
    log 2 + 288. Local learning (n = 1) trains w3 on it alone: dl/do = softmax(o) - e_1 + o/2
    = [12.5, 11.5], dl/dw3 = 6 * that = [75, 69], so SGD (lr 1) gives w3 = [-71, -65]."""
    path = write(tmp_path, HAND, n=1)
    (tmp_path / "twice_used.py").write_text(TWICE_USED, encoding="utf-8")
    path.write_text(path.read_text().replace("import hand as h", "import hand as h\nimport twice_used as u")
                    .replace("h.final3(", "u.final3("))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in metrics if m.get("kind") == "train" and m.get("problem") == "stage3")
    assert first["step"] == 1
    assert math.isclose(first["loss"], math.log(2) + 288, rel_tol=1e-6)
    state = load_checkpoint(tmp_path / "run" / "checkpoint.pt", "hand")
    w3 = _find(state, "stage3", "w")
    assert torch.allclose(w3.double(), torch.tensor([-71.0, -65.0], dtype=torch.float64), rtol=0, atol=1e-4)


def _find(tree, problem: str, name: str) -> torch.Tensor:
    """The parameter `name` of `problem` in a checkpoint's state."""
    found = []

    def walk(node, path):
        if isinstance(node, torch.Tensor):
            if problem in path and path[-1] == name:
                found.append(node)
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, str(k)))
    walk(tree, ())
    assert len(found) == 1, found
    return found[0]
