"""`mloc run` over the example programs with random valid `--set` overrides and random
`--device`/`--precision`/`--dtype` choices never ends in exit 101 (issue 10, case 6): a device or
precision this torch lacks is exit 2, a method that does not fit the program is exit 1 or
2 with a diagnostic, everything else trains. A few draws in the default tier, more in the
slow one; each run is 2 steps in this process."""

from __future__ import annotations

import random

import pytest

from mloc.cli import main
from tests.conftest import PROGRAMS

EDGES = {"data_reweighting": ["weight_net->classifier"], "maml": ["meta->adapt"], "hpo": ["decay->model"],
         "trilevel": ["strength->weight_net", "weight_net->classifier"]}
PROBLEMS = {"data_reweighting": ["classifier", "weight_net"], "maml": ["meta", "adapt"],
            "hpo": ["model", "decay"], "trilevel": ["classifier", "weight_net", "strength"]}
METHODS = ["first_order", "neumann(iters=2, alpha=0.1)", "cg(iters=3)", "finite_diff(eps=0.01)",
           "sama(eps=0.01)", "itd(steps=2)", "auto"]
OPTIMIZERS = ["sgd(lr=0.01)", "sgd(lr=0.01, momentum=0.9)", "adam(lr=1e-3)", "adamw(lr=1e-3)",
              "shampoo(lr=1e-3, update_every=1, start_preconditioning_step=0)",
              "shampoo(lr=1e-3, update_every=2, staleness=1, async_roots=true, graft=\"adam\")"]
DEVICES = [None, "cpu", "auto", "cuda", "cuda:1"]   # mps: test_a_device_type_this_torch_lacks
PRECISIONS = [None, "fp32", "bf16", "fp16"]
DTYPES = [None, None, "float32", "float64"]


def draw(rng: random.Random) -> list[str]:
    program = rng.choice(sorted(EDGES))
    argv = ["run", str(PROGRAMS / f"{program}.mlo"), "--steps", "2", "--quiet", "--overwrite"]
    for edge in EDGES[program]:
        if rng.random() < 0.6:
            argv += ["--set", f"{edge}.hypergrad={rng.choice(METHODS)}"]
        if rng.random() < 0.3:
            argv += ["--set", f"{edge}.unroll={rng.randint(1, 3)}"]
    for problem in PROBLEMS[program]:
        if rng.random() < 0.3:
            argv += ["--set", f"{problem}.optimizer={rng.choice(OPTIMIZERS)}"]
    for flag, choices in (("--device", DEVICES), ("--precision", PRECISIONS), ("--dtype", DTYPES)):
        choice = rng.choice(choices)
        argv += [flag, choice] if choice else []
    return argv


def check(seed: int, tmp_path, capsys) -> None:
    argv = draw(random.Random(seed)) + ["--out", str(tmp_path / str(seed))]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), (argv, err)
    assert "E900" not in err and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("seed", range(4))
def test_random_runs_never_end_in_an_internal_error(seed, tmp_path, capsys):
    check(seed, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 40))
def test_many_random_runs_never_end_in_an_internal_error(seed, tmp_path, capsys):
    check(seed, tmp_path, capsys)


def test_a_device_type_this_torch_lacks_is_a_usage_error(tmp_path, capsys):
    import torch
    if torch.backends.mps.is_available():
        pytest.skip("this torch has MPS")
    rc = main(["run", str(PROGRAMS / "hpo.mlo"), "--steps", "1", "--quiet", "--device", "mps",
               "--out", str(tmp_path)])
    assert rc == 2 and "E900" not in capsys.readouterr().err


@pytest.mark.parametrize("device", ["meta", "cpu:0x", "xla"])
def test_a_device_that_cannot_train_is_a_usage_error(device, tmp_path, capsys):
    """A device torch parses but mloc cannot train on (meta tensors hold no data; a type
    mloc does not run on) or cannot parse: exit 2 before any work, not an internal error
    at the first host read."""
    rc = main(["run", str(PROGRAMS / "hpo.mlo"), "--steps", "1", "--quiet", "--device", device,
               "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "E900" not in err and device in err

