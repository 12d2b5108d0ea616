"""A checkpoint carries a SHA-256 of its content, checked on load (issue 10, case 2): a
damaged byte anywhere is an error naming the file (exit 2), never a silent resume from
corrupt weights or an internal error; the file is left as it was."""

from __future__ import annotations

import ctypes
import os
import random

import pytest
import torch

from mloc.cli import main
from mloc.runtime.program.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tests.run.helpers import SMALL, _tree_equal


def run(*argv) -> int:
    return main(["run", str(SMALL), "--quiet", "--device", "cpu", *map(str, argv)])


def raw(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    assert run("--steps", 5, "--out", d) == 0
    return d


def flip(data: bytes, at: int, bit: int = 0) -> bytes:
    return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:]


def resume_fails(run_dir, tmp_path, broken: bytes, capsys) -> str:
    d = tmp_path / "broken"
    d.mkdir()
    for p in run_dir.iterdir():
        if p.is_file():
            (d / p.name).write_bytes(p.read_bytes())
    (d / "checkpoint.pt").write_bytes(broken)
    capsys.readouterr()
    assert run("--steps", 8, "--resume", d) == 2
    assert (d / "checkpoint.pt").read_bytes() == broken          # left as it was
    return capsys.readouterr().err


@pytest.mark.parametrize("what", ["parameter", "rng"])
def test_a_flipped_bit_in_a_tensor_is_found(run_dir, tmp_path, capsys, what):
    """Today's torch.load reads both without complaint: a parameter's flipped byte
    silently trains on, a flipped bit in the RNG state raised OverflowError (exit 101)."""
    data = (run_dir / "checkpoint.pt").read_bytes()
    state = load_checkpoint(run_dir / "checkpoint.pt", None)
    tensor = state["problems"]["net"]["params"][0] if what == "parameter" else state["rng"]["python"]["state"]
    at = data.find(raw(tensor))
    assert at > 0
    err = resume_fails(run_dir, tmp_path, flip(data, at + 5, bit=7), capsys)
    assert "checkpoint.pt is damaged: its content does not match its checksum" in err
    assert "E900" not in err and "Traceback" not in err


def test_any_flipped_byte_is_an_error_or_changes_nothing(run_dir):
    """200 random single-byte flips: each load either fails with a CheckpointError or
    gives back exactly the saved payload (a flip in a zip field nothing reads)."""
    path = run_dir / "checkpoint.pt"
    data, good = path.read_bytes(), load_checkpoint(path, None)
    rng, tmp = random.Random(0), run_dir.parent / "flipped.pt"
    errors = 0
    for _ in range(200):
        tmp.write_bytes(flip(data, rng.randrange(len(data)), rng.randrange(8)))
        try:
            assert _tree_equal(load_checkpoint(tmp, None), good)
        except CheckpointError as e:
            errors += 1
            assert str(tmp) in str(e) and e.help
    assert errors > 100                                # most bytes matter (padding does not)


def test_a_checkpoint_that_does_not_restore_is_a_checkpoint_error(run_dir, tmp_path, capsys):
    """A file whose checksum is right but whose content this program cannot restore."""
    state = load_checkpoint(run_dir / "checkpoint.pt", None)
    state["rng"]["python"]["state"] = state["rng"]["python"]["state"][:7]
    d = tmp_path / "odd"
    d.mkdir()
    save_checkpoint(d / "checkpoint.pt", state, "small_reweighting")
    before = (d / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    assert run("--steps", 8, "--resume", d) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {d / 'checkpoint.pt'} does not match this program") and "E900" not in err
    assert (d / "checkpoint.pt").read_bytes() == before


def test_the_unsafe_pickle_error_names_the_object(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    path = tmp_path / "evil.pt"
    torch.save({"format": 2, "program": "p", "payload": Evil()}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, None)
    assert "holds `posix.system`, which a checkpoint may not contain" in str(info.value)
    assert "not written by mloc" not in str(info.value) + info.value.help


def test_a_damaged_record_is_not_called_unsafe(run_dir, tmp_path):
    """Damage that breaks the pickle itself says so, not that mloc did not write it."""
    data = (run_dir / "checkpoint.pt").read_bytes()
    at = data.find(b"data.pkl") + 40                   # inside the pickle stream
    (tmp_path / "c.pt").write_bytes(data[:at] + b"\xff\xff\xff" + data[at + 3:])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path / "c.pt", None)
    assert "damaged" in str(info.value) and "not written by mloc" not in info.value.help
