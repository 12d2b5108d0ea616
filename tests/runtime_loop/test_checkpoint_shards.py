"""Sharded checkpoints' manifest and reading, without processes (the runs themselves are in
test_zero_shards_resume.py, slow tier): a two-rank checkpoint is laid out here as two ranks
of `strategy = zero` write it (each rank's shard of a whole Adam state, cut by
`Zero.owners`), and read back whole bitwise; every way a manifest or a shard can be wrong
is a CheckpointError naming the file, and nothing is deleted."""

from __future__ import annotations

import json

import pytest
import torch

from mloc.runtime.optim import adam, shards
from mloc.runtime.optim.zero import Zero
from mloc.runtime.program import sharded
from mloc.runtime.program.checkpoint import CheckpointError, save_checkpoint, state_to_tree
from mloc.runtime.program.manifest import Manifest, ShardFile, present, shard_name, verify
from tests.run.helpers import _tree_equal

WORLD, STEP = 2, 7
SHAPES = ((8, 4), (4,), (3, 8), (3,), (5,))


def _whole() -> tuple[list[torch.Tensor], dict]:
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
    state = adam(1e-2).init(params)
    state = state._replace(count=STEP, mu=tuple(torch.randn_like(p) for p in params),
                           nu=tuple(torch.rand(p.shape, generator=g, dtype=p.dtype) for p in params))
    return params, state_to_tree(state)


def _write(folder, whole=None) -> tuple[list, dict, Manifest]:
    """The checkpoint two zero ranks write: their shards, then checkpoint.pt with the manifest."""
    params, plain = whole or _whole()
    owners = Zero(adam(1e-2), 0, WORLD).owners(params)
    files = []
    for rank in range(WORLD):
        index = [i for i, o in enumerate(owners) if o == rank]
        name = shard_name(STEP, "ab12", rank, WORLD)
        size, sha = save_checkpoint(folder / name, {"step": STEP, "rank": rank, "world": WORLD, "problems": {
            "net": {"index": index, "state": shards.select(plain, index)}}}, "prog")
        files.append(ShardFile(rank, name, size, sha))
    manifest = Manifest("prog", STEP, WORLD, "zero", (("net", tuple(owners)),), tuple(files))
    save_checkpoint(folder / "checkpoint.pt", {"step": STEP, "problems": {"net": {"params": params, "optimizer": None}},
                                               "shards": manifest.to_json()}, "prog")
    return params, plain, manifest


def test_the_shards_join_into_the_whole_state_bitwise(tmp_path):
    params, plain, manifest = _write(tmp_path)
    assert set(manifest.owners("net")) == {0, 1}                   # both ranks hold a part
    got = sharded.gathered(tmp_path, "prog")
    assert "shards" not in got and got["step"] == STEP
    assert _tree_equal(got["problems"]["net"]["optimizer"], plain)
    assert all(torch.equal(a, b) for a, b in zip(got["problems"]["net"]["params"], params))


def test_the_manifest_round_trips_and_records_what_each_shard_file_is(tmp_path):
    _, _, manifest = _write(tmp_path)
    assert Manifest.parse(manifest.to_json(), tmp_path / "checkpoint.pt") == manifest
    data = json.loads(manifest.to_json())
    assert (data["format"], data["world"], data["step"], data["strategy"]) == (1, WORLD, STEP, "zero")
    for f in manifest.files:
        blob = (tmp_path / f.file).read_bytes()
        assert f.bytes == len(blob) and verify(tmp_path, f, tmp_path / "x") == tmp_path / f.file
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["checkpoint.pt", *(f.file for f in manifest.files)])


def _manifest_error(tmp_path, edit) -> str:
    _, _, manifest = _write(tmp_path)
    data = json.loads(manifest.to_json())
    edit(data)
    with pytest.raises(CheckpointError) as info:
        Manifest.parse(json.dumps(data), tmp_path / "checkpoint.pt")
    assert info.value.path == tmp_path / "checkpoint.pt" and info.value.help
    return str(info.value)


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["files"].pop(1), "lists no shard file for rank 1 of its 2"),
    (lambda d: d["files"].append(dict(d["files"][0])), "lists rank 0's shard twice"),
    (lambda d: d["files"][0].update(file="../../etc/passwd"), "invalid shard entry"),
    (lambda d: d["files"][1].update(sha256="00"), "invalid shard entry"),
    (lambda d: d["files"][1].update(bytes=-1), "invalid shard entry"),
    (lambda d: d["partition"]["net"].__setitem__(0, 2), "no valid partition"),
    (lambda d: d.update(world=0), "lacks a valid program, step, world"),
    (lambda d: d.update(kind="something"), "is not JSON of an mloc sharded checkpoint"),
    (lambda d: d.update(format=2), "shard-manifest format 2, but this mloc reads format 1"),
])
def test_a_manifest_that_does_not_hold_together_is_named(tmp_path, edit, says):
    assert says in _manifest_error(tmp_path, edit)


def test_text_that_is_not_json_is_no_manifest(tmp_path):
    for text in ("{", None, "[1, 2]"):
        with pytest.raises(CheckpointError, match="not JSON of an mloc sharded checkpoint"):
            Manifest.parse(text, tmp_path / "checkpoint.pt")


def _flip(path, at: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_damaged_shard_is_named_and_left_as_it_was(tmp_path):
    _, _, manifest = _write(tmp_path)
    shard = tmp_path / manifest.files[1].file
    broken = _flip(shard, len(shard.read_bytes()) // 2)             # the same size: only the checksum finds it
    with pytest.raises(CheckpointError) as info:
        sharded.gathered(tmp_path, "prog")
    assert info.value.path == shard and "is damaged: its content does not match its checksum" in str(info.value)
    assert "nothing was deleted" in info.value.help
    assert shard.read_bytes() == broken and (tmp_path / "checkpoint.pt").is_file()


def test_a_missing_or_cut_shard_is_named(tmp_path):
    _, _, manifest = _write(tmp_path)
    first, second = (tmp_path / f.file for f in manifest.files)
    whole = first.read_bytes()
    first.write_bytes(whole[:-10])
    with pytest.raises(CheckpointError, match=r"is damaged: it has \d+ bytes, the manifest in .* says \d+"):
        present(tmp_path, manifest.files[0], tmp_path / "checkpoint.pt")
    first.write_bytes(whole)
    second.unlink()
    with pytest.raises(CheckpointError) as info:
        sharded.gathered(tmp_path, "prog")
    assert info.value.path == second and "rank 1's shard of the checkpoint" in str(info.value) and \
        "is missing" in str(info.value)


def test_a_shard_of_another_checkpoint_is_refused(tmp_path):
    """A shard file replaced by one of another step (its manifest entry rewritten to match):
    its own record says so."""
    _, _, manifest = _write(tmp_path)
    params, plain = _whole()
    size, sha = save_checkpoint(tmp_path / manifest.files[1].file, {"step": STEP + 1, "rank": 1, "world": WORLD,
                                "problems": {"net": {"index": [], "state": plain}}}, "prog")
    files = (manifest.files[0], ShardFile(1, manifest.files[1].file, size, sha))
    fixed = Manifest("prog", STEP, WORLD, "zero", manifest.partition, files)
    save_checkpoint(tmp_path / "checkpoint.pt", {"step": STEP, "problems": {"net": {"params": params,
                                                 "optimizer": None}}, "shards": fixed.to_json()}, "prog")
    with pytest.raises(CheckpointError, match="does not hold what the manifest of .* says"):
        sharded.gathered(tmp_path, "prog")


def test_clean_removes_only_shards_no_manifest_names(tmp_path):
    _, _, manifest = _write(tmp_path)
    stale = tmp_path / shard_name(STEP - 2, "00ff", 0, WORLD)
    stale.write_bytes(b"old")
    (tmp_path / "notes.txt").write_text("mine")
    sharded.clean(tmp_path, keep={f.file for f in manifest.files})
    assert not stale.exists() and (tmp_path / "notes.txt").is_file()
    assert all((tmp_path / f.file).is_file() for f in manifest.files)


def test_the_setting_is_one_vocabulary_at_every_door(tmp_path):
    """`train { checkpoint_form = sharded }` (by `--set`) reaches train.py's defaults; a value
    not in the vocabulary is a diagnostic; the flag takes the same names, and the default is
    gathered."""
    import argparse

    from mloc.codegen.compile import compile_program
    from mloc.runtime.files.options import RunConfig, RunOptions, add_flags
    from mloc.shared.strategy import CHECKPOINT_FORMS
    from tests.conftest import PROGRAMS

    program = str(PROGRAMS / "data_reweighting.mlo")
    plain, asked = compile_program(program), compile_program(program, ("train.checkpoint_form=sharded",))
    assert plain.ok and asked.ok and "checkpoint_form" not in plain.source
    assert "checkpoint_form='sharded'" in asked.source
    bad = compile_program(program, ("train.checkpoint_form=scattered",))
    assert [(d.code, d.message) for d in bad.diagnostics] == [
        ("E305", "`checkpoint_form` must be one of `gathered`, `sharded`, got `scattered`")]
    p = argparse.ArgumentParser()
    add_flags(p)
    assert RunConfig(1, 0, "cpu", "fp32").checkpoint_form == "gathered" == CHECKPOINT_FORMS[0]
    options = RunOptions.parsed(p.parse_args(["--checkpoint-form", "sharded"]))
    assert options.config(RunConfig(1, 0, "cpu", "fp32")).checkpoint_form == "sharded"
    assert options.argv()[-2:] == ["--checkpoint-form", "sharded"]
    with pytest.raises(SystemExit):
        p.parse_args(["--checkpoint-form", "scattered"])
