"""Sharded checkpoints of a `strategy = zero` run (`checkpoint_form = sharded`): each rank
writes its own optimizer-state shard, rank 0 the replicated rest and the manifest
(:mod:`mloc.runtime.program.manifest` has the layout); they resume into any world size and
strategy, and in one process.

**Writing** (:func:`save`, every rank calls):

1. every rank snapshots its state (its shard only: nothing is gathered) and writes its shard
   file atomically and durably (:func:`~mloc.runtime.program.checkpoint.save_checkpoint`:
   a temporary file, fsync, rename, fsync of the folder), under a new name (the step and a
   token rank 0 draws), so no file of the checkpoint on disk is touched;
2. the ranks exchange what they wrote (name, bytes, SHA-256, or the error): that is the
   barrier; when any rank failed, the new shards are removed and every rank raises
   (the previous checkpoint stays the last good one);
3. rank 0 checks that it sees every shard with its size (a run folder not shared by every
   node is reported here), then replaces ``checkpoint.pt`` (the replicated parts and the
   manifest): the commit point. A crash before it leaves the previous checkpoint whole;
4. only then the shard files no manifest names (the previous checkpoint's) are removed.

A gathered checkpoint written into the folder afterwards (a resume under `ddp` or in one
process) removes every shard file once its ``checkpoint.pt`` is in place (:func:`clean`).

**Reading** (:func:`load`, every rank calls): ``checkpoint.pt`` is read as any checkpoint;
a sharded one has its manifest checked, and every shard file's presence and size. A
problem whose optimizer is sharded here the way the manifest says (`zero`, the same world
size, hence the same partition: :func:`mloc.runtime.optim.shards.owners` is a function of
the shapes) takes this rank's shard alone (its file's checksum verified); any other (another
world size, `ddp`, one process) reads every shard (each verified) and joins them into the
whole state (:func:`mloc.runtime.optim.shards.join`), which the problem's optimizer then cuts
to its own shard or keeps whole, as for a gathered checkpoint.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import torch.distributed as torch_dist

from mloc.runtime.files.runfolder import CHECKPOINT, SHARDS, RunIOError, check_owner
from mloc.runtime.optim import shards
from mloc.runtime.optim.zero import Zero
from mloc.runtime.program.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from mloc.runtime.program.manifest import Manifest, ShardFile, present, shard_name, verify

_CHANGED = "the program changed since the checkpoint was written; start again without --resume"


def wanted(program) -> bool:
    """Whether ``program`` writes sharded checkpoints: asked for, and its optimizer states
    sharded (`zero` with more than one process; otherwise there is nothing to shard)."""
    return program.config.checkpoint_form == "sharded" and program.strategy[0] == "zero" \
        and any(isinstance(lv.problem.optimizer, Zero) for lv in program.live.values())


def save(program, out: Path, owner: int | None = None, extra: dict | None = None) -> Path:
    """Write the sharded checkpoint of ``program`` into ``out`` (module docstring); every
    rank calls. ``owner``: the pid that must hold the folder's lock; ``extra``: entries
    added to the replicated part (the selection's, the compile state)."""
    out, dist = Path(out), program.dist
    if dist.is_main and owner is not None:
        check_owner(out, owner)
    state = program.state_dict(sharded=True)
    step = int(state["step"])
    name = shard_name(step, _token(dist.world), dist.rank, dist.world)
    sharded = {n: p["optimizer"]["shard"] for n, p in state["problems"].items()
               if isinstance(p["optimizer"], dict) and set(p["optimizer"]) == {"shard"}}
    try:
        size, sha = save_checkpoint(out / name, {"step": step, "rank": dist.rank, "world": dist.world,
                                                 "problems": sharded}, program.name)
        mine: tuple = (True, ShardFile(dist.rank, name, size, sha))
    except RunIOError as e:
        mine = (False, e)
    reports = _exchange(mine, dist.world)
    _raise_failed(reports, out, dist)
    if dist.is_main:
        files = tuple(f for _, f in reports)
        manifest = Manifest(program.name, step, dist.world, "zero",
                            tuple((n, tuple(program.live[n].problem.optimizer.owners(program.live[n].problem.params)))
                                  for n in sharded), files)
        _visible(out, files)
        for n in sharded:
            state["problems"][n]["optimizer"] = None
        save_checkpoint(out / CHECKPOINT, {**state, **(extra or {}), "shards": manifest.to_json()}, program.name)
        clean(out, keep={f.file for f in files})
    dist.barrier()
    return out / CHECKPOINT


def _token(world: int) -> str:
    """Rank 0's random token, the same on every rank."""
    token = [secrets.token_hex(4)]
    if world > 1:
        torch_dist.broadcast_object_list(token, src=0)
    return token[0]


def _exchange(mine: tuple, world: int) -> list[tuple]:
    """Every rank's report of its shard write (the barrier before the commit)."""
    if world == 1:
        return [mine]
    out: list = [None] * world
    torch_dist.all_gather_object(out, (mine[0], mine[1] if mine[0] else str(mine[1])))
    return out


def _raise_failed(reports: list[tuple], out: Path, dist) -> None:
    """When a rank could not write its shard: rank 0 removes the new shards (the previous
    checkpoint is untouched), and every rank raises the first failure."""
    failed = [(r, why) for r, (ok, why) in enumerate(reports) if not ok]
    if not failed:
        return
    if dist.is_main:
        for ok, f in reports:
            if ok:
                (out / f.file).unlink(missing_ok=True)
    rank, why = failed[0]
    raise RunIOError(out, f"rank {rank} could not write its checkpoint shard ({why}); the checkpoint on disk, if "
                          "any, is the previous one")


def _visible(out: Path, files: tuple[ShardFile, ...]) -> None:
    """Every shard where rank 0 writes the manifest, with its size: ranks on other machines
    must write into the same (shared) folder."""
    for f in files:
        try:
            size = (out / f.file).stat().st_size
        except OSError:
            size = None
        if size != f.bytes:
            raise RunIOError(out / f.file, f"rank {f.rank} wrote it, but rank 0 does not see it whole; a sharded "
                                           "checkpoint needs a run folder every machine shares (or use "
                                           "--checkpoint-form gathered)", "find")


def clean(out: Path, keep: set[str] = frozenset()) -> None:
    """Remove the shard files in ``out`` that the checkpoint there does not name (``keep``)."""
    for p in Path(out).glob(SHARDS):
        if p.name not in keep:
            try:
                p.unlink()
            except OSError:
                pass        # an old shard left behind does no harm: no manifest names it


def load(program, directory: Path) -> dict:
    """The payload of ``directory/checkpoint.pt`` as a gathered checkpoint holds it, a sharded
    one's optimizer states put in from their shards (module docstring); every rank calls.
    Every failure is a :class:`CheckpointError` naming the file."""
    path = Path(directory) / CHECKPOINT
    payload = load_checkpoint(path, program.name)
    if "shards" not in payload:
        return payload
    manifest, read = _opened(payload, path, program.name)
    for name, owners in manifest.partition:
        lv = program.live.get(name)
        if lv is None or len(owners) != len(lv.problem.params):
            raise CheckpointError(path, f"{path} shards problem `{name}`'s optimizer state over {len(owners)} "
                                        "parameters, which this program does not have", _CHANGED)
        opt = lv.problem.optimizer
        if isinstance(opt, Zero) and opt.world == manifest.world and opt.owners(lv.problem.params) == owners:
            payload["problems"][name]["optimizer"] = {"shard": read.part(program.dist.rank, name)}
        else:
            payload["problems"][name]["optimizer"] = read.whole(name)
    return payload


def gathered(directory: Path, program: str | None = None) -> dict:
    """The payload of ``directory/checkpoint.pt`` with every optimizer state whole, a
    sharded checkpoint's joined from all its shards (each verified): what a gathered
    checkpoint of the same state holds, bit for bit. ``program``: as for
    :func:`~mloc.runtime.program.checkpoint.load_checkpoint`."""
    path = Path(directory) / CHECKPOINT
    payload = load_checkpoint(path, program)
    if "shards" in payload:
        manifest, read = _opened(payload, path, program)
        for name, _ in manifest.partition:
            payload["problems"][name]["optimizer"] = read.whole(name)
    return payload


def _opened(payload: dict, path: Path, program: str | None) -> tuple[Manifest, _Reader]:
    """The manifest taken out of ``payload`` and checked against it, and every shard file
    checked present with its size."""
    manifest = Manifest.parse(payload.pop("shards"), path)
    problems = payload.get("problems")
    if manifest.step != payload.get("step") or not isinstance(problems, dict) \
            or (program is not None and manifest.program != program) \
            or any(n not in problems for n, _ in manifest.partition):
        raise CheckpointError(path, f"{path}'s shard manifest (step {manifest.step}, problems "
                                    f"{', '.join(n for n, _ in manifest.partition)}) does not match its payload",
                              "resume from an earlier checkpoint or a backup, or start again without --resume")
    for f in manifest.files:
        present(path.parent, f, path)
    return manifest, _Reader(path, manifest, program)


class _Reader:
    """The shard files of one checkpoint, each verified and read once, checked against the
    manifest (its rank, step, and the parameters each problem's part holds)."""

    def __init__(self, checkpoint: Path, manifest: Manifest, program: str | None):
        self.checkpoint, self.manifest, self.program, self._read = checkpoint, manifest, program, {}

    def part(self, rank: int, problem: str) -> dict:
        entry = self.manifest.files[rank]
        if rank not in self._read:
            path = verify(self.checkpoint.parent, entry, self.checkpoint)
            self._read[rank] = (path, load_checkpoint(path, self.program))
        path, shard = self._read[rank]
        part = shard.get("problems", {}).get(problem) if isinstance(shard.get("problems"), dict) else None
        if (shard.get("rank"), shard.get("world"), shard.get("step")) != (rank, self.manifest.world, self.manifest.step) \
                or not isinstance(part, dict) or part.get("index") != self.manifest.owned(problem, rank) \
                or "state" not in part:
            raise CheckpointError(path, f"{path} does not hold what the manifest of {self.checkpoint} says (rank "
                                        f"{rank}'s shard of `{problem}` at step {self.manifest.step})",
                                  "resume from an earlier checkpoint or a backup, or start again without --resume")
        return part

    def whole(self, problem: str) -> dict:
        """``problem``'s whole optimizer state, joined from every rank's shard."""
        parts = [(self.part(r, problem)["index"], self.part(r, problem)["state"]) for r in range(self.manifest.world)]
        try:
            return shards.join(parts, len(self.manifest.owners(problem)))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(self.checkpoint, f"the shards of {self.checkpoint} do not join into `{problem}`'s "
                                                   f"state ({e})", _CHANGED) from None
