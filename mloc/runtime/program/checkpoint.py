"""Checkpoints: atomic writes, safe loads, optimizer states and RNG streams as plain trees.

A checkpoint file is ``torch.save`` of ``{"format": FORMAT_VERSION, "program": NAME,
"sha256": DIGEST, "payload": PAYLOAD}``, where DIGEST is :func:`digest` of the program
name and the payload: every leaf with its path, type, dtype, shape and raw bytes, so one
flipped bit anywhere in the payload is found on load. The payload is a **tree** of tensors, numbers (``int``, ``float``,
``bool``), strings, ``None``, and plain ``list``/``tuple``/``dict`` containers (no
subclasses: a NamedTuple would need its class to load). It is read back with
``torch.load(weights_only=True)``, which executes no code from the file.

- :func:`save_checkpoint` serialises in memory, writes a temporary file in the target's
  directory, flushes and fsyncs it, then ``os.replace``\\ s it over the target (and fsyncs
  the directory): a crash at any point leaves either the old checkpoint or the new one
  under the final name, never a partial file. A failed write (a full disk) removes the
  temporary file and raises :class:`~mloc.runtime.files.runfolder.RunIOError`.
- :func:`load_checkpoint` turns every way a file can be wrong (missing, truncated, not a
  checkpoint, an object of a disallowed type, another format version or program, a
  checksum that does not match) into a :class:`CheckpointError` with a one-sentence
  message naming the file and a ``help``.
- :func:`state_to_tree` / :func:`tree_to_state` convert optimizer states (pytrees of any
  shape) to plain trees and back, bit for bit, checking the structure against a freshly
  initialised state (:func:`mloc.runtime.base.tree.to_plain` / ``from_plain``).
- :func:`capture_rng` / :func:`restore_rng` save and restore Python's ``random``, torch's
  CPU generator and, when CUDA is available, every CUDA device's generator.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
import pickle
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

from mloc.runtime.base import tree
from mloc.runtime.files.runfolder import RunIOError

FORMAT_VERSION = 2
_ZIP_MAGIC = b"PK\x03\x04"
_NOT_OURS = "check the path; only files written by mloc's checkpointing can be resumed from"


class CheckpointError(Exception):
    """A checkpoint that cannot be used. ``str()`` is one sentence naming the file and what
    is wrong; ``help`` says what to do. ``path`` is ``None`` for a state that does not match
    the program (:func:`tree_to_state`)."""

    def __init__(self, path: str | os.PathLike | None, message: str, help: str):
        super().__init__(message)
        self.path, self.message, self.help = path, message, help


def save_checkpoint(path: str | os.PathLike, payload: dict, program: str) -> tuple[int, str]:
    """Atomically write ``payload`` (a tree, see the module docstring) for ``program``;
    returns the file's size in bytes and the SHA-256 of its bytes (what a sharded
    checkpoint's manifest records of each shard: :mod:`mloc.runtime.program.manifest`).

    Raises ``TypeError`` naming the offending entry when the payload holds anything but
    tensors, numbers, strings, ``None`` and plain containers, and
    :class:`~mloc.runtime.files.runfolder.RunIOError` when the file system refuses the write;
    nothing is left behind then (an earlier checkpoint at ``path`` stays as it was).
    """
    _check_tree(payload, "payload")
    path = Path(path)
    buf = io.BytesIO()
    torch.save({"format": FORMAT_VERSION, "program": program, "sha256": digest(program, payload),
                "payload": payload}, buf)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise RunIOError(path, e) from None
    except BaseException:
        _remove(tmp)
        raise
    _fsync_dir(path.parent)
    return buf.getbuffer().nbytes, hashlib.sha256(buf.getbuffer()).hexdigest()


def _remove(tmp: str | None) -> None:
    if tmp is not None:
        try:
            Path(tmp).unlink(missing_ok=True)
        except OSError:
            pass


def digest(program: str, payload: Any) -> str:
    """SHA-256 of ``program`` and every leaf of ``payload`` in a fixed order: its path, its
    type, and for a tensor its dtype, shape and raw bytes (read in place on the CPU)."""
    h = hashlib.sha256(program.encode())
    _feed(h, payload, "")
    return h.hexdigest()


def _feed(h, x: Any, where: str) -> None:
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(f"{where}:tensor:{t.dtype}:{tuple(t.shape)}\n".encode())
        n = t.numel() * t.element_size()
        if n:
            h.update(memoryview((ctypes.c_char * n).from_address(t.data_ptr())))
    elif type(x) in (list, tuple):
        h.update(f"{where}:{type(x).__name__}:{len(x)}\n".encode())
        for i, v in enumerate(x):
            _feed(h, v, f"{where}[{i}]")
    elif type(x) is dict:
        h.update(f"{where}:dict:{len(x)}\n".encode())
        for k, v in x.items():
            _feed(h, v, f"{where}[{k!r}]")
    else:
        h.update(f"{where}:{type(x).__name__}:{x!r}\n".encode())


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_tree(x: Any, where: str) -> None:
    if isinstance(x, torch.Tensor) or x is None or type(x) in (int, float, bool, str):
        return
    if type(x) in (list, tuple):
        for i, v in enumerate(x):
            _check_tree(v, f"{where}[{i}]")
        return
    if type(x) is dict:
        for k, v in x.items():
            if type(k) not in (str, int):
                raise TypeError(f"checkpoint {where} has a key of type {type(k).__name__}; "
                                "use str or int keys")
            _check_tree(v, f"{where}[{k!r}]")
        return
    hint = " (convert optimizer states with state_to_tree)" if isinstance(x, tuple) else ""
    raise TypeError(f"checkpoint {where} is a {type(x).__name__}, which a checkpoint cannot hold{hint}")


def load_checkpoint(path: str | os.PathLike, program: str | None) -> dict:
    """The payload saved at ``path``, on the CPU; checks the format version, the checksum
    and, unless ``program`` is ``None``, that ``program`` wrote it. Every failure is a
    :class:`CheckpointError`; the file is only read."""
    record = _read(Path(path))
    if type(record) is not dict or "format" not in record or "payload" not in record:
        raise CheckpointError(path, f"{path} is a PyTorch file but not an mloc checkpoint", _NOT_OURS)
    if record["format"] != FORMAT_VERSION:
        raise CheckpointError(path, f"{path} has checkpoint format {record['format']!r}, but this mloc "
                                    f"reads format {FORMAT_VERSION}",
                              "resume with the mloc version that wrote it, or start again without --resume")
    name = record.get("program")
    if type(name) is not str or record.get("sha256") != digest(name, record["payload"]):
        raise CheckpointError(path, f"{path} is damaged: its content does not match its checksum",
                              "resume from an earlier checkpoint or a backup, or start again without --resume")
    if program is not None and name != program:
        raise CheckpointError(path, f"{path} was written by program `{name}`, not `{program}`",
                              "pass the checkpoint of this program, or start again without --resume")
    return record["payload"]


_DAMAGED = "resume from an earlier checkpoint or a backup, or start again without --resume"


def _read(path: Path) -> Any:
    """``torch.load`` with every failure mapped to a :class:`CheckpointError`."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise CheckpointError(path, f"checkpoint {path} does not exist",
                              "check the path, or start again without --resume") from None
    except OSError as e:
        raise CheckpointError(path, f"checkpoint {path} cannot be read ({e.strerror or e})",
                              "check the path and its permissions") from None
    if head != _ZIP_MAGIC:
        raise CheckpointError(path, f"{path} is not a checkpoint (it is not a PyTorch zip file)", _NOT_OURS)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        forbidden = _forbidden(str(e))
        if forbidden is None:
            raise CheckpointError(path, f"{path} is truncated or damaged (its records cannot be read)",
                                  _DAMAGED) from None
        raise CheckpointError(path, f"{path} holds `{forbidden}`, which a checkpoint may not contain "
                                    "(loading it could run code)",
                              "load only checkpoints you trust; mloc never writes such objects") from None
    except Exception:
        raise CheckpointError(path, f"{path} is truncated or damaged (its zip archive cannot be read)",
                              _DAMAGED) from None


def _forbidden(message: str) -> str | None:
    """The global that ``weights_only`` refused (``posix.system``), from torch's message."""
    import re

    m = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", message)
    return m.group(1) if m else None


# --- optimizer states --------------------------------------------------------------------

state_to_tree = tree.to_plain


def tree_to_state(plain: Any, like: Any, where: str = "state") -> Any:
    """:func:`mloc.runtime.base.tree.from_plain`, a mismatch reported as a
    :class:`CheckpointError` naming the entry."""
    try:
        return tree.from_plain(plain, like, where)
    except tree.StructureMismatch as e:
        raise CheckpointError(None, f"the checkpoint's `{e.where}` {e.what}",
                              "the program changed since the checkpoint was written; resume with the "
                              "program that wrote it, or start again without --resume") from None


# --- random number generators ------------------------------------------------------------

def capture_rng() -> dict:
    """The state of Python's ``random``, torch's CPU generator and (when CUDA is available)
    each CUDA device's generator, as tensors and ints. numpy's generator is not captured."""
    version, internal, gauss = random.getstate()
    tree = {"python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                       "gauss": torch.tensor([] if gauss is None else [gauss], dtype=torch.float64)},
            "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tree["cuda"] = list(torch.cuda.get_rng_state_all())
    return tree


def restore_rng(tree: dict) -> None:
    """Restore what :func:`capture_rng` captured. CUDA states are restored for the devices
    present in both the tree and this machine."""
    py = tree["python"]
    gauss = py["gauss"].tolist()
    random.setstate((int(py["version"]), tuple(py["state"].tolist()), gauss[0] if gauss else None))
    torch.set_rng_state(tree["torch"])
    if "cuda" in tree and torch.cuda.is_available():
        for i, state in enumerate(tree["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, i)
