"""The manifest of a sharded checkpoint (`checkpoint_form = sharded` under `strategy = zero`):
what each shard file is, and which rank's optimizer state holds which parameters.

A sharded checkpoint is ``checkpoint.pt`` (every replicated part: parameters, module
buffers, data positions, random generators, step counters, the selection's and compile
state, as a gathered checkpoint holds them, with the sharded problems' optimizer states left
out) plus one shard file per rank (``checkpoint.shard-STEP-TOKEN-RofN.pt``: that rank's
optimizer-state shard of each sharded problem). The manifest is JSON text, held in
``checkpoint.pt``'s payload under ``"shards"``, so ``checkpoint.pt`` is the commit point: its
atomic replace, after every shard is durable, switches from the previous checkpoint to the
new one at once (:mod:`mloc.runtime.program.sharded`). Its fields::

    {"format": 1, "kind": "mloc sharded checkpoint", "program": NAME, "step": S,
     "world": N, "strategy": "zero",
     "partition": {PROBLEM: [owner rank of parameter 0, of parameter 1, ...], ...},
     "files": [{"rank": R, "file": NAME, "bytes": B, "sha256": HEX}, ...]}   # one per rank, 0..N-1

``sha256`` is the SHA-256 of the shard file's bytes (the file also carries its own payload
digest, as every checkpoint: :func:`mloc.runtime.program.checkpoint.load_checkpoint`).
:meth:`Manifest.parse` checks all of it and turns anything wrong into a
:class:`~mloc.runtime.program.checkpoint.CheckpointError` naming ``checkpoint.pt``;
:func:`verify` checks a shard file against its entry (present, its size, its checksum).
File names are plain names in the run folder (no ``/``): a manifest cannot point elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from mloc.runtime.program.checkpoint import CheckpointError

FORMAT, KIND = 1, "mloc sharded checkpoint"
SHARD_NAME = re.compile(r"checkpoint\.shard-\d+-[0-9a-f]+-\d+of\d+\.pt")
_AGAIN = "resume from an earlier checkpoint or a backup of the run folder, or start again without --resume"
_KEEP = "nothing was deleted; checkpoint.pt and its shard files are only valid together"


def shard_name(step: int, token: str, rank: int, world: int) -> str:
    """The file of ``rank``'s shard of the step-``step`` checkpoint; ``token`` tells apart two
    checkpoints of one step (a Ctrl-C right after a `checkpoint every`)."""
    return f"checkpoint.shard-{step}-{token}-{rank}of{world}.pt"


@dataclass(frozen=True)
class ShardFile:
    rank: int
    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    program: str
    step: int
    world: int
    strategy: str
    partition: tuple[tuple[str, tuple[int, ...]], ...]     # (problem, owner rank of each parameter)
    files: tuple[ShardFile, ...]                            # ordered by rank

    def owners(self, problem: str) -> tuple[int, ...]:
        return dict(self.partition)[problem]

    def owned(self, problem: str, rank: int) -> list[int]:
        """The parameters of ``problem`` whose state ``rank``'s shard holds, in order."""
        return [i for i, r in enumerate(self.owners(problem)) if r == rank]

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "kind": KIND, "program": self.program, "step": self.step,
                           "world": self.world, "strategy": self.strategy,
                           "partition": {n: list(o) for n, o in self.partition},
                           "files": [vars(f) for f in self.files]}, sort_keys=True)

    @classmethod
    def parse(cls, text: object, path: Path) -> Manifest:
        """The manifest ``text`` held by the checkpoint ``path``; a :class:`CheckpointError`
        naming ``path`` and the entry for anything that is not a manifest this mloc wrote."""
        def bad(what: str) -> CheckpointError:
            return CheckpointError(path, f"{path} holds a shard manifest that {what}", _AGAIN + f" ({_KEEP})")
        try:
            data = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise bad("is not JSON of an mloc sharded checkpoint")
        if data.get("format") != FORMAT:
            raise CheckpointError(path, f"{path} has shard-manifest format {data.get('format')!r}, but this mloc "
                                        f"reads format {FORMAT}", "resume with the mloc version that wrote it")
        world = data.get("world")
        if not _count(world, 1) or not _count(data.get("step"), 0) or not isinstance(data.get("program"), str) \
                or data.get("strategy") != "zero":
            raise bad("lacks a valid program, step, world or strategy")
        partition = data.get("partition")
        if not isinstance(partition, dict) or not all(
                isinstance(o, list) and all(_count(r, 0) and r < world for r in o) for o in partition.values()):
            raise bad(f"has no valid partition (each problem's owner ranks, 0..{world - 1})")
        return cls(data["program"], data["step"], world, "zero",
                   tuple((str(n), tuple(o)) for n, o in partition.items()), _files(data.get("files"), world, bad))


def _count(x: object, low: int) -> bool:
    return type(x) is int and x >= low


def _files(entries: object, world: int, bad) -> tuple[ShardFile, ...]:
    """The manifest's ``files``: exactly one valid entry for each rank ``0..world-1``."""
    if not isinstance(entries, list):
        raise bad("has no list of shard files")
    out: dict[int, ShardFile] = {}
    for e in entries:
        ok = isinstance(e, dict) and set(e) == {"rank", "file", "bytes", "sha256"} and _count(e["rank"], 0) \
            and e["rank"] < world and isinstance(e["file"], str) and SHARD_NAME.fullmatch(e["file"]) is not None \
            and _count(e["bytes"], 0) and isinstance(e["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", e["sha256"])
        if not ok:
            raise bad(f"has an invalid shard entry {json.dumps(e)[:200]}")
        if e["rank"] in out:
            raise bad(f"lists rank {e['rank']}'s shard twice")
        out[e["rank"]] = ShardFile(**e)
    missing = [r for r in range(world) if r not in out]
    if missing:
        raise bad(f"lists no shard file for rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} "
                  f"of its {world}")
    return tuple(out[r] for r in range(world))


def present(directory: Path, entry: ShardFile, checkpoint: Path) -> Path:
    """``entry``'s file in ``directory``, checked to exist with the manifest's size (a
    :class:`CheckpointError` naming it otherwise); cheap, so every rank checks every shard."""
    path = Path(directory) / entry.file
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(path, f"{path}, rank {entry.rank}'s shard of the checkpoint {checkpoint}, is missing",
                              f"put the file back (from a backup or the folder it was copied from), or {_AGAIN}; "
                              f"{_KEEP}") from None
    except OSError as e:
        raise CheckpointError(path, f"{path} cannot be read ({e.strerror or e})",
                              "check the path and its permissions") from None
    if size != entry.bytes:
        raise CheckpointError(path, f"{path} is damaged: it has {size} bytes, the manifest in {checkpoint} says "
                                    f"{entry.bytes}", f"{_AGAIN}; {_KEEP}")
    return path


def verify(directory: Path, entry: ShardFile, checkpoint: Path) -> Path:
    """:func:`present`, and the file's bytes checked against the manifest's SHA-256."""
    path = present(directory, entry, checkpoint)
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise CheckpointError(path, f"{path} cannot be read ({e.strerror or e})",
                              "check the path and its permissions") from None
    if h.hexdigest() != entry.sha256:
        raise CheckpointError(path, f"{path} is damaged: its content does not match its checksum in the manifest "
                                    f"of {checkpoint}", f"{_AGAIN}; {_KEEP}")
    return path
