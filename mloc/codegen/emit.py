"""Write a program's `train.py`: readable, deterministic Python that runs without mloc's
compiler (it imports only `mloc.runtime`, torch and the program's own modules).

Every statement that comes from the `.mlo` file carries a `# prog.mlo:LINE` comment on its
first line; names are the program's own; the same graph and plan always give the same bytes.
Every line is laid out within 100 columns (`mloc.codegen.layout`), except torch.fx's printout
of the traced losses, which is quoted as torch printed it.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from mloc.shared.version import __version__
from mloc.builtins import METHODS, OPTIMIZERS, SCHEDULES, Descriptor
from mloc.codegen import evaluations, layout
from mloc.codegen.values import render_value
from mloc.ir.graph import ProgramGraph
from mloc.ir.payloads import ProblemNode
from mloc.passes.plan import Action, Loop, Plan


class Emitter:
    def __init__(self, g: ProgramGraph, plan: Plan, out_dir: Path, sizes=None, overrides: tuple[str, ...] = ()):
        self.g, self.plan, self.sizes, self.overrides = g, plan, sizes, overrides
        self.src = Path(g.info.source_path)
        self.name = self.src.name
        self.lines: list[str] = []
        self.blocks: list[str] = []
        rel = os.path.relpath(self.src.resolve().parent, Path(out_dir).resolve())
        self.program_dir = Path(rel).as_posix()

    def at(self, span) -> str:
        return f"# {self.name}:{span.line}"

    def emit(self, *texts: str) -> None:
        """Lines of code (each may hold several, and a comment), laid out within the width."""
        for text in texts:
            for line in text.split("\n"):
                self.lines += layout.fit(line)

    def block(self) -> None:
        """End a top-level block: blocks are joined by two blank lines (PEP 8)."""
        while self.lines and self.lines[-1] == "":
            self.lines.pop()
        self.blocks.append("\n".join(self.lines))
        self.lines = []

    # --- sections -------------------------------------------------------------------------
    def header(self) -> None:
        info = self.g.info
        self.lines += _docstring(info.name, self.name, self.plan, self.overrides)
        self.emit("")
        names = ", ".join(_declaration_types(self.plan, info.train))
        line = f"from mloc.runtime.run.declaration import {names}"
        self.emit(line if len(line) <= layout.WIDTH else f"from mloc.runtime.run.declaration import ({names})")
        self.emit("from mloc.runtime.processes.launch import main, program_dir")
        for module, names in sorted(_runtime_imports(self.used()).items()):
            self.emit(f"from {module} import " + ", ".join(sorted(names)))
        self.emit("")
        self.emit(f"# the directory of {self.name}, first on sys.path",
                  f"program_dir(__file__, {self.program_dir!r})")
        for imp in info.imports:
            alias = f" as {imp.bound}" if imp.bound != imp.module else ""
            self.emit(f"import {imp.module}{alias}  # noqa: E402  {self.at(imp.span)}")
        self.block()

    def used(self) -> list[Descriptor]:
        """The descriptors of the built-ins the generated code calls."""
        out = [METHODS[e.method] for e in self.plan.edges]
        out += [OPTIMIZERS[p.optimizer.name] for p in self.g.problems()]
        out += [SCHEDULES[p.schedule.name] for p in self.g.problems()
                if p.schedule is not None and not SCHEDULES[p.schedule.name].caps.identity]
        return out

    def modules(self) -> None:
        self.emit("def build_modules():")
        self.emit('    """Every problem\'s module, built in source order (the seed is set before)."""')
        self.emit("    return {")
        for p in self.g.problems():
            self.emit(f"        {p.name!r}: {render_value(p.module.call)},  {self.at(p.module.span)}")
        self.emit("    }")
        self.block()

    def losses(self) -> None:
        for p in self.g.problems():
            reads = p.loss.read_names()
            self.emit(f"def {p.name}_loss({', '.join(reads + ('batch',))}):")
            self.emit(f"    return {render_value(p.loss.call)}  {self.at(p.loss.span)}")
            self.block()
            for lines in _hooks(p, self.at):
                self.emit(*lines)
                self.block()

    def declaration(self) -> None:
        """`PROGRAM`: the whole program as one value, each field's source line and the
        planner's reasons as comments."""
        t = self.g.info.train
        self.emit("PROGRAM = Declaration(", f"    name={self.g.info.name!r},",
                  f"    overrides={self.overrides!r},  # the --set PATH=VALUE this file was compiled with",
                  "    build_modules=build_modules,", "    data={")
        for p in self.g.problems():
            self.emit(f"        {p.name!r}: lambda: {render_value(p.data.call)},  {self.at(p.data.span)}")
        self.emit("    },", "    problems=(")
        for p in self.g.problems():
            self.problem_spec(p)
        self.emit("    ),")
        self.edges()
        self.emit("    schedule=outer_step,")
        self.emit(*evaluations.table(t.evals, self.at), *evaluations.selection(t, self.at))
        self.emit(f"    defaults=RunConfig(steps={t.steps}, seed={t.seed}, device={t.device!r}, "
                  f"precision={t.precision!r}{_strategy(t)}{_recompute(self.plan)}),",
                  f"    intervals=Intervals(log_every={t.log_every}, checkpoint_every={t.checkpoint_every}),", ")")
        self.block()

    def problem_spec(self, p: ProblemNode) -> None:
        optimizer, args = OPTIMIZERS[p.optimizer.name], dict(p.optimizer.args)
        lr = args[optimizer.rate]       # the rate, whatever its name: the runtime schedules it
        opt_args = ", ".join(f"{k}={'lr' if k == optimizer.rate else repr(v)}" for k, v in args.items())
        fields = [f"{p.name!r}", f"reads={p.loss.read_names()!r}", f"loss={p.name}_loss",
                  f"optimizer=lambda lr: {optimizer.runtime_attr}({opt_args})", f"lr={lr!r}"]
        if p.trainable != ("*",):
            fields.append(f"trainable={p.trainable!r}")
        if p.frozen:
            fields.append(f"frozen={p.frozen!r}")
        if p.init is not None:
            fields.append(f"init={p.init[0]!r}")
        if p.clip_grad_norm is not None:
            fields.append(f"clip_grad_norm={p.clip_grad_norm!r}")
        if p.precision is not None:
            fields.append(f"precision={p.precision!r}")
        if p.project is not None:
            fields.append(f"project={p.name}_project")
        if p.reinit is not False:
            fields.append("reinit=True" if p.reinit is True else f"reinit={p.name}_reinit")
        schedule = SCHEDULES[p.schedule.name] if p.schedule is not None else None
        if schedule is not None and not schedule.caps.identity:
            sargs = [f"{k}={v!r}" for k, v in p.schedule.args]
            sargs += [f"base={lr!r}"] if schedule.caps.takes_base else []
            fields.append(f"schedule={schedule.runtime_attr}({', '.join(sargs)})")
        self.lines += layout.call("        ", "ProblemSpec(", fields, "),", self.at(p.span), one_per_line=True)

    def edges(self) -> None:
        """The hierarchy's edges (each with the planner's reason), the semantics, each
        upper's composition and the interlocking chains: the declaration's fields."""
        if self.plan.edges:
            self.emit("    edges=(")
            for e in self.plan.edges:
                span = next(h.span for h in self.g.hierarchy_edges() if (h.upper, h.lower) == (e.upper, e.lower))
                self.emit(f"        Edge({e.upper!r}, {e.lower!r}, {_method_call(e)}),  {self.at(span)}: {e.reason}")
            self.emit("    ),")
        self.emit(f"    semantics={self.plan.runtime_semantics!r},")
        if self.plan.compositions:
            self.emit("    compositions={  # each upper's hypergradient: BR-VJP order and step shape, planned")
            for top, c in self.plan.compositions.items():
                self.emit(f"        {top!r}: {c!r},")
            self.emit("    },")
        self.emit(*_chains(self.plan.chains, self.g.info.chains, self.at))

    def schedule(self) -> None:
        self.emit("def outer_step(p):")
        self.emit('    """One step of the top problem: the planner\'s schedule."""')
        self.emit(*_warmup(self.plan.warmup))
        self._loop_body(self.plan.schedule, 1)
        self.block()

    def _loop_body(self, loop: Loop, depth: int) -> None:
        pad = "    " * depth
        for item in loop.body:
            if isinstance(item, Loop):
                self.emit(f"{pad}for _ in range({item.repeat}):  # {item.note}")
                self._loop_body(item, depth + 1)
            elif item.kind == "commit":
                self.emit(f"{pad}for _ in range({item.count}):  # {item.note}")
                self.emit(f"{pad}    p.lower_step({item.problem!r}, draw=False)")
            else:
                self.emit(pad + _action(item))

    def evaluations(self) -> None:
        evals = self.g.info.train.evals
        problems = {p.name for p in self.g.problems()}
        imports = {imp.bound.split(".")[0] for imp in self.g.info.imports}
        for function in evaluations.functions(evals, problems, imports, self.at):
            self.emit(*function)
            self.block()

    def traced(self) -> None:
        """Each loss as torch.fx traced it at compile time, for reading (not executed)."""
        codes = self.sizes.fx_code if self.sizes else {}
        if not codes:
            return
        self.emit("# " + "-" * 86)
        self.emit("# The losses as torch.fx traced them at compile time (aten operations on meta tensors):")
        self.emit("# what each loss computes and which parameters it touches. For reading; not executed.")
        for p in self.g.problems():
            code = codes.get(p.name)
            if not code:
                continue
            lines = code.splitlines()
            shown = lines[:MAX_TRACE_LINES]
            self.emit("#")
            self.emit(f"# {p.name}_loss ({self.sizes.fx_ops.get(p.name, 0)} operations):")
            self.lines += [f"#     {line}".rstrip() for line in shown]     # quoted as printed: not laid out
            if len(lines) > len(shown):
                self.emit(f"#     ... ({len(lines) - len(shown)} more lines)")
        self.block()

    def footer(self) -> None:
        self.emit('if __name__ == "__main__":')
        self.emit("    raise SystemExit(main(PROGRAM, __file__))")
        self.block()

    def source(self) -> str:
        for section in (self.header, self.modules, self.losses, self.schedule, self.evaluations,
                        self.declaration, self.footer, self.traced):
            section()
        return "\n\n\n".join(b for b in self.blocks if b) + "\n"


MAX_TRACE_LINES = 40


def _runtime_imports(used: list[Descriptor]) -> dict[str, set[str]]:
    """{module: factory names} for the runtime factories of `used` (each has a runtime: the
    checker reports E704 for a built-in without one, and the planner resolves `auto`)."""
    out: dict[str, set[str]] = {}
    for d in used:
        if d.runtime is None:
            raise ValueError(f"`{d.name}` has no runtime; it cannot appear in generated code")
        out.setdefault(d.runtime_module, set()).add(d.runtime_attr)
    return out


def _declaration_types(plan: Plan, train) -> list[str]:
    """The types of :mod:`mloc.runtime.run.declaration` that train.py's declaration uses."""
    used = {"Declaration", "Intervals", "ProblemSpec", "RunConfig"}
    used |= {"Edge"} if plan.edges else set()
    used |= {"Composition"} if plan.compositions else set()
    used |= {"Interlock"} if plan.chains else set()
    used |= {"Evaluation"} if train.evals else set()
    used |= {"Criterion"} if train.best is not None or train.stop is not None else set()
    return sorted(used)


def _method_call(e) -> str:
    """The runtime factory call of a planned edge (an unrolling method's `steps` default to
    the edge's `unroll`), then the `Edge`'s `sharded` form when the method runs on shards."""
    descriptor = METHODS[e.method]
    args = dict(e.args)
    if descriptor.caps.unrolls and args.get("steps") is None:
        args["steps"] = e.unroll
    inner = ", ".join(f"{k}={v!r}" for k, v in args.items() if v is not None)
    form = descriptor.caps.sharded_form
    return f"{descriptor.runtime_attr}({inner})" + (f", sharded={form!r}" if form else "")


def _hooks(p: ProblemNode, at) -> list[list[str]]:
    """The problem's `project` and `reinit` calls as functions of its module."""
    out = []
    for key, when in (("project", "after every optimizer step"), ("reinit", "at each step of its upper")):
        call = getattr(p, key)
        if call not in (None, True, False):
            out.append([f"def {p.name}_{key}({p.name}):  # {when}, under no_grad",
                        f"    {render_value(call.call)}  {at(call.span)}"])
    return out


def _chains(chains, specs, at) -> list[str]:
    """`chains`: the program's interlocking chains, each with its source line (none: nothing)."""
    if not chains:
        return []
    return ["    chains=(  # interlocking backpropagation: stage k learns from head min(k+n-1, K)",
            *(f"        {c!r},  {at(spec.span)}: {c.policy()}" for c, spec in zip(chains, specs)), "    ),"]


def _warmup(actions) -> list[str]:
    """The warm-up steps, once, before the first outer step."""
    if not actions:
        return []
    out = ["    if p.step_count == 0:  # before the first outer step"]
    for a in actions:
        out += [f"        for _ in range({a.count}):  # {a.note}", f"            p.lower_step({a.problem!r})"]
    return out


def _action(a: Action) -> str:
    note = f"  # {a.note}" if a.note else ""
    if a.kind == "chain_step":
        return f"p.chain_step({a.problem!r}){note}"
    if a.kind == "meta_batch":
        return f"p.meta_batch({a.problem!r}, tasks={a.count}, steps={a.steps}){note}"
    return f"p.{a.kind}({a.problem!r}){note}"


def _docstring(name: str, source: str, plan: Plan, overrides: tuple[str, ...]) -> list[str]:
    """The module docstring: what train.py is, how to run it, the `--set`s it was compiled
    with and its semantics, its text wrapped at word boundaries."""
    return [*layout.prose(f'"""{name}: generated by mloc {__version__} from {source}. Do not edit; recompile.'), "",
            "    python train.py [--steps N] [--seed S] [--device D] [--precision P] [--out DIR] [--resume DIR]", "",
            *_overrides_doc(source, overrides),
            *layout.prose(f"Semantics: {plan.runtime_semantics} ({plan.semantics_reason})."), '"""']


def _overrides_doc(name: str, overrides: tuple[str, ...]) -> list[str]:
    """The header's docstring lines listing the `--set`s (none without overrides); each
    `--set` stays on one line, however long, so that it can be copied as one shell word."""
    if not overrides:
        return []
    return [*layout.prose(f"Compiled with {len(overrides)} override{'s' * (len(overrides) > 1)} of {name} "
                          "(the declaration's `overrides`), checked together with the file:"),
            *("    --set " + _docstring_safe(shlex.quote(text)) for text in overrides), ""]


def _strategy(train) -> str:
    """`, strategy='zero'` in the defaults of a program that names one (`auto` is RunConfig's own),
    and `, checkpoint_form='sharded'` likewise (`gathered` is RunConfig's own)."""
    form = f", checkpoint_form={train.checkpoint_form!r}" if train.checkpoint_form != "gathered" else ""
    return (f", strategy={train.strategy!r}" if train.strategy != "auto" else "") + form


def _recompute(plan: Plan) -> str:
    """`, recompute=True` when the planner turned activation checkpointing on (passes.recompute)."""
    return ", recompute=True" if plan.recompute and plan.recompute[0] else ""


def _docstring_safe(text: str) -> str:
    """`text` as it reads inside the generated module's docstring (one line, no end quote)."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"').replace("\n", "\\n").replace("\r", "\\r")


def generate(g: ProgramGraph, plan: Plan, out_dir: Path, sizes=None, overrides: tuple[str, ...] = ()) -> str:
    """The text of `train.py` for `out_dir` (with the traced losses when `sizes` has them),
    recording the `--set` overrides its program was compiled with."""
    return Emitter(g, plan, out_dir, sizes, overrides).source()
