"""Reading a run folder's files back, checked (`mloc runs`, `mloc plot`, `--resume`): what
another program, an older or newer mloc, or a damaged disk left there is either what
mloc writes, or a :class:`Unreadable` naming the file and what is wrong (exit 2, or the
folder skipped with a note), never a crash further on. No torch here.

What a file must be (docs/reliability.md, "What a run folder may contain"):

- ``metrics.jsonl``: UTF-8; each line a JSON object, a record when it has ``"step"``: an
  integer step, a ``kind`` among :data:`~mloc.runtime.run.metrics.KINDS` names, a string
  ``problem``, and for an evaluation a string ``eval``. A line that is not JSON (the torn
  last line of a killed run) is skipped.
- ``config.json``: an object; ``"run"`` an object (a start's record), ``"resumes"`` a list of
  them; in a record ``steps`` an integer from 1 to 10^9, ``seed`` one from 0 to 2^63 - 1
  (:data:`BOUNDED`), ``nproc`` an integer, ``program`` an object whose ``set`` is a list of
  strings, ``name`` and ``file`` strings, ``directions`` an object of strings.
- ``summary.json``: an object; ``best`` an object (``metric``/``mode`` strings, ``value`` a
  number, ``step`` an integer) or null; ``final`` an object; ``steps_done`` an integer;
  ``status`` a string.

Each field may be missing or null (an older mloc wrote fewer); one of another type makes
the file unreadable.
"""

from __future__ import annotations

import json
from pathlib import Path

from mloc.shared.limits import MAX_SEED, MAX_STEPS
from mloc.runtime.files.runfolder import RunIOError

KINDS = ("train", "speed", "eval", "summary")
"""The kinds of record in ``metrics.jsonl`` (the schema: :mod:`mloc.runtime.run.metrics`)."""
INT, NUMBER, STR, OBJECT, LIST = (int,), (int, float), (str,), (dict,), (list,)

START = {"steps": INT, "seed": INT, "nproc": INT, "program": OBJECT}
BOUNDED = {"steps": (1, MAX_STEPS), "seed": (0, MAX_SEED)}
"""A resume takes these from the record (:mod:`mloc.runtime.files.resumption`): within mloc's
bounds (:mod:`mloc.shared.limits`), as the command line would have them."""
PROGRAM = {"set": LIST, "name": STR, "file": STR, "directions": OBJECT}
SUMMARY = {"best": OBJECT, "final": OBJECT, "steps_done": INT, "status": STR}
BEST = {"metric": STR, "mode": STR, "value": NUMBER, "step": INT}
RECORD = {"step": INT, "kind": STR, "problem": STR}


class Unreadable(RunIOError):
    """A run-folder file that is not what mloc writes: ``cannot read PATH: WHY`` (exit 2)."""

    def __init__(self, path: str | Path, why: str):
        super().__init__(path, why, "read")


def _wrong(obj: dict, fields: dict, where: str) -> str | None:
    """What is wrong with ``obj``'s ``fields`` (name -> allowed types; bool is no number)."""
    for name, types in fields.items():
        v = obj.get(name)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            return f"{where}{name} is {json.dumps(v)[:40]}, not {'an integer' if types is INT else 'a number' if types is NUMBER else 'a string' if types is STR else 'an object' if types is OBJECT else 'a list'}"
    return None


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RunIOError(path, e, "read") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise Unreadable(path, f"line {line} is not UTF-8 (byte {data[e.start]:#04x})") from None


def _object(path: Path) -> dict | None:
    """The JSON object in ``path``; None when there is no such file."""
    if not path.is_file():
        return None
    try:
        data = json.loads(_text(path))
    except ValueError as e:
        raise Unreadable(path, f"not JSON ({e})") from None
    if not isinstance(data, dict):
        raise Unreadable(path, "not a JSON object")
    return data


def metrics(path: Path) -> list[dict]:
    """The records of ``metrics.jsonl`` (:mod:`mloc.runtime.run.records` adds their ``kind``);
    FileNotFoundError without it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(path)
    out = []
    for n, line in enumerate(_text(path).splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or "step" not in record:
            continue
        wrong = _wrong(record, RECORD, "") or (
            "step is null" if record["step"] is None else
            f"kind {record['kind']!r} is none of {', '.join(KINDS)}" if record.get("kind") not in (None, *KINDS) else
            _wrong(record, {"eval": STR}, "") if record.get("kind") == "eval" or "eval" in record else None)
        if wrong:
            raise Unreadable(path, f"line {n}: {wrong}")
        out.append(record)
    return out


def _outside(start: dict, where: str) -> str | None:
    """What of ``start``'s :data:`BOUNDED` integers lies outside its bounds."""
    for name, (lo, hi) in BOUNDED.items():
        v = start.get(name)
        if isinstance(v, int) and not lo <= v <= hi:
            return f"{where}.{name} is {str(v)[:40]}, not in [{lo}, {hi}]"
    return None


def config(path: Path) -> dict | None:
    """``config.json`` checked; None when there is none."""
    data = _object(Path(path))
    if data is None:
        return None
    resumes = data.get("resumes")
    if resumes is not None and not isinstance(resumes, list):
        raise Unreadable(path, f"resumes is {json.dumps(resumes)[:40]}, not a list")
    for i, start in enumerate([data.get("run"), *(resumes or ())]):
        where = "run" if i == 0 else f"resumes[{i - 1}]"
        if start is None and i == 0:
            continue
        if not isinstance(start, dict):
            raise Unreadable(path, f"{where} is {json.dumps(start)[:40]}, not an object")
        program = start.get("program") or {}
        wrong = _wrong(start, START, f"{where}.") or _outside(start, where) or \
            _wrong(program, PROGRAM, f"{where}.program.") or (
            f"{where}.program.set holds a non-string" if any(not isinstance(s, str) for s in program.get("set") or ())
            else f"{where}.program.directions holds a non-string"
            if any(not isinstance(v, str) for v in (program.get("directions") or {}).values()) else None)
        if wrong:
            raise Unreadable(path, wrong)
    return data


def summary(path: Path) -> dict | None:
    """``summary.json`` checked; None when there is none."""
    data = _object(Path(path))
    if data is None:
        return None
    wrong = _wrong(data, SUMMARY, "") or _wrong(data.get("best") or {}, BEST, "best.")
    if wrong:
        raise Unreadable(path, wrong)
    return data
