"""What a run folder records, each file written atomically (a temporary file, then a
rename): ``config.json`` (the first start's record under "run", each resume's appended to
"resumes", amended once the program is built), and ``metrics.jsonl`` cut back to a
checkpoint's step on resume, so that it stays one history. Errors are mloc's own I/O
errors (:class:`~mloc.runtime.files.runfolder.RunIOError`). No torch here."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mloc.runtime.files.runfolder import CONFIG, METRICS, RunIOError


def write_config(directory: Path, record: dict) -> None:
    """``config.json``: the first start's ``record`` under "run", each resume's appended
    to "resumes"."""
    path = Path(directory) / CONFIG
    try:
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        old = None
    resumes = old.get("resumes") if isinstance(old, dict) else None
    data = {"run": record, "resumes": []} if not isinstance(old, dict) or not isinstance(old.get("run"), dict) else \
        {**old, "resumes": (resumes if isinstance(resumes, list) else []) + [record]}
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def amend_config(directory: Path, **fields) -> None:
    """Add ``fields`` to the record of the latest start in ``config.json`` (what is known
    only once the program is built: the threads chosen for it); nothing without the file."""
    path = Path(directory) / CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(data, dict) or not isinstance(data.get("run"), dict):
        return
    resumes = data.get("resumes")
    latest = resumes[-1] if isinstance(resumes, list) and resumes and isinstance(resumes[-1], dict) else data["run"]
    latest.update(fields)
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically (a temporary file, then a rename); :class:`RunIOError`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunIOError(path, e) from None


def truncate_metrics(directory: Path, step: int) -> None:
    """Keep the records of ``metrics.jsonl`` up to ``step`` (those a resume from a
    step-``step`` checkpoint repeats go), so the file stays one history; none for step 0."""
    path = Path(directory) / METRICS
    if not path.is_file():
        return
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except OSError as e:
        raise RunIOError(path, e, "read") from None
    except UnicodeDecodeError as e:
        raise RunIOError(path, f"it is not UTF-8 (byte {e.object[e.start]:#04x} at offset {e.start})", "read") from None
    keep = [line for line in lines if line.endswith("\n") and _step(line) is not None and _step(line) <= step]
    if step == 0:
        keep = []
    if keep != lines:
        write_text(path, "".join(keep))


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def own_file(path: Path) -> None:
    """Make ``path`` the run folder's own file before appending to it: a symlink (to a file
    outside the folder, say) is replaced by a regular copy of what it points to, which is
    left untouched, as a symlinked ``checkpoint.pt`` is replaced by the rename that writes it."""
    path = Path(path)
    if not path.is_symlink():
        return
    try:
        data = path.read_bytes() if path.exists() else b""
    except OSError:
        data = b""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunIOError(path, e) from None
