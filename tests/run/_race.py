"""Race N processes for run folders (for the tests):

    python -m tests.run._race N ROOT

Each folder ``ROOT/rK`` is one round. The N processes, forked once, meet at a barrier
before each round, then each does what ``mloc run --out ROOT/rK`` does to open its
folder: :func:`~mloc.runtime.files.runfolder.choose`, then
:class:`~mloc.runtime.files.runfolder.RunFolder`. One that gets the folder "trains" (appends a
record naming itself to ``metrics.jsonl``, as a first step does), then checks that the
folder is still its own (:func:`~mloc.runtime.files.runfolder.check_owner`, as every checkpoint
does) before it lets go. Prints one JSON line per process and round:
``{"round": K, "pid": ..., "result": "owner" | "lost" | "refused", "message": ...}``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

from mloc.runtime.files.runfolder import METRICS, RunFolder, RunFolderError, check_owner, choose


def _one(folder: Path) -> tuple[str, str]:
    try:
        with RunFolder(choose(folder, None, False, "race")) as f:
            with open(f.dir / METRICS, "a", encoding="utf-8") as m:
                m.write(json.dumps({"step": 1, "pid": os.getpid()}) + "\n")
            time.sleep(0.002)
            try:
                check_owner(f.dir, os.getpid())
            except RunFolderError as e:
                return "lost", str(e)
            return "owner", ""
    except RunFolderError as e:
        return "refused", str(e)


def _worker(folders: list[Path], barrier, results) -> None:
    for k, folder in enumerate(folders):
        barrier.wait()
        result, message = _one(folder)
        results.put({"round": k, "pid": os.getpid(), "result": result, "message": message})


def main() -> None:
    n, root = int(sys.argv[1]), Path(sys.argv[2])
    folders = sorted((p for p in root.iterdir() if p.name.startswith("r")), key=lambda p: int(p.name[1:]))
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(folders, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    for _ in range(n * len(folders)):
        print(json.dumps(results.get(timeout=300)), flush=True)
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
