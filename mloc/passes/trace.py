"""The trace pass: verify the declared edges against what the user's code really does.

Imports the program's modules, builds every model on the meta device (no memory), draws
one batch per problem, evaluates each loss (`mloc.runtime.grad.introspect`), and compares the
problems a loss *names* with the problems whose parameters *reach* it:

- a named problem whose parameters never reach the loss (a `.detach()`, `no_grad`, or an
  unused argument) is an error (E701): the edge the name implies would carry nothing;
- a loss that raises, or a constructor or data call that raises, is reported at its span
  in the `.mlo` file (E702), with the user's own `file:line` frames, not as a traceback;
- a `data` call that returns no iterable of batches is E709 at its field, a `Dataset` (single
  examples, not batches) W104 (`mloc.passes.trace_checks`);
- a loss that is not a floating-point scalar is E703 (a Python number: detached by `.item()`);
- a `project` call is run once on its module, under no_grad (E702 if it raises);
- a `torch.optim.lr_scheduler` schedule is built on a stand-in of its problem's optimizer
  (`mloc.runtime.program.schedules.bind`, what the build does): what torch refuses there (cycling
  the momentum of an optimizer without one, bad arguments), a scheduler that reads a
  metric and a setting the optimizer cannot take are E710 at the schedule;
- a trainable parameter that reaches no loss its problem's gradient comes from (its own,
  and for an upper problem those below it: a layer defined but never called) is W108,
  which suggests `frozen` (it trains as a hand loop would: zero gradient, left untouched);
- each evaluation is tried once on the real modules' initial state
  (`mloc.passes.evaluations`): E702 if it raises, E707 if it returns something that is not
  a metric, E603 for a watched metric it does not return;
- batches whose floating dtype differs from the module's parameters are run once for real
  (the meta device does not check dtypes): a loss that cannot mix them is E706, at the
  `data` field.

Returns the parameter counts and saved-activation sizes the planner's cost model uses.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from mloc.diagnostics import Diagnostic, fold_repeats
from mloc.ir.graph import ProgramGraph
from mloc.passes.evaluations import try_evaluations
from mloc.passes.loader import evaluate, import_modules, program_path
from mloc.passes.plan import Sizes, format_bytes
from mloc.passes.trace_checks import (check_batch, check_data, init_mismatch, no_batch, not_a_loss, raised,
                                      unused_warning)


_raised = raised      # E702 with the user's own file:line frames (`mloc.passes.trace_checks`)


def trace_program(g: ProgramGraph, compiled: bool = True) -> tuple[Sizes, list[Diagnostic]]:
    from mloc.runtime.grad import introspect as intro

    diags: list[Diagnostic] = []
    warnings: list[Diagnostic] = []     # added last: they stop nothing
    try:
        mods = import_modules(g.info)
    except Exception as err:  # noqa: BLE001 - user code
        imp = g.info.imports[0]
        return Sizes(), [_raised(imp.span, f"importing `{imp.module}`", err)]
    modules, batches = {}, {}
    with program_path(Path(g.info.source_path).resolve().parent):
        for p in g.problems():
            try:
                modules[p.name] = intro.on_meta(lambda p=p: evaluate(p.module.call, mods))
            except Exception as err:  # noqa: BLE001
                diags.append(_raised(p.module.span, f"`{p.module.text}`", err))
                continue
            try:
                data = evaluate(p.data.call, mods)
            except Exception as err:  # noqa: BLE001
                diags.append(_raised(p.data.span, f"`{p.data.text}`", err))
                continue
            found = check_data(p, data)          # E709 (no iterable of batches) or W104
            if found is not None and found.severity == "error":
                diags.append(found)
                continue
            warnings += [found] if found else []
            batches[p.name] = data
    sizes = Sizes(params={n: intro.param_count(m) for n, m in modules.items()})
    _check_init_shapes(g, modules, diags)
    _check_python_optimizers(g, modules, diags)
    with program_path(Path(g.info.source_path).resolve().parent):
        _check_schedules(g, diags, warnings)
    reached: dict[str, set[tuple[str, str]]] = {}     # per loss: (problem, parameter) reaching it
    traced = {}      # problem -> the diagnostics of its loss (None: not traced)
    for p in g.problems():
        if p.name in batches and all(r in modules for r in p.loss.read_names()):
            before = len(diags)
            _check_loss(g, p, mods, modules, batches[p.name], sizes, diags, reached, compiled)
            traced[p.name] = diags[before:]
        if p.project is not None and p.name in modules:
            _check_project(g, p, mods, modules, diags)
    for chain in g.info.chains:
        if all(traced.get(s) is not None and all(d.code == "E701" for d in traced[s]) for s in chain.stages):
            found = _check_chain(g, chain.stages, mods, modules, batches[chain.stages[0]])
            if found is not None:     # the breach explains the E701s of that loss (a skipped stage)
                diags[:] = [d for d in diags if not any(d is e for e in traced[found[0]])] + [found[1]]
    if not diags:
        warnings += unused_parameters(g, modules, reached)
        with program_path(Path(g.info.source_path).resolve().parent):
            diags += try_evaluations(g, mods, _raised)
    return sizes, fold_repeats(diags + warnings)     # one missing package: one error, not one per call


def unused_parameters(g: ProgramGraph, modules: dict, reached: dict[str, set[tuple[str, str]]]) -> list[Diagnostic]:
    """W108 for each problem with trainable parameters that no loss its gradient comes from
    reaches: its own loss and, for an upper problem, the losses of the problems below it
    (its hypergradient flows through them). Such a parameter gets a zero gradient by every
    method and the optimizer leaves it as it is (no weight decay, no momentum), as a hand
    loop leaves a parameter whose `.grad` is None; the warning says so, and how to declare
    it `frozen`. A problem that starts from `p`'s parameters (`init = p`, MAML) evaluates
    them under its own names; problems with an `init` (their parameters are offsets) are
    skipped."""
    from mloc.runtime.program.binding import select_parameters

    out = []
    for p in g.problems():
        if p.name not in modules or p.init is not None:
            continue
        sources = {p.name} | set(nx.descendants(g.hierarchy(), p.name))
        if not sources <= set(reached):
            continue
        trainable = select_parameters(modules[p.name], p.trainable, p.frozen)
        # a problem that starts from p's parameters (`init = p`) evaluates them as its own
        starts = {q.name for q in g.problems() if q.init is not None and q.init[0] == p.name}
        hit = {name for s in sources for owner, name in reached[s] if owner == p.name or owner in starts}
        unused = [n for n in trainable if n not in hit]
        if unused:
            out.append(unused_warning(p, unused, [n for n, _ in modules[p.name].named_parameters()]))
    return out


def describe_sizes(sizes: Sizes) -> str:
    """A table of what the trace measured, one row per problem (what `--print-after trace`
    shows): the planner's memory estimates are made of these (docs/runtime.md, "Memory")."""
    rows = [("problem", "parameters", "batch", "activations", "backward peak", "gradient graph", "HVP peak",
             "aten ops")]
    for name, n in sizes.params.items():
        ops = sizes.fx_ops.get(name)
        rows.append((name, f"{n:,}", *(_bytes(d.get(name)) for d in (sizes.batches, sizes.activations,
                                                                        sizes.backwards, sizes.graphs, sizes.hvps)),
                     "-" if ops is None else str(ops)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    return "\n".join(lines) + f"\n{sizes.element_bytes} bytes per element\n"


def _bytes(n: int | None) -> str:
    return format_bytes(n) if n is not None else "-"


def _check_init_shapes(g, modules: dict, diags: list) -> None:
    """`init = U` evaluates this module with U's parameters (plus an adaptation): the two
    modules must have parameters of the same names and shapes."""
    for p in g.problems():
        if p.init is None or p.name not in modules or p.init[0] not in modules:
            continue
        own = [(n, tuple(t.shape)) for n, t in modules[p.name].named_parameters()]
        base = [(n, tuple(t.shape)) for n, t in modules[p.init[0]].named_parameters()]
        if own != base:
            what, label = init_mismatch(own, base)
            diags.append(Diagnostic("E705", f"`{p.name}` starts from `{p.init[0]}`'s parameters, but {what}",
                                    p.init[1], label=label,
                                    help=f"build `{p.name}`'s module with the same architecture as `{p.init[0]}`'s "
                                         "(`init` pairs the parameters by name and shape)"))


def _check_python_optimizers(g, modules: dict, diags: list) -> None:
    """E702 for a Python optimizer (`torch.optim.RAdam(lr=0.1, bogus=1)`, a factory of the
    user's) that cannot be built on its problem's parameters. Its keyword arguments are the
    class's own, which `mloc check` cannot read without importing it, so the class judges them
    here, built on the meta-device module as the run builds it (a run would fail there too)."""
    from mloc.builtins import OPTIMIZERS

    for p in g.problems():
        desc = OPTIMIZERS[p.optimizer.name]
        if not desc.caps.opaque or p.name not in modules:
            continue
        optimizer = None
        try:
            optimizer = desc.load()(**dict(p.optimizer.args))
            optimizer.init(tuple(t for t in modules[p.name].parameters() if t.requires_grad))
        except Exception as err:  # noqa: BLE001 - the optimizer class's own refusal
            diags.append(_raised(p.optimizer.span, f"building `{p.optimizer.span.text}` on the parameters "
                                 f"of `{p.name}`", err))
        finally:
            if optimizer is not None:
                optimizer.close()


def _check_schedules(g, diags: list, warnings: list) -> None:
    """E710 (or E702 from a factory of the user's) for each schedule that cannot be bound to
    its problem's optimizer, built as the generated code builds both; W107 for one that
    cycles a momentum the optimizer declares 0."""
    from mloc.builtins import OPTIMIZERS, SCHEDULES
    from mloc.runtime.program.schedules import ScheduleError, bind, starts_momentum

    for p in g.problems():
        if p.schedule is None or SCHEDULES[p.schedule.name].caps.identity:
            continue
        desc, args = SCHEDULES[p.schedule.name], dict(p.schedule.args)
        lr = dict(p.optimizer.args)[OPTIMIZERS[p.optimizer.name].rate]
        try:
            optimizer = OPTIMIZERS[p.optimizer.name].load()(**dict(p.optimizer.args))
        except Exception:  # noqa: BLE001 - the optimizer's own errors are reported when it is built
            continue
        try:
            schedule = desc.load()(**args, **({"base": lr} if desc.caps.takes_base else {}))
            bound = bind(schedule, optimizer, lr, f"`{p.name}`'s optimizer `{p.optimizer.span.text}`")
            if (started := starts_momentum(bound)) is not None:
                warnings.append(Diagnostic(
                    "W107", f"`{bound.name}` cycles the momentum of `{p.name}`'s optimizer `{p.optimizer.span.text}`, "
                    f"which has none: it trains with momentum {started}, as torch does", p.schedule.span,
                    label="cycles the momentum (cycle_momentum=true by default)",
                    help="pass `cycle_momentum=false` to the scheduler to train without momentum, or declare "
                         "the momentum you mean"))
        except ScheduleError as err:
            diags.append(Diagnostic("E710", str(err), p.schedule.span, label="this schedule", help=err.help))
        except Exception as err:  # noqa: BLE001 - a factory of the user's
            diags.append(_raised(p.schedule.span, f"`{p.schedule.span.text}`", err))
        finally:
            optimizer.close()


def _probe(g, p, mods, modules: dict, data, meta_batch, compiled: bool = True):
    """Probe on the meta device; a loss that mixes in tensors of its own (constants made on
    the CPU) cannot run there, and is probed once more with real modules and a real batch."""
    from mloc.runtime.grad import introspect as intro

    reads = p.loss.read_names()
    fn = _loss_function(p, mods)
    own = reads.index(p.name) if p.name in reads else None
    try:
        return intro.probe_loss(fn, [modules[r] for r in reads], meta_batch, reads, own, compiled), modules
    except RuntimeError as err:
        if "meta" not in str(err):
            raise
    real = {r: evaluate(g.problem(r).module.call, mods) for r in reads}
    return intro.probe_loss(fn, [real[r] for r in reads], next(iter(data)), reads, own, compiled), real


def _check_loss(g, p, mods, modules, data, sizes: Sizes, diags: list, reached: dict, compiled: bool = True) -> None:
    from mloc.runtime.grad import introspect as intro

    reads = p.loss.read_names()
    try:
        meta_batch = intro.first_batch(data)
    except StopIteration:
        diags.append(no_batch(p.data.span, p.data.text))
        return
    except Exception as err:  # noqa: BLE001 - user code
        diags.append(_raised(p.data.span, f"drawing the first batch of `{p.data.text}`", err))
        return
    if (arrays := check_batch(p, meta_batch)) is not None:
        diags.append(arrays)
        return
    if not _dtypes_mix(g, p, mods, modules[p.name], data, meta_batch, diags):
        return
    try:
        probe, used = _probe(g, p, mods, modules, data, meta_batch, compiled)
    except Exception as err:  # noqa: BLE001
        diags.append(_raised(p.loss.span, f"the loss of `{p.name}`", err))
        return
    owners = {id(t): n for n, m in used.items() for t in m.parameters()}
    reached[p.name] = {(n, k) for n, m in used.items() for k, t in m.named_parameters() if id(t) in probe.leaves}
    if probe.shape != () or not probe.floating:
        diags.append(not_a_loss(p, probe))
        return
    sizes.activations[p.name] = probe.activation_bytes
    sizes.batches[p.name] = probe.batch_bytes
    if probe.backward_bytes is not None:
        sizes.backwards[p.name] = probe.backward_bytes
    if probe.graph_bytes is not None:
        sizes.graphs[p.name] = probe.graph_bytes
        sizes.hvps[p.name] = probe.hvp_bytes
    if probe.compiled:
        sizes.compiled[p.name] = dict(probe.compiled)
    sizes.fx_ops[p.name] = probe.fx_ops
    if probe.fx_code:
        sizes.fx_code[p.name] = probe.fx_code
    spans = dict(p.loss.reads)
    hidden = sorted({owners[i] for i in probe.leaves if i in owners} - set(reads))
    for q in hidden:
        diags.append(Diagnostic(
            "E701", f"the loss of `{p.name}` depends on the parameters of `{q}` without naming it", p.loss.span,
            label=f"reaches `{q}`", help=f"pass `{q}` to the loss explicitly (and declare the edge), so mloc "
                                         "can differentiate through it; a global reference hides it"))
    for i, r in enumerate(reads):
        if i not in probe.reached and intro.param_count(used[r]) > 0:
            diags.append(Diagnostic(
                "E701", f"the loss of `{p.name}` names `{r}`, but no parameter of `{r}` reaches it", spans[r],
                label="no gradient flows from here",
                help=f"a `.detach()`, a `torch.no_grad()` block or an unused argument cuts `{r}` off; "
                     f"use it differentiably, or drop it from the loss and the hierarchy"))


def _check_chain(g, stages, mods, modules: dict, data) -> tuple[str, Diagnostic] | None:
    """Run the chain's forward wave as a chain step does (each loss cut at its stage
    calls, every head evaluated; `mloc.runtime.grad.interlock.check_contract`) on the meta
    device, or once more on real modules and a real batch if the losses need values: a
    loss that breaks the chain contract is E702 at that loss, with the contract as help.
    Returns (the stage, its diagnostic) or None."""
    from mloc.runtime.grad import introspect as intro
    from mloc.runtime.grad.interlock import ChainContractError, check_contract

    def run(used: dict, batch):
        fns = [(_loss_function(g.problem(s), mods), [used[r] for r in g.problem(s).loss.read_names()])
               for s in stages]
        return check_contract([lambda f=f, ms=ms: f(*ms, batch) for f, ms in fns], [used[s] for s in stages],
                              stages)
    try:
        found = run(modules, intro.first_batch(data))
        if found is not None and isinstance(found[1], RuntimeError) and "meta" in str(found[1]):
            reads = {r for s in stages for r in g.problem(s).loss.read_names()}
            found = run({r: evaluate(g.problem(r).module.call, mods) for r in reads}, next(iter(data)))
    except Exception as err:  # noqa: BLE001 - user code (building a module, drawing a batch)
        return stages[0], _raised(g.problem(stages[0]).loss.span, f"the chain [{', '.join(stages)}]", err)
    if found is None:
        return None
    t, err = found
    span = g.problem(stages[t]).loss.span
    if isinstance(err, ChainContractError):
        return stages[t], Diagnostic("E702", err.message, span, label="breaks the chain contract", help=err.help,
                                     notes=tuple(f"in {f}" for f in err.where))
    return stages[t], _raised(span, f"the loss of `{stages[t]}`, cut at its stage calls as a chain step runs it",
                              err)


def _check_project(g, p, mods, modules: dict, diags: list) -> None:
    """Run `project` once, on the meta module (or, if it needs values, a real one)."""
    from mloc.runtime.grad import introspect as intro

    def run(module):
        return intro.without_grad(lambda: evaluate(p.project.call, {**mods, p.name: module}))
    try:
        try:
            run(modules[p.name])
        except (RuntimeError, NotImplementedError) as err:
            if "meta" not in str(err):
                raise
            run(evaluate(p.module.call, mods))
    except Exception as err:  # noqa: BLE001 - user code
        diags.append(_raised(p.project.span, f"the `project` of `{p.name}`", err))


def _dtypes_mix(g, p, mods, meta_module, data, meta_batch, diags: list) -> bool:
    """False (after E706) when the batches' floating dtype differs from the module's and
    the loss, run once on the real modules and batch, fails on it."""
    from mloc.runtime.grad import introspect as intro

    have, want = intro.floating_dtypes(meta_batch), intro.floating_dtypes(meta_module)
    if not have or not want or have <= want:
        return True
    batch = next(iter(data))     # only now: the real batch, to run the loss on
    real = {r: evaluate(g.problem(r).module.call, mods) for r in p.loss.read_names()}
    try:
        _loss_function(p, mods)(*real.values(), batch)
        return True
    except Exception as err:  # noqa: BLE001 - user code
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        names = lambda s: "/".join(sorted(str(d).replace("torch.", "") for d in s))  # noqa: E731
        diags.append(Diagnostic(
            "E706", f"the batches of `{p.name}` are {names(have)}, but its module's parameters are "
            f"{names(want)}, and its loss fails on them ({text})", p.data.span, label="batches from here",
            help=f"convert the batches in the data call (e.g. `x.float()`), or build the module in "
                 f"{names(have)}"))
        return False


def _loss_function(p, mods):
    reads = p.loss.read_names()

    def fn(*modules_and_batch):
        *modules, batch = modules_and_batch
        return evaluate(p.loss.call, {**mods, **dict(zip(reads, modules)), "batch": batch})
    return fn
