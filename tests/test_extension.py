"""A package outside mloc adds an optimizer and a hypergradient method without editing
mloc, exactly as docs/architecture.md's "Adding things" says:

- `toyplug/builtins.py` (torch-free): a hyperparameter record whose step size is `step`
  (not `lr`), its optimizer descriptor, and a method descriptor with a cost and an
  `AutoRank` (tests/extension/toyplug_builtins.py);
- `toyplug/runtime.py`: the implementations (tests/extension/toyplug_runtime.py);
- an entry point of the group `mloc.builtins` naming `toyplug.builtins:DESCRIPTORS` (here
  a `.dist-info` folder on the path, what `pip install` writes).

`mloc check` (no torch, no user code), `mloc plan` (`auto` chooses `onestep`, the cheapest
method that fits) and `mloc run` work on a program using them, and a schedule on `step`
changes the step: the first lower step with `cosine(warmup=4)` is 1/4 of the step without.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

HERE = Path(__file__).parent
PROGRAM = """program toy
import small as lib

problem net {
    module    = lib.Net(width=8)
    data      = lib.data(seed=0, batch_size=16)
    loss      = lib.weighted(net, weights, batch)
    optimizer = plain(step=0.1)
    schedule  = cosine(total=10, warmup=4)
}

problem weights {
    module    = lib.Weights()
    data      = lib.data(seed=10, batch_size=16)
    loss      = lib.ce(net, batch)
    optimizer = adam(lr=1e-2)
}

weights -> net { hypergrad = auto, unroll = 1 }

train { steps = 3  seed = 0  device = cpu }
"""

STEP = """import json, sys, torch, mloc
moved = {}
for name, sets in (("scheduled", []), ("constant", ["net.schedule=constant"])):
    s = mloc.load(sys.argv[1], set=sets, device="cpu")
    before = [p.detach().clone() for p in s.module("net").parameters()]
    s.step()
    after = list(s.module("net").parameters())
    moved[name] = sum(float((a - b).abs().sum()) for a, b in zip(after, before))
print(json.dumps(moved))
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, dict]:
    """The installed package (`site`), the program beside its module, and the environment."""
    root = tmp_path_factory.mktemp("extension")
    pkg = root / "site" / "toyplug"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(HERE / "extension" / "toyplug_builtins.py", pkg / "builtins.py")
    shutil.copy(HERE / "extension" / "toyplug_runtime.py", pkg / "runtime.py")
    meta = root / "site" / "toyplug-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text("[mloc.builtins]\ntoyplug = toyplug.builtins:DESCRIPTORS\n")
    shutil.copy(ROOT / "tests" / "run" / "small.py", root / "small.py")
    (root / "toy.mlo").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "site"), str(ROOT)])}
    return root, env


def _mloc(toy, *args: str) -> subprocess.CompletedProcess:
    root, env = toy
    return subprocess.run([sys.executable, "-m", "mloc", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_check_reads_the_package_without_torch_or_its_runtime(toy):
    root, env = toy
    code = ("import sys; from mloc.cli import main; rc = main(['check', 'toy.mlo']); "
            "print(rc, 'torch' in sys.modules, 'toyplug.runtime' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.split()[-3:] == ["0", "False", "False"], done.stdout + done.stderr


def test_auto_chooses_the_cheapest_method_that_fits(toy):
    done = _mloc(toy, "plan", "toy.mlo", "--json")
    assert done.returncode == 0, done.stderr
    (edge,) = json.loads(done.stdout)["edges"]
    assert edge["method"] == "onestep" and edge["args"] == {"scale": 1.0}
    assert edge["reason"] == "auto: onestep: one mixed product, the cheapest method that fits"


def test_run_trains_with_both(toy, tmp_path):
    done = _mloc(toy, "run", "toy.mlo", "--steps", "2", "--out", str(tmp_path / "r"), "--quiet")
    assert done.returncode == 0, done.stderr
    source = (tmp_path / "r" / "train.py").read_text()
    assert "optimizer=lambda lr: plain(step=lr)" in source and "onestep(scale=1.0)" in source


def test_the_schedule_drives_the_step_whatever_its_name(toy):
    """One outer step is one lower step of `net` (unroll 1): cosine's warm-up factor at
    step 0 is 1/4, so `net` moves a quarter as far as with the constant step."""
    root, env = toy
    done = subprocess.run([sys.executable, "-c", STEP, "toy.mlo"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    moved = json.loads(done.stdout.splitlines()[-1])
    print("net moved", moved)
    assert moved["constant"] > 0
    assert moved["scheduled"] / moved["constant"] == pytest.approx(0.25, rel=1e-5)
