"""The chain programs through the CLI and the compiled train.py, and the chain rules.

- `mloc run programs/interlock.mlo` trains (in process), and the compiled `train.py`
  (run with `runpy`, as `python train.py` does) gives the same final parameters bit for
  bit: one program, two doors.
- `mloc plan` and `mloc graph` say which loss trains each stage and which heads are pruned.
- A chain stage in a hierarchy is refused at compile (E704, with why) and warned at check
  (W103, in the corpus); stages whose data differ are E708.
"""

from __future__ import annotations

import json
import runpy
import sys

import torch

from mloc.cli import main
from mloc.codegen.compile import compile_program
from mloc.passes.plan import plan_table
from mloc.runtime.program.checkpoint import load_checkpoint
from tests.conftest import PROGRAMS
from tests.interlock.programs import NET, write

INTERLOCK = str(PROGRAMS / "interlock.mlo")


def _params(folder):
    state = load_checkpoint(folder / "checkpoint.pt", "pairwise_interlock")
    return state


def test_mloc_run_and_the_compiled_train_py_train_the_chain_alike(tmp_path, capsys):
    assert main(["run", INTERLOCK, "--steps", "3", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = next(m for m in metrics if m["kind"] == "summary")["final"]
    assert set(final) == {"stage1/loss", "stage2/loss", "stage3/loss"}
    train = tmp_path / "run" / "train.py"
    argv = sys.argv
    try:
        sys.argv = [str(train), "--steps", "3", "--out", str(tmp_path / "again"), "--quiet"]
        ns = runpy.run_path(str(train), run_name="not_main")
        assert ns["main"](ns["PROGRAM"], str(train), sys.argv[1:]) == 0
    finally:
        sys.argv = argv
    a, b = _params(tmp_path / "run"), _params(tmp_path / "again")
    flat_a, flat_b = torch.cat([t.flatten() for t in _tensors(a)]), torch.cat([t.flatten() for t in _tensors(b)])
    assert flat_a.numel() > 100_000 and torch.equal(flat_a, flat_b)


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for k in sorted(tree, key=str):
            yield from _tensors(tree[k])
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _tensors(v)


def test_plan_and_graph_say_who_trains_whom(capsys):
    assert main(["plan", INTERLOCK]) == 0
    plan = capsys.readouterr().out
    assert "stage1: main <- loss of stage2 (through stage2, stage1); head pruned (trains no stage)" in plan
    assert "chain_step stage1" in plan
    assert main(["plan", INTERLOCK, "--json"]) == 0
    chain = json.loads(capsys.readouterr().out)["chains"][0]
    assert chain["trained_by"] == {"stage1": "stage2", "stage2": "stage3", "stage3": "stage3"}
    assert chain["pruned_heads"] == ["stage1"]
    assert main(["graph", INTERLOCK]) == 0
    assert "stage2: main <- loss of stage3 (through stage3, stage2)" in capsys.readouterr().out


def test_a_chain_stage_in_a_hierarchy_is_refused_with_why(tmp_path):
    path = write(tmp_path, NET, n=2, opt="sgd(lr=0.1)")
    text = path.read_text().replace("program net", "program tuned").replace("chain [", """problem tuner {
    module    = h.Block(fan_in=5, width=7)
    data      = h.blobs(batch_size=16)
    loss      = h.loss1(stage1, batch)
    optimizer = sgd(lr=0.1)
}
tuner -> stage1 { hypergrad = first_order }
chain [""").replace("h.loss1(stage1, batch)\n    optimizer = sgd(lr=0.1)\n}\nproblem stage2",
                    "h.tuned1(tuner, stage1, batch)\n    optimizer = sgd(lr=0.1)\n}\nproblem stage2", 1)
    path.write_text(text)
    c = compile_program(str(path), out_dir=tmp_path / "b")
    codes = [d.code for d in c.diagnostics]
    assert sorted(codes) == ["E704", "W103"], [d.message for d in c.diagnostics]
    d = next(d for d in c.diagnostics if d.code == "E704")
    assert "`stage1` is in the hierarchy edge tuner -> stage1" in d.message and "best response" in d.help


def test_stages_with_different_data_are_E708(tmp_path):
    path = write(tmp_path, NET, n=2, opt="sgd(lr=0.1)")
    text = path.read_text()
    i = text.index("h.blobs(batch_size=16)", text.index("problem stage3"))
    path.write_text(text[:i] + "h.blobs(batch_size=8)" + text[i + len("h.blobs(batch_size=16)"):])
    c = compile_program(str(path), out_dir=tmp_path / "b")
    assert [(d.code, d.span.line) for d in c.diagnostics] == [("E708", 17)]
    assert "data = h.blobs(batch_size=16)" in c.diagnostics[0].help


def test_a_stage_that_breaks_the_contract_is_the_programs_error(tmp_path, capsys):
    path = write(tmp_path, NET, n=2, opt="sgd(lr=0.1)")
    path.write_text(path.read_text().replace("h.Block(fan_in=7, width=6)", "h.Pair(fan_in=7, width=6)"))
    assert main(["run", str(path), "--steps", "1", "--out", str(tmp_path / "run"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "error[E702]" in err and "stage `stage2` returned tuple, not a tensor" in err
    assert "a stage's forward takes and returns one tensor" in err


def test_pipeline_usage_errors_exit_2(tmp_path, capsys):
    assert main(["run", INTERLOCK, "--pipeline", "--nproc", "2", "--out", str(tmp_path / "a")]) == 2
    assert "--pipeline runs one process per stage" in capsys.readouterr().err
    assert main(["run", str(PROGRAMS / "hpo.mlo"), "--pipeline", "--steps", "1", "--out", str(tmp_path / "b"),
                 "--quiet"]) == 2
    assert "one interlocking chain, and nothing else" in capsys.readouterr().err


def test_monitor_in_the_chain_block_keeps_the_pruned_heads(tmp_path):
    """`monitor = true` reaches the chain (plan and train.py): stage1's head, which pairwise
    interlocking prunes, is kept and reported as monitored."""
    import shutil
    text = (PROGRAMS / "interlock.mlo").read_text()
    assert "{ interlock = 2 }" in text
    (tmp_path / "monitor.mlo").write_text(text.replace("{ interlock = 2 }", "{ interlock = 2, monitor = true }"))
    for module in ("deep_supervision.py", "synthetic.py"):
        shutil.copy(PROGRAMS / module, tmp_path / module)
    compiled = compile_program(str(tmp_path / "monitor.mlo"))
    assert compiled.ok, compiled.diagnostics
    assert "monitor=True" in compiled.source
    assert "head monitored (trains on its own loss, trains no stage)" in plan_table(compiled.plan)
    assert "monitor=False" in compile_program(str(PROGRAMS / "interlock.mlo")).source
