"""`mloc run --nnodes M --node-rank R --rdzv-endpoint HOST:PORT [--nproc N]`: one run on M machines.

The same command runs on every machine, each with its own ``--node-rank``. Each machine's
`mloc run` is a launcher (:func:`mloc.runtime.processes.workers.supervise`) for its own N
workers, so everything that launcher promises holds on each machine: the workers die with
it (``PR_SET_PDEATHSIG``), one report for a failure, Ctrl-C stops with a checkpoint.

**How the machines meet: a static rendezvous.** Every worker gets torchrun's variables as
torchrun's static rendezvous (its default backend) would set them:

    RANK = node_rank * nproc + local_rank        WORLD_SIZE = nnodes * nproc
    LOCAL_RANK = local_rank, LOCAL_WORLD_SIZE = nproc, GROUP_RANK = node_rank
    MASTER_ADDR:MASTER_PORT = --rdzv-endpoint    (rank 0, on node 0, listens there)

so rank numbers, and with them each rank's data shard, are the same as in one machine's
``--nproc M*N`` run: a run on two machines of one process equals ``--nproc 2`` on one,
bitwise (the collectives see the same ranks in the same order), and ``train.py`` under
``torchrun --nnodes M --node-rank R --nproc-per-node N --master-addr HOST --master-port
PORT`` numbers its ranks the same way (``--print-torchrun`` prints those commands). mloc
does not run its workers under torchrun's elastic agent (``torch.distributed.run``):
the agent restarts failed workers (a restart would silently repeat steps past the last
checkpoint, and mloc's resume is the way back), reports a failure as a ``ChildFailedError``
with every rank's traceback, and does not tie its workers' lives to its own; a static
rendezvous needs nothing the elastic one adds for a job whose size is fixed.

**Joining.** The workers join within ``--rdzv-timeout`` (default 600 s; joining only, the
collectives keep their own timeout: :class:`mloc.runtime.base.distributed.Join`). A
machine whose workers wait says so after 15 s, with each machine's command
(:func:`mloc_commands`), and one whose workers could not join reports once, exit 2
(:mod:`mloc.runtime.processes.joining`).

**What each machine writes.** Node 0 owns the run: its launcher opens the run folder
(``--out``, or a fresh ``runs/PROGRAM/N``) and holds its lock, rank 0 (on node 0) logs and
writes the checkpoints there. The other machines write nothing in it: each compiles its
``train.py`` into a scratch folder of its own (``TMPDIR/mloc-node-PID-START-*``, locked by
its launcher as a run folder is, removed when it ends and by the next start if it was
killed; :mod:`mloc.runtime.files.scratch`), their ``--out`` is ignored, and ``--resume DIR``
reads ``DIR/checkpoint.pt`` on each machine (a shared file system, or a copy).

**When a machine goes.** A worker whose collective fails because a rank on another
machine died (its launcher killed, its machine gone: gloo sees the connection closed, or
its timeout pass) exits with :data:`~mloc.runtime.processes.workers.EXIT_PEER`, silently;
when every worker of a machine did so, its launcher says once that the run lost its ranks
on another machine (:func:`lost_peers`) and exits 1. The checkpoint on node 0 is the last
good state, and the run resumes from it with ``--resume`` on every machine.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from mloc.runtime.files.options import RDZV_TIMEOUT_S, endpoint_of
from mloc.runtime.processes.workers import EXIT_PEER, Outcome, supervise

NODE_PREFIX = "mloc-node"   # a node's scratch folder: TMPDIR/mloc-node-PID-START-RANDOM (mloc.runtime.files.scratch)
JOIN_PREFIX = "mloc-join"   # its workers' join files: TMPDIR/mloc-join-PID-START-RANDOM (mloc.runtime.processes.joining)


@dataclass(frozen=True)
class Nodes:
    """This machine's place in a run of ``nnodes`` machines of ``nproc`` processes each,
    meeting at ``endpoint`` within ``join_s`` seconds; ``rerun``: the words of its `mloc
    run` command but the node flags (none: not started by `mloc run`)."""

    nnodes: int
    node_rank: int
    nproc: int
    endpoint: str
    join_s: float = RDZV_TIMEOUT_S
    rerun: tuple[str, ...] = ()

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc

    @property
    def ranks(self) -> range:
        """The global ranks of this machine's workers."""
        return range(self.node_rank * self.nproc, (self.node_rank + 1) * self.nproc)

    def env(self, local_rank: int) -> dict[str, str]:
        """The variables of worker ``local_rank`` (torchrun's static rendezvous's)."""
        host, port = endpoint_of(self.endpoint)
        return {"RANK": str(self.ranks[local_rank]), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(self.world),
                "LOCAL_WORLD_SIZE": str(self.nproc), "GROUP_RANK": str(self.node_rank),
                "GROUP_WORLD_SIZE": str(self.nnodes), "MASTER_ADDR": host, "MASTER_PORT": str(port)}

    def names(self) -> list[str]:
        return [f"rank {r} of {self.world} (node {self.node_rank})" for r in self.ranks]

    def held(self) -> str:
        first, last = self.ranks[0], self.ranks[-1]
        return f"rank{'s' * (first != last)} {first}{f'-{last}' if first != last else ''} of {self.world}"


def of_options(options) -> Nodes:
    """The :class:`Nodes` a checked :class:`~mloc.runtime.files.options.RunOptions` describes."""
    return Nodes(options.nnodes, options.node_rank or 0, options.nproc or 1, options.rdzv_endpoint,
                 options.rdzv_timeout or RDZV_TIMEOUT_S, options.rerun)


def launch(train_py: Path, nodes: Nodes, argv: list[str], out: Path | None = None) -> Outcome:
    """Run this machine's workers of ``train_py`` (``argv`` and ``--launched-by PID``) under
    :func:`~mloc.runtime.processes.workers.supervise`; the outcome, its report saying so
    when the failure was on another machine, or the one report of workers that could not
    join (:mod:`mloc.runtime.processes.joining`, exit 2). ``out``: node 0's run folder."""
    from mloc.runtime.files import scratch
    from mloc.runtime.processes.joining import Joining
    command = [sys.executable, str(train_py), *argv, "--launched-by", str(os.getpid())]
    with scratch.folder(JOIN_PREFIX) as folder:
        joining = Joining(nodes, folder, mloc_commands(nodes))
        envs = [{**os.environ, **nodes.env(r), **joining.env(r)} for r in range(nodes.nproc)]
        for env in envs:
            env.setdefault("OMP_NUM_THREADS", "1")
        outcome = supervise([command] * nodes.nproc, envs, nodes.names(), tick=joining.tick,
                            stopping=joining.stopping)
        failed = joining.failure() if outcome.code == EXIT_PEER else None
    if failed is not None:
        return Outcome(2, failed)
    if outcome.code == 130 and joining.interrupted:     # said when it was: nothing was trained
        return Outcome(130, "")
    if outcome.code == EXIT_PEER:
        return Outcome(EXIT_PEER, lost_peers(nodes, out))
    if outcome.code == 130 and nodes.node_rank > 0 and outcome.report == "interrupted":
        return Outcome(130, "stopped: the run was interrupted (here or on another machine); rank 0 on node 0 "
                            "wrote the checkpoint and says how to continue")
    return outcome


def lost_peers(nodes: Nodes, out: Path | None) -> str:
    """The one report of a machine whose workers all lost their peers on another machine."""
    kept = ""
    if out is not None:
        path = Path(out) / "checkpoint.pt"
        kept = (f"\n  = note: the last checkpoint is {path}: continue with `--resume {out}` on every machine"
                if path.is_file() else "\n  = note: no checkpoint was written before it")
    return (f"error: the run lost its ranks on another machine: this one (node {nodes.node_rank}, {nodes.held()}) "
            f"stopped its workers{kept}\n  = help: a rank there failed, or its launcher or machine went away: the "
            f"other machines' output says which")


def start_node(options, choice, files, check) -> int:
    """A machine other than node 0 (see the module docstring): run ``check()`` (the
    launcher's checks of a ``--resume``'s checkpoint), write the compiled ``files`` into
    this machine's scratch folder (``choice.dir``, made by :func:`scratch_choice`; locked as
    a run folder), start its workers there, and remove the folder."""
    from mloc.runtime.files.runfiles import write_text
    from mloc.runtime.files.runfolder import RunFolder
    from mloc.runtime.processes.workers import exit_code
    choice = choice or scratch_choice()
    try:
        check()
        with RunFolder(choice) as folder:
            for name, text in files.items():
                write_text(folder.dir / name, text)
            nodes = of_options(options)
            if not options.quiet:
                print(f"node {nodes.node_rank} of {nodes.nnodes}: {nodes.held()}, meeting at {nodes.endpoint}; "
                      "node 0 logs and writes the checkpoints", file=sys.stderr)
            argv = replace(options, out=folder.dir, overwrite=False).argv()    # --resume: node 0's folder
            outcome = launch(folder.dir / "train.py", nodes, argv)
    finally:
        shutil.rmtree(choice.dir, ignore_errors=True)
    if outcome.report:
        print(outcome.report, file=sys.stderr)
    return exit_code(outcome.code)


def scratch_choice():
    """A new scratch folder of this machine's launcher (the dead ones' removed first), as
    the :class:`~mloc.runtime.files.runfolder.Choice` the run opens: where it compiles to."""
    from mloc.runtime.files import scratch
    from mloc.runtime.files.runfolder import Choice
    return Choice(dir=scratch.make(NODE_PREFIX))


def mloc_commands(nodes: Nodes) -> list[str]:
    """Each machine's ``mloc run`` command: ``nodes.rerun`` and its node flags (none
    without ``rerun``)."""
    if not nodes.rerun:
        return []
    timeout = ["--rdzv-timeout", f"{nodes.join_s:g}"] if nodes.join_s != RDZV_TIMEOUT_S else []
    return [shlex.join([*nodes.rerun, "--nnodes", str(nodes.nnodes), "--node-rank", str(r), "--nproc",
                        str(nodes.nproc), "--rdzv-endpoint", nodes.endpoint, *timeout]) for r in range(nodes.nnodes)]


def torchrun_commands(nodes: Nodes, train_py: str, argv: list[str]) -> list[str]:
    """Each machine's ``torchrun`` command for ``train_py`` (static rendezvous, the ranks
    numbered as ``mloc run --nnodes`` numbers them)."""
    host, port = endpoint_of(nodes.endpoint)
    return [shlex.join(["torchrun", "--nnodes", str(nodes.nnodes), "--node-rank", str(r), "--nproc-per-node",
                        str(nodes.nproc), "--master-addr", host, "--master-port", str(port), train_py, *argv])
            for r in range(nodes.nnodes)]
