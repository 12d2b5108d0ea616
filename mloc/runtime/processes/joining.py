"""A machine of `mloc run --nnodes` whose workers wait for the others: what its launcher says.

Every worker joins the run's process group at ``--rdzv-endpoint``
(:class:`mloc.runtime.base.distributed.Join`) within ``--rdzv-timeout`` seconds, and says
in a file of its own how it went: ``joining`` when it starts, then ``joined``, or
``failed`` and torch's message. Its launcher (:func:`mloc.runtime.processes.nodes.launch`)
reads those files while it supervises the workers (:meth:`Joining.tick`), and

- says nothing while the run's processes join promptly: as soon as one of its workers has
  joined, every process of the run has (rank 0's store waits for all), and it stops looking;
- when its workers have waited :data:`FIRST_S` seconds, counted from the moment the first
  of them began to join (so a slow start of the workers themselves is not waiting), says
  once where they wait, how many machines and processes the run expects, and each
  machine's command (the same, with its own ``--node-rank``); then one line at
  :data:`AGAIN_S`, and every :data:`EVERY_S` after, so a long wait is not a flood;
- when its workers gave up (torch's timeout passed, or the rendezvous closed or could not
  listen), turns their silent exits into one report (:meth:`Joining.failure`), exit 2:
  an environment problem (a machine not started, an address or port that does not work),
  not a program error. It names the endpoint, how many processes joined when torch says
  (rank 0's store: "1/2 clients joined"), and what to check. Workers that have not given
  up by :func:`late` are stopped and reported alike (torch's client tries once more past
  its deadline, for up to the timeout again);
- at Ctrl-C while they wait, says that nothing was trained (:meth:`Joining.stopping`):
  the workers end at once, as SIGINT's default action while they join.

Nothing in the run folder is touched by joining: no step is trained before it, and a
resume's checkpoint is read, not written.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

FIRST_S = 15.0      # the first word about a wait, counted from the first worker's joining
AGAIN_S = 60.0      # the one-line reminder
EVERY_S = 300.0     # then every five minutes
READ_S = 0.25       # how often the launcher reads its workers' files while none has joined


class Joining:
    """The launcher's watch over its workers' joining: ``nodes`` is this machine's place
    (a :class:`~mloc.runtime.processes.nodes.Nodes`, which imports this module: so here, and
    in the functions below, it is not annotated), ``folder`` holds one file per worker;
    ``commands`` are each machine's ``mloc run`` (none: said in words)."""

    def __init__(self, nodes, folder: Path, commands: list[str], clock=time.monotonic, out=None):
        self.nodes, self.folder, self.commands = nodes, Path(folder), commands
        self.clock, self.out = clock, out
        self.since: float | None = None     # when the first worker began to join
        self.joined, self.said, self.read_at = False, 0, -READ_S
        self.interrupted = False            # by Ctrl-C while its workers waited

    def env(self, local_rank: int) -> dict[str, str]:
        """What worker ``local_rank`` gets beside its rank: the timeout and its file."""
        from mloc.runtime.base.distributed import JOIN_FILE_VAR, JOIN_TIMEOUT_VAR
        return {JOIN_TIMEOUT_VAR: repr(float(self.nodes.join_s)),
                JOIN_FILE_VAR: str(self.folder / f"rank{local_rank}.join")}

    def states(self) -> list[str]:
        """Each worker's file as written so far ('' before it began)."""
        texts = []
        for r in range(self.nodes.nproc):
            try:
                texts.append((self.folder / f"rank{r}.join").read_text(encoding="utf-8", errors="replace"))
            except OSError:
                texts.append("")
        return texts

    def tick(self) -> int | None:
        """Called while the workers run (every poll): read their files now and then, and
        say so when they have waited long enough (module docstring); EXIT_PEER, to stop
        them, when they are :meth:`overdue`."""
        now = self.clock()
        if self.joined or now - self.read_at < READ_S:
            return None
        self.read_at = now
        states = self.states()
        if any(s.startswith("joined") for s in states):
            self.joined = True
            return None
        if self.since is None and any(states):
            self.since = now
        if self.overdue(now):
            from mloc.runtime.processes.workers import EXIT_PEER
            return EXIT_PEER
        if self.since is None or now - self.since < _due(self.said):
            return None
        text = waiting(self.nodes, now - self.since, self.commands if self.said == 0 else None)
        self.said += 1
        out = self.out or sys.stderr
        out.write(text + "\n")
        out.flush()
        return None

    def stopping(self) -> str:
        """What the launcher says at the first Ctrl-C: the workers stop at the next log
        step once joined (:data:`~mloc.runtime.processes.workers.NPROC_STOP`); while they
        wait, they end at once (SIGINT's default action while joining), with nothing to save."""
        from mloc.runtime.processes.workers import NPROC_STOP
        if self.joined or any(s.startswith("joined") for s in self.states()):
            return NPROC_STOP
        self.interrupted = True
        return (f"interrupted while waiting for the other machines to join the run at {self.nodes.endpoint}: "
                "stopping this machine's workers; nothing was trained")

    def overdue(self, now: float | None = None) -> bool:
        """Whether the workers have waited well past the timeout (:data:`LATE`) without
        giving up: torch's client retries its connection once more after the deadline, for
        up to about the timeout again, and a machine must not wait twice as long as told."""
        now = self.clock() if now is None else now
        return self.since is not None and not self.joined and now - self.since > late(self.nodes.join_s)

    def failure(self) -> str | None:
        """The machine's one report when none of its workers joined and one failed to; else None."""
        states = self.states()
        if self.joined or any(s.startswith("joined") for s in states):
            return None
        failed = [s.partition("\n")[2].strip() for s in states if s.startswith("failed")]
        if not failed and not self.overdue():
            return None
        if not failed:
            failed = [f"no answer within {self.nodes.join_s:g} s"]
        said = next((m for m in failed if _JOINED.search(m)), next((m for m in failed if _in_use(m)), failed[0]))
        return report(self.nodes, said, self.commands)


def late(join_s: float) -> float:
    """Seconds of joining after which the launcher stops workers that did not give up
    themselves: the timeout and a tenth of it (3 s at least, a minute at most)."""
    return join_s + min(max(0.1 * join_s, 3.0), 60.0)


def _due(said: int) -> float:
    """Seconds of waiting after which the ``said + 1``-th word is due."""
    return FIRST_S if said == 0 else AGAIN_S if said == 1 else AGAIN_S + EVERY_S * (said - 1)


def _expected(nodes) -> str:
    each = f"{nodes.nproc} process{'es' * (nodes.nproc != 1)}"
    return f"{nodes.nnodes} machines of {each} each, {nodes.world} in all"


def _commands(nodes, commands: list[str] | None) -> str:
    if not commands:
        return (f"\n  = note: each machine runs the same `mloc run` command with its own --node-rank (0 .. "
                f"{nodes.nnodes - 1}) and --rdzv-endpoint {nodes.endpoint}")
    lines = "".join(f"\n      node {r}: {c}" for r, c in enumerate(commands))
    return f"\n  = note: each machine runs the same command with its own --node-rank:{lines}"


def _reach(nodes) -> str:
    host, _, port = nodes.endpoint.rpartition(":")
    return (f"{nodes.endpoint} must be an address of node 0 that every machine reaches (check the host name and "
            f"the firewall) and port {port} free there")


def waiting(nodes, seconds: float, commands: list[str] | None) -> str:
    """What a machine says while its workers wait for the others: in full the first time
    (``commands`` given, possibly empty), then one line."""
    so_far = f"{seconds:.0f} s so far, of the --rdzv-timeout {nodes.join_s:g} s"
    if commands is None:
        return f"still waiting for the other machines to join the run at {nodes.endpoint}: {so_far}"
    return (f"waiting for the other machines to join the run at {nodes.endpoint}: {so_far} (this is node "
            f"{nodes.node_rank}; the run has {_expected(nodes)})" + _commands(nodes, commands)
            + f"\n  = help: if they are running, {_reach(nodes)}")


_JOINED = re.compile(r"(\d+)/(\d+) clients joined")


def _in_use(message: str) -> bool:
    return "EADDRINUSE" in message or "address already in use" in message.lower()


def report(nodes, said: str, commands: list[str]) -> str:
    """The one report of a machine whose workers could not join (``said``: torch's message
    to one of them, the most telling)."""
    machine = f"this machine (node {nodes.node_rank}, {nodes.held()})"
    here = f"{machine} stopped its workers; nothing was trained"
    within = f"within --rdzv-timeout {nodes.join_s:g} s"
    port = nodes.endpoint.rpartition(":")[2]
    joined = _JOINED.search(said)
    if _in_use(said):
        return (f"error: the run cannot meet at {nodes.endpoint}: port {port} is in use on this machine, where "
                f"rank 0 listens; {here}\n  = help: pass a port that is free on node 0 in --rdzv-endpoint, the same "
                "on every machine")
    if joined:
        first = (f"error: the other machines did not join the run at {nodes.endpoint} {within}: {joined[1]} of "
                 f"{joined[2]} processes joined; {here}")
    elif "connect" in said or said.startswith("no answer"):
        first = f"error: {machine} could not join the run at {nodes.endpoint} {within}; it stopped its workers; nothing was trained"
    else:
        line = said.splitlines()[0] if said else "no reason given"
        first = (f"error: the run's processes did not all join at {nodes.endpoint}: the rendezvous failed "
                 f"({line}); {here}\n  = note: a process on another machine may have failed or been stopped "
                 "while joining: that machine's output says why")
    return (first + _commands(nodes, commands) + f"\n  = help: start every machine within {nodes.join_s:g} s of "
            f"the others (--rdzv-timeout SECONDS to wait longer); {_reach(nodes)}")
