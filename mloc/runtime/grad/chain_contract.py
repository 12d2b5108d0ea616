"""The chain contract, checked where a chain step cuts a loss (:mod:`mloc.runtime.grad.interlock`).

A chain step evaluates stage t's loss ``loss_t(stage_1, ..., stage_t, batch)`` with stages
1..t-1 replaced by *stand-ins* that return stored features (stage t-1's output, computed
once in the forward wave), and takes its gradient in pieces: ``dl_t/d out_t`` from the
head, then ``dl_t/d in_t = (d out_t/d in_t)^T dl_t/d out_t`` sent to stage t-1 only, and
so on down. That computes the loss as written, and its gradient, exactly when

1. the loss calls stages 1..t once each, in that order (a second call of a stage, a call
   out of order, or a skipped stage would be handed the wrong features);
2. stage j's input is computed from stage j-1's output (and the batch): the signal at
   stage j's input is sent to stage j-1 alone, so a path from an earlier stage's output
   into it (a skip connection) would carry a gradient no stage receives;
3. after stage t, the loss reads no earlier stage's output: the head's backward
   differentiates with respect to stage t's output and parameters only;
4. no earlier stage's parameters are read outside that stage's own call (a weight tied
   into a later head): their gradient would be dropped;
5. what the loss computes between stages j-1 and j is what the loss of stage j computes
   there (the same autograd operations): stage j's features come from that loss.

Anything else is allowed: any computation between two stages (a reshape, a nonlinearity,
dropout; stage j's own parameters may enter its input), and any use of stage t's own output
after it (the head's loss is differentiated through all of them, so it is computed as
written). Rule 5 compares the operations, not their constants (`2 * h` and `3 * h` look
alike), and runs where all the losses are at hand: at compile time and in the one-process
step, not in a pipeline worker, which sees only its own loss.

How it is checked, at run time and at compile time (:func:`mloc.runtime.grad.interlock.check_contract`,
run by the trace pass on the meta device): each stand-in returns its own leaf tensor (a
*marker*), every call of a stage is recorded with its input, and the inputs of the stages
and the head's loss are walked back through autograd to the leaves they reach. A breach is
:class:`ChainContractError` (E702, exit 1), whose message says what the loss does and whose
help states the contract with the stages' names.
"""

from __future__ import annotations

from typing import Sequence

from torch import Tensor, nn

from mloc.runtime.grad.introspect import reached_leaves, walk_graph


class ChainContractError(Exception):
    """A stage module or loss that breaks the chain contract: the program's error (E702,
    exit 1). ``help`` states the contract, ``where`` holds the user's frames at the call that
    broke it (if any); ``frames`` (what a run reports as its location) are those and the
    contract."""

    def __init__(self, message: str, help: str, where: Sequence[str] = ()):
        super().__init__(message)
        self.message, self.help, self.where = message, help, tuple(where)
        self.frames = [*self.where, f"the chain contract (docs/interlocking.md): {help}"]


def contract(names: Sequence[str], t: int) -> str:
    """The contract of stage ``t``'s loss, in the stages' names."""
    calls = ", ".join(f"`{n}`" for n in names[:t + 1])
    if t == 0:
        return f"the loss of `{names[0]}` calls `{names[0]}` once and then reads only its output"
    return (f"the loss of `{names[t]}` calls {calls} once each, in that order, each on what the one before "
            f"returned (anything in between, such as a reshape, is allowed), and after `{names[t]}` reads only "
            f"`{names[t]}`'s output; the chain cuts it at these calls")


class Cut:
    """What one evaluation of stage ``t``'s loss did at the stage boundaries: the stages it
    called, in order, and the first breach of rules 2-4 seen at a call or in the loss."""

    def __init__(self, modules: Sequence[nn.Module], t: int, names: Sequence[str]):
        self.t, self.names = t, names
        self.calls: list[int] = []
        self.markers: dict[int, tuple[int, Tensor]] = {}     # id -> (stage, the marker, kept alive)
        self.params = {id(p): (j, n) for j, m in enumerate(modules[:t]) for n, p in m.named_parameters()}
        self.breach: str | None = None
        self.between: dict[int, tuple[str, ...]] = {}     # stage j -> the operations from stage j-1's output to its input
        self.where: list[str] = []

    def mark(self, j: int, marker: Tensor) -> Tensor:
        """Stage j's stand-in output: ``marker``, recorded as stage j's."""
        self.markers[id(marker)] = (j, marker)
        return marker

    def called(self, j: int, args: Sequence) -> None:
        """Stage j is called on ``args``: record it; while the calls are in order, check
        that its input comes from stage j-1's output alone (rules 2 and 4)."""
        self.calls.append(j)
        if self.breach is not None:
            return
        if self.calls != list(range(len(self.calls))):
            self._found(None)
            return
        if j == 0:
            return
        walks = [_walk(a) for a in args if isinstance(a, Tensor)]
        reached = set().union(*(w[0] for w in walks))
        self.between[j] = tuple(op for w in walks for op in w[1])
        stages = {self.markers[i][0] for i in reached if i in self.markers}
        n = self.names
        if stages - {j - 1}:
            i = min(stages - {j - 1})
            self._found(f"feeds the output of `{n[i]}` into `{n[j]}`, besides passing it on to `{n[i + 1]}`")
        elif j - 1 not in stages:
            self._found(f"calls `{n[j]}` on something that is not computed from the output of `{n[j - 1]}`")
        else:
            self._read_params(reached, own=j)

    def scored(self, loss) -> None:
        """The head's loss has been computed: it may read no earlier stage's output or
        parameters (rules 3 and 4)."""
        if self.breach is not None or not isinstance(loss, Tensor):
            return
        reached = _leaves(loss)
        stages = sorted({self.markers[i][0] for i in reached if i in self.markers})
        if stages:
            i = stages[0]
            self._found(f"uses the output of `{self.names[i]}` beyond the input of `{self.names[i + 1]}`",
                        stack=False)
        else:
            self._read_params(reached, stack=False)

    def _read_params(self, reached: set[int], own: int | None = None, stack: bool = True) -> None:
        """Rule 4 for the leaves ``reached``; stage ``own``'s parameters may enter its own
        input (then they are in its output's graph, which its own loss's step differentiates)."""
        read = sorted(p for i in reached if i in self.params and (p := self.params[i])[0] != own)
        if read:
            j, name = read[0]
            self._found(f"reads the parameters of `{self.names[j]}` (`{name}`) outside its call", stack=stack)

    def _found(self, breach: str | None, stack: bool = True) -> None:
        self.breach = breach if self.breach is None else self.breach
        if stack and not self.where:
            import traceback

            from mloc.runtime.base.usercode import user_lines   # deferred: only on a breach
            stack = traceback.extract_stack()
            cut = [i for i, f in enumerate(stack) if f.name == "forward_stage"]   # where the loss was called
            self.where = user_lines(stack[cut[-1] + 1:] if cut else stack)[-3:]

    def error(self, complete: bool) -> ChainContractError | None:
        """The breach, if any: of rule 1 first (``complete``: the loss ran to its end, or to
        stage t when its head is not needed), then of the others."""
        what = self._order(complete) or self.breach
        if what is None:
            return None
        n = self.names
        order = ", ".join(n[j] for j in self.calls) or "none"
        return ChainContractError(f"the loss of `{n[self.t]}` {what} (the stages it calls, in order: {order})",
                                  contract(n, self.t), self.where)

    def _order(self, complete: bool) -> str | None:
        seen: set[int] = set()
        for j in self.calls:
            if j in seen:
                return f"calls stage `{self.names[j]}` twice"
            seen.add(j)
        for a, b in zip(self.calls, self.calls[1:]):
            if b < a:
                return f"calls stage `{self.names[b]}` after `{self.names[a]}`"
        end = self.t if complete else max(self.calls, default=-1)
        skipped = [j for j in range(end + 1) if j not in seen]
        return f"never calls stage `{self.names[skipped[0]]}`" if skipped else None


def _walk(x: Tensor) -> tuple[set[int], tuple[str, ...]]:
    """The leaves ``x`` is computed from (as :func:`_leaves`) and the differentiable
    operations on the way (:func:`~mloc.runtime.grad.introspect.walk_graph`): what a loss
    computes between two stages."""
    if x.grad_fn is None:
        return _leaves(x), ()
    return walk_graph(x.grad_fn, ops=True)


def differs(names: Sequence[str], j: int, here: tuple[str, ...], there: tuple[str, ...]) -> str:
    """What a later loss does between stages j-1 and j (``here``) that the loss of stage j,
    which a chain step takes stage j's features from, does not (``there``)."""
    show = lambda ops: ", ".join(ops) if ops else "nothing"  # noqa: E731
    return (f"computes the input of `{names[j]}` from `{names[j - 1]}`'s output differently from the loss of "
            f"`{names[j]}` ({show(here)}, where that loss does {show(there)}): a chain step computes "
            f"`{names[j]}` once, as its own loss does")


def _leaves(x: Tensor) -> set[int]:
    """The ids of the leaf tensors that require grad and that ``x`` is computed from
    (``x`` itself when it is one)."""
    if x.grad_fn is None:
        return {id(x)} if x.requires_grad else set()
    return reached_leaves(x)
