"""The registry of diagnostic codes, grouped by kind (:data:`GROUPS` says which passes of
the pipeline report each group; ``run`` is the runtime, for what only training meets).

Codes are stable: tests, docs and users' scripts refer to them. Add new ones at the end of
their group; never renumber.
"""

from __future__ import annotations

from dataclasses import dataclass


GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("E0", "syntax", ("parse", "resolve")),
    ("E1", "names and imports", ("parse", "resolve")),
    ("E2", "program structure", ("resolve", "hierarchy", "dataflow")),
    ("E3", "calls and arguments", ("resolve",)),
    ("E4", "hypergradient methods", ("resolve", "dataflow")),
    ("E5", "interlocking chains", ("resolve", "hierarchy", "dataflow")),
    ("E6", "the train block", ("resolve", "trace")),
    ("E7", "dataflow and the program's own code", ("trace", "support", "run")),
    ("E9", "internal compiler error", ("run",)),
    ("W1", "warnings", ("resolve", "runnable", "trace", "support", "run")),
)
"""(code prefix, what the group is about, the passes that report it): the pass names are the
pipeline's (`mloc.codegen.compile.PASSES`; tests/test_diagnostics_cli.py checks them)."""


@dataclass(frozen=True)
class Code:
    code: str
    name: str
    summary: str

    @property
    def severity(self) -> str:
        return "warning" if self.code.startswith("W") else "error"


_ALL = (
    Code("E001", "syntax-error", "the text does not follow the grammar"),
    Code("E002", "unexpected-character", "a character that cannot start any token"),
    Code("E003", "unterminated-string", "a string literal without its closing quote"),
    Code("E004", "unexpected-end", "the file ends in the middle of a construct"),
    Code("E005", "missing-program", "the file has no `program NAME` line, or more than one"),
    Code("E006", "integer-too-large", "an integer literal that does not fit in 64 bits"),
    Code("E007", "nested-too-deeply", "brackets nested more than 64 deep"),
    Code("E101", "undefined-name", "a name that is not a problem, an import alias or a built-in"),
    Code("E102", "duplicate-problem", "two problems with the same name"),
    Code("E103", "duplicate-field", "a field given twice in one block"),
    Code("E104", "duplicate-import", "two imports bound to the same alias"),
    Code("E105", "module-not-found", "an imported module that is neither beside the file nor on sys.path"),
    Code("E106", "missing-attribute", "a name that the imported module does not define"),
    Code("E107", "reserved-name", "`batch` used where no batch exists, or a reserved word used as a name"),
    Code("E108", "problem-not-allowed", "a problem named where only Python objects are allowed"),
    Code("E109", "module-syntax-error", "an imported Python module that Python cannot parse (its import would raise SyntaxError, or exhaust the parser's stack)"),
    Code("E201", "missing-field", "a required field is absent"),
    Code("E202", "unknown-field", "a field that the block does not have"),
    Code("E203", "hierarchy-cycle", "problems that sit above each other in a cycle"),
    Code("E204", "self-edge", "a problem declared above itself"),
    Code("E205", "duplicate-edge", "the same hierarchy edge declared twice"),
    Code("E206", "orphan-problem", "a problem connected to no other problem"),
    Code("E207", "disconnected-program", "problems that form a separate program of their own"),
    Code("E208", "unknown-problem", "a hierarchy edge or chain names a problem that does not exist"),
    Code("E209", "edge-without-dataflow", "the lower problem never reads the upper one"),
    Code("E210", "unrelated-problem", "a loss reads a problem that is neither above nor below it"),
    Code("E211", "upper-reads-no-lower", "an upper problem whose loss reads none of the problems below it"),
    Code("E212", "nothing-to-train", "a lowest-level problem whose loss never reads its own parameters"),
    Code("E213", "no-problems", "the program declares no problem"),
    Code("E214", "unknown-setting", "a program-level setting that does not exist"),
    Code("E215", "bad-projection", "a `project` call that does not act on its own problem's module alone"),
    Code("E216", "bad-reinit", "a `reinit` that cannot apply: with `init`, on a problem with no upper, or acting on other problems"),
    Code("E217", "bad-warmup", "a `warmup` on an edge whose lower problem cannot train alone before the upper starts"),
    Code("E218", "bad-accumulate", "`accumulate` on a lower problem whose steps `itd` unrolls (one batch per unrolled step)"),
    Code("E219", "bad-vmap", "`vmap = true` on a problem whose meta-batch cannot be vectorized"),
    Code("E220", "unsharded-method", "`strategy = fsdp` with a hypergradient method that cannot run on sharded modules"),
    Code("E221", "unsharded-setting", "`strategy = fsdp` with a setting that sharded modules cannot run (three levels, Shampoo, clipping, ...)"),
    Code("E301", "unknown-optimizer", "an optimizer that mloc does not provide"),
    Code("E302", "unknown-method", "a hypergradient method that mloc does not provide"),
    Code("E303", "unknown-argument", "a keyword argument that the callee does not take"),
    Code("E304", "wrong-type", "a value of the wrong type"),
    Code("E305", "out-of-range", "a value outside its allowed range"),
    Code("E306", "missing-argument", "a required argument is absent"),
    Code("E307", "duplicate-argument", "an argument given twice"),
    Code("E308", "positional-after-keyword", "a positional argument after a keyword argument"),
    Code("E309", "too-many-arguments", "more positional arguments than the callee takes"),
    Code("E310", "expected-call", "a field that needs a call, such as `lib.MLP(...)`"),
    Code("E311", "unknown-builtin", "a schedule or other built-in that mloc does not provide"),
    Code("E401", "method-not-applicable", "a hypergradient method that cannot differentiate this lower problem"),
    Code("E402", "unroll-mismatch", "unrolled steps that do not fit the edge's unroll count"),
    Code("E403", "method-not-applicable-init", "a method that cannot see an upper problem that enters only through `init`"),
    Code("E404", "method-not-differentiable", "`exact` semantics need a differentiable method below a middle level that reads a lower one"),
    Code("E501", "chain-too-short", "an interlocking chain with fewer than two stages"),
    Code("E502", "interlock-out-of-range", "`interlock = n` outside 1..number of stages"),
    Code("E503", "chain-repeats-stage", "a problem that appears twice in chains"),
    Code("E504", "chain-in-hierarchy", "two stages of one chain also joined by a hierarchy edge"),
    Code("E505", "chain-stage-disconnected", "a stage whose loss does not read the stage before it"),
    Code("E601", "unknown-schedule", "a train-block action other than `eval`/`checkpoint`/`log every N`, `checkpoint best on` or `stop when`"),
    Code("E602", "duplicate-block", "a second `train` block"),
    Code("E603", "unknown-metric", "`checkpoint best on` or `stop when` names a metric that no evaluation produces"),
    Code("E604", "metric-mode", "a watched metric without `max`/`min`, or with both"),
    Code("E605", "duplicate-evaluation", "two evaluations with the same name (written, or the called function's)"),
    Code("E701", "dataflow-mismatch", "the declared hierarchy and the traced dataflow disagree"),
    Code("E702", "user-code-error", "the program's Python code raised an error"),
    Code("E703", "bad-loss", "a loss that is not a differentiable scalar"),
    Code("E704", "not-executable-yet", "a construct that is checked but not yet executed"),
    Code("E705", "init-shape-mismatch", "`init = U` between modules whose parameters differ in shape"),
    Code("E706", "data-dtype-mismatch", "a problem's batches and its module's parameters have floating dtypes its loss cannot mix"),
    Code("E707", "bad-evaluation", "an evaluation that, tried on the initial modules, returns neither a number, a 0-dim tensor nor a dict of them"),
    Code("E708", "chain-data-differs", "stages of one interlocking chain whose `data` calls differ (a chain step reads one batch)"),
    Code("E709", "bad-data", "a `data` call that returns no iterable of batches (a number, a numpy array, a tuple of tensors)"),
    Code("E710", "bad-schedule", "a `torch.optim.lr_scheduler` mloc cannot drive on this problem: it reads a metric, torch refuses it with this optimizer, or it changes a setting the optimizer cannot take"),
    Code("W101", "unused-import", "an import that no field uses"),
    Code("W102", "unused-argument", "an argument that has no effect with the chosen options"),
    Code("W103", "cannot-run-yet", "a construct that checks but cannot run yet (`mloc run` stops with E704)"),
    Code("W104", "data-not-batches", "a `data` value whose items are single examples or rows, not batches (a `Dataset`, a tensor)"),
    Code("W105", "schedule-outlasts-run", "a run (`--steps N`) that ends before a problem's learning-rate schedule does"),
    Code("W106", "identity-roots", "Shampoo steps preconditioned before its first roots arrive (by the initial identities)"),
    Code("W107", "schedule-starts-momentum", "a scheduler cycles a momentum the optimizer declares 0 (OneCycleLR/CyclicLR on `sgd` without momentum): it trains with momentum"),
    Code("W108", "unused-parameters", "trainable parameters that no loss the problem's gradient comes from reaches"),
    Code("E900", "internal-error", "a bug in mloc"),
)

CODES: dict[str, Code] = {c.code: c for c in _ALL}


def lookup(code: str) -> Code:
    """The registered code; an unknown code is a bug in mloc, not in the user's program."""
    try:
        return CODES[code]
    except KeyError:
        raise KeyError(f"unregistered diagnostic code {code!r}") from None
