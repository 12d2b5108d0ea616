"""What `mloc explain CODE` prints: for every code in `codes.py`, a paragraph (what is
wrong and why mloc rejects it, how to fix it) and a small example, the mistake and its
fix. Kept beside the registry, keyed by code; a test checks that every registered code has
one, and that every `mloc COMMAND` these texts name is a real subcommand.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from mloc.diagnostics.codes import CODES


@dataclass(frozen=True)
class Explanation:
    """`text`: the paragraph; `wrong` / `right`: the example's lines before and after the fix
    (empty `right` when the fix is not one line of the program)."""

    text: str
    wrong: str
    right: str = ""


E = Explanation
_PROBLEM = "problem low { module = lib.Net()  data = lib.loader()  loss = lib.loss(low, high, batch)  optimizer = sgd(lr=0.1) }"

EXPLANATIONS: dict[str, Explanation] = {
    "E001": E("The text does not follow the grammar of the .mlo language at this point. The label "
              "under the carets lists what the parser expected. Common causes: a missing `=` in "
              "`field = value`, a missing comma between call arguments, a `}` missing at the end of a "
              "block (then reported at the `{` that is never closed). Each broken top-level item is "
              "reported once; the later checks run when the syntax is fixed.",
              "optimizer sgd(lr=0.1)", "optimizer = sgd(lr=0.1)"),
    "E002": E("A character that cannot start any token: punctuation the language does not use "
              "(`:`, `@`, `=>`), or a non-ASCII character pasted from a paper or chat (a Unicode minus, "
              "an arrow `→`, curly quotes). Outside strings and comments, programs are ASCII.",
              "weight_net → classifier", "weight_net -> classifier"),
    "E003": E("A string literal whose closing quote is missing on its line. Strings cannot span lines.",
              'data = lib.load(path="train.csv)', 'data = lib.load(path="train.csv")'),
    "E004": E("The file ends inside a block, a call or a list: a closing `}`, `)` or `]` is missing. "
              "The message names the bracket that is still open and where it was opened.",
              "train { steps = 100", "train { steps = 100 }"),
    "E005": E("Every program starts with exactly one `program NAME` line; it names the program in "
              "generated code, run folders and checkpoints.",
              "import lib            # first line", "program my_experiment\nimport lib"),
    "E006": E("An integer literal larger than 2**64 - 1 = 18446744073709551615 in magnitude. "
              "Integers in a program are 64-bit, as torch and NumPy hold them, and a count that "
              "large would never finish (each field also has its own bound, E305). For a large "
              "real number, write a float such as `1e30`.",
              "steps = 100000000000000000000000", "steps = 100000"),
    "E007": E("Brackets (`(`, `[`, `{`) nested more than 64 deep. No program needs that many (a block "
              "holding a call of a list of tuples is 4 deep); the limit keeps the checker's passes "
              "within Python's stack. Build a deeply nested value in the Python module and call it.",
              "module = lib.Net(sizes=[[[[[[...]]]]]])", "module = lib.Net(sizes=lib.nested_sizes())"),
    "E101": E("A name that is neither a problem of this program, an import alias, nor a built-in "
              "(optimizer, method, schedule). Often a typo (a did-you-mean is offered), a problem "
              "that was renamed, or a module used without its `import` line. A dotted name such as "
              "`torch.optim.sgd` that names a module rather than a class is reported here too.",
              "loss = lib.loss(clasifier, batch)", "loss = lib.loss(classifier, batch)"),
    "E102": E("Two problems with the same name: every problem needs its own, since edges, losses "
              "and `--set` paths refer to problems by name.",
              "problem model { ... }\nproblem model { ... }", "problem model { ... }\nproblem model2 { ... }"),
    "E103": E("A field set twice in one block: only one value can apply. Remove one of them (to "
              "change a value for one run, use `--set PROBLEM.FIELD=VALUE` instead of a second line).",
              "optimizer = sgd(lr=0.1)\noptimizer = adam(lr=1e-3)", "optimizer = adam(lr=1e-3)"),
    "E104": E("Two `import` lines bind the same alias, so the second hides the first.",
              "import models as lib\nimport data as lib", "import models as lib\nimport data as data"),
    "E105": E("The imported module is neither a `.py` file (or package) beside the .mlo file nor on "
              "`sys.path`. `mloc check` looks for the file without importing it; check the name, or "
              "install the package into the environment that runs mloc.",
              "import reweightng as lib", "import reweighting as lib"),
    "E106": E("The imported module exists but does not define this name (read from its source with "
              "Python's `ast`, without running it). Check the spelling against the module; a "
              "did-you-mean lists the closest name it defines.",
              "module = lib.MPL(hidden=64)", "module = lib.MLP(hidden=64)"),
    "E107": E("`batch` is what a problem's loss receives from its own data, so it may appear only "
              "in `loss`; and language keywords (`program`, `problem`, `train`, ...) cannot name a "
              "problem.",
              "problem train { ... }", "problem trainer { ... }"),
    "E108": E("A problem named where only Python objects go: a module, a data loader or an "
              "evaluation's call receives Python values, not a problem. Problems are passed to "
              "`loss` (and `init`, `project`, `reinit`), where mloc substitutes the module.",
              "module = lib.Head(backbone)", "loss = lib.loss(head, backbone, batch)"),
    "E109": E("An imported module is not valid Python: importing it would raise `SyntaxError`, so "
              "the program could not start. `mloc check` parses the module with Python's own parser "
              "(without running it) and reports the error at the module's file, line and column, with "
              "Python's message. A module Python's parser cannot hold (an expression nested or "
              "chained so deeply that the parser runs out of stack, as `1+1+...` with 200 000 terms) "
              "is reported the same way, at its first line: its import fails too. Until it parses, the module's names are unknown, so calls into it are "
              "not checked; fix it and check again. `python -m py_compile FILE` shows the same error.",
              "def loader(batch_size=8:", "def loader(batch_size=8):"),
    "E201": E("A required field is absent. A problem needs `module`, `data`, `loss` and `optimizer`; "
              "a chain needs `interlock`.",
              "problem low { module = lib.Net()  data = lib.loader()  loss = lib.loss(low, batch) }",
              "problem low { ... optimizer = sgd(lr=0.1) }"),
    "E202": E("A field the block does not have: a typo, or a field that belongs to another block (a "
              "hypergradient method goes on the edge, `steps` in the train block). The message lists "
              "the fields the block takes.",
              "problem low { ... hypergrad = cg(iters=10) }", "high -> low { hypergrad = cg(iters=10) }"),
    "E203": E("Problems that sit above each other in a cycle: the hierarchy must be a DAG, since "
              "each problem's best response is taken with its uppers held fixed.",
              "a -> b\nb -> a", "a -> b"),
    "E204": E("A problem declared above itself. A problem that tunes part of its own parameters is "
              "two problems: split the module into an upper and a lower one.",
              "model -> model", "hyper -> model"),
    "E205": E("The same hierarchy edge declared twice; declare it once, with all its options in one "
              "block.",
              "high -> low { unroll = 5 }\nhigh -> low { hypergrad = cg() }",
              "high -> low { hypergrad = cg(), unroll = 5 }"),
    "E206": E("A problem joined to no other problem by an edge or a chain. A single problem is plain "
              "training: write it in PyTorch, or declare which problem it sits above or below.",
              "problem extra { ... }        # no edge names it", "extra -> model"),
    "E207": E("The problems form two or more separate programs: no edge joins one group to the "
              "other. Split the file, or add the edge that joins them.",
              "a -> b\nc -> d", "a -> b\nb -> c\nc -> d"),
    "E208": E("A hierarchy edge or a chain names a problem the file does not declare (often a "
              "typo; a did-you-mean is offered).",
              "hyper -> modle", "hyper -> model"),
    "E209": E("`upper -> lower` says the upper problem is tuned through the lower one, but the "
              "lower's loss never reads the upper problem (nor starts from it with `init`), so no "
              "hypergradient can flow. Pass the upper problem to the lower's loss, or reverse the "
              "edge if the arrow is the wrong way round.",
              "hyper -> model      # model's loss: lib.loss(model, batch)",
              "loss = lib.loss(model, hyper, batch)"),
    "E210": E("A loss reads a problem that is neither above nor below it in the hierarchy, so mloc "
              "has no rule for how that problem's parameters enter. Declare the edge, or remove the "
              "problem from the loss.",
              "loss = lib.loss(a, c, batch)     # c is unrelated to a", "c -> a"),
    "E211": E("An upper problem whose loss reads none of the problems below it: its hypergradient "
              "would be zero. An upper problem is judged by how its lower problems do, so its loss "
              "reads at least one of them.",
              "loss = lib.val_loss(hyper, batch)", "loss = lib.val_loss(model, batch)"),
    "E212": E("A lowest-level problem whose loss never reads its own parameters: its optimizer has "
              "nothing to train. When its upper problem's loss reads both problems and this one's "
              "reads only the upper, the edge is most likely reversed (the help then says so): turn "
              "the arrow round rather than pass the problem to its own loss.",
              "model -> hyper      # hyper's loss reads only model", "hyper -> model"),
    "E213": E("The file declares no problem: there is nothing to compile.",
              "program p\nimport lib", "program p\nimport lib\n" + _PROBLEM),
    "E214": E("A top-level `NAME = value` that is not a program setting (the settings are listed in "
              "the message; today `semantics`). Fields of problems go inside their block.",
              "semantic = exact", "semantics = exact"),
    "E215": E("`project = lib.fn(problem)` runs on one problem's module after each of its steps, so "
              "the call names that problem and no other.",
              "problem hyper { ... project = lib.clamp(model) }", "problem hyper { ... project = lib.clamp(hyper) }"),
    "E216": E("`reinit` starts a lower problem again at each step of its upper: it needs an upper "
              "problem, cannot be combined with `init` (which already restarts it from the upper's "
              "parameters), and its call acts on its own problem only.",
              "problem low { init = meta  reinit = true ... }", "problem low { init = meta ... }"),
    "E217": E("`warmup = N` trains the lower problem alone for N steps before the upper's first "
              "step; a lower problem that starts again at every upper step (`init`, `reinit`) would "
              "throw that training away.",
              "meta -> task { warmup = 100 }     # task has init = meta", "meta -> task"),
    "E218": E("`itd` differentiates through the lower problem's unrolled steps, one batch per step; "
              "`accumulate` averages several micro-batches into one step. Both cannot hold: use "
              "another method on that edge (cg, neumann, sama) or drop `accumulate`.",
              "meta -> task { hypergrad = itd(steps=5) }     # task: accumulate = 4",
              "meta -> task { hypergrad = cg(iters=10) }"),
    "E219": E("`vmap = true` solves a meta-batch of independent tasks of one lower problem in one "
              "vectorized call. It needs a meta-batch (`accumulate = k`), one lower problem that "
              "starts again per task (`init` or `reinit`), and a method and optimizer that run "
              "under vmap; the message says which is missing.",
              "problem meta { ... vmap = true }    # accumulate is 1", "problem meta { ... accumulate = 4  vmap = true }"),
    "E220": E("Under `strategy = fsdp` every module is sharded by FSDP2: each parameter's gradient "
              "reaches it only through `backward()` into `.grad`, which cannot be differentiated "
              "again. A method that needs Hessian-vector products (cg, neumann) or differentiates "
              "through unrolled steps (itd) cannot run there; the first-order methods can "
              "(`MethodCaps.shards` in the registry).",
              "train { strategy = fsdp }  outer -> inner { hypergrad = cg(iters=5) }",
              "train { strategy = fsdp }  outer -> inner { hypergrad = sama }"),
    "E221": E("Under `strategy = fsdp` each rank holds a shard of every parameter and of its gradient, "
              "and the run path takes plain steps and first-order hypergradients of two-level programs, "
              "committed by mloc's functional optimizers on the shards. A setting that needs a whole "
              "tensor (Shampoo's matrices, clip_grad_norm's norm, fp16 loss scaling), a whole module "
              "(`project`, `init`, `reinit`), three levels, interlocking stages or meta-batches is "
              "refused, with what to use instead (mloc.shared.sharding). `mloc run --strategy fsdp` "
              "refuses the same with exit 2, and `--compile on` besides.",
              "train { strategy = fsdp }  problem inner { optimizer = shampoo(lr=0.01) }",
              "train { strategy = fsdp }  problem inner { optimizer = adam(lr=0.01) }"),
    "E301": E("An optimizer mloc does not provide. The built-ins are listed in the help; torch's own "
              "optimizers are written in full as a call, e.g. `torch.optim.SGD(lr=0.1)`, and `SGD` "
              "alone gets a did-you-mean to `sgd`.",
              "optimizer = SGD(lr=0.1)", "optimizer = sgd(lr=0.1)"),
    "E302": E("A hypergradient method mloc does not provide (the available ones are listed: "
              "`itd`, `cg`, `neumann`, `sama`, `first_order`, `auto`, ...).",
              "high -> low { hypergrad = implicit }", "high -> low { hypergrad = cg(iters=10) }"),
    "E303": E("A keyword argument the built-in does not take: a typo, or an option of another "
              "built-in. The message lists the arguments it takes.",
              "optimizer = sgd(learning_rate=0.1)", "optimizer = sgd(lr=0.1)"),
    "E304": E("A value of the wrong type for its field or argument (a string where a number goes, "
              "a call where a literal goes); the message names the expected type.",
              'optimizer = sgd(lr="0.1")', "optimizer = sgd(lr=0.1)"),
    "E305": E("A value outside its allowed range (a negative learning rate, `unroll = 0`, a "
              "momentum of 1 or more); the label gives the bound. Counts also have mloc's bounds, "
              "named in a note: at most 10**9 over the whole run (`steps`, `warmup`, an interval, a "
              "schedule's length, any other integer a built-in takes) and at most 10**6 for a count "
              "repeated in every outer step (`unroll`, `accumulate`, a method's `iters`, `itd`'s "
              "`steps` and `truncate`): a run past them would not finish. A seed is at most 2**63 - 1 "
              "(torch's generators overflow past 2**64 - 1), a `memory_budget` at most 2**64 bytes.",
              "high -> low { unroll = 0 }", "high -> low { unroll = 1 }"),
    "E306": E("A required argument is absent (a learning rate, a schedule's `total`); the help "
              "shows the call with it.",
              "optimizer = sgd()", "optimizer = sgd(lr=0.1)"),
    "E307": E("The same argument given twice, by keyword or once by position and once by keyword.",
              "optimizer = sgd(lr=0.1, lr=0.01)", "optimizer = sgd(lr=0.1)"),
    "E308": E("A positional argument after a keyword argument, as in Python.",
              "hypergrad = neumann(iters=3, 0.1)", "hypergrad = neumann(iters=3, alpha=0.1)"),
    "E309": E("More positional arguments than the built-in takes; name them with keywords.",
              "optimizer = sgd(0.1, 0.9, 5e-4, 0.1)", "optimizer = sgd(lr=0.1, momentum=0.9, weight_decay=5e-4)"),
    "E310": E("A field whose value must be a call (a module, a data loader, a loss), given a bare "
              "name or a literal.",
              "module = lib.MLP", "module = lib.MLP(hidden=64)"),
    "E311": E("A schedule (or other built-in) mloc does not provide; torch's own schedulers are "
              "written in full, e.g. `torch.optim.lr_scheduler.StepLR(step_size=10)`.",
              "schedule = cosin(total=1000)", "schedule = cosine(total=1000)"),
    "E401": E("The method cannot differentiate this lower problem: implicit methods (cg, neumann) "
              "and itd need a differentiable update, which an optimizer that updates in place "
              "outside autograd (a `torch.optim` class, Shampoo) does not give. Use a method that "
              "needs no derivative of the update (`first_order`, `sama` where allowed) or a "
              "built-in functional optimizer.",
              "high -> low { hypergrad = itd(steps=5) }     # low: torch.optim.SGD",
              "problem low { ... optimizer = sgd(lr=0.1) }"),
    "E402": E("`itd(steps=K)` and `truncate` count unrolled lower steps, which must fit in the "
              "edge's `unroll` (the lower steps per upper step).",
              "high -> low { hypergrad = itd(steps=10), unroll = 5 }",
              "high -> low { hypergrad = itd(steps=5), unroll = 5 }"),
    "E403": E("The upper problem enters the lower one only through `init` (MAML), which an "
              "implicit method cannot see: it differentiates the lower loss at its solution, where "
              "the starting point has no effect. Use `itd` or `first_order`, or read the upper "
              "problem in the loss as well (a proximal term, as iMAML does).",
              "meta -> task { hypergrad = cg(iters=10) }     # task: init = meta",
              "meta -> task { hypergrad = itd(steps=5) }"),
    "E404": E("Above two levels, `exact` semantics differentiate the best response of a middle "
              "problem that reads a lower one, which needs a method that can itself be "
              "differentiated (cg, neumann, first_order). Choose one on the edges below that middle "
              "level, or set `semantics = per_edge` (Betty's per-edge approximation).",
              "mid -> low { hypergrad = sama }", "mid -> low { hypergrad = cg(iters=10) }"),
    "E501": E("An interlocking chain needs at least two stages: with one, there is no stage to "
              "interlock with, and the problem is plain training.",
              "chain [stage1] { interlock = 1 }", "chain [stage1, stage2] { interlock = 1 }"),
    "E502": E("`interlock = n` says how many stages each loss's gradient flows through: between 1 "
              "(local learning) and the number of stages (end to end).",
              "chain [s1, s2, s3] { interlock = 4 }", "chain [s1, s2, s3] { interlock = 2 }"),
    "E503": E("A problem may be a stage of one chain, once.",
              "chain [s1, s2, s1] { interlock = 2 }", "chain [s1, s2, s3] { interlock = 2 }"),
    "E504": E("Two stages of one chain are also joined by a hierarchy edge: a stage is either a "
              "level of the hierarchy or a stage of the chain, not both.",
              "chain [s1, s2] { interlock = 1 }\ns1 -> s2", "chain [s1, s2] { interlock = 1 }"),
    "E505": E("Each stage of a chain reads the features of the stage before it, so its loss names "
              "that stage.",
              "loss = lib.stage_loss(stage1, stage3, batch)    # in stage3",
              "loss = lib.stage_loss(stage2, stage3, batch)"),
    "E601": E("The train block's actions are `eval [NAME] every N = CALL`, `checkpoint every N`, "
              "`log every N`, `checkpoint best on METRIC` and `stop when METRIC has not improved for "
              "N evals`; anything else is reported here.",
              "train { plot every 100 }", "train { log every 100 }"),
    "E602": E("A program has one train block, which sets the run's steps, seed, precision and "
              "actions; merge the two into one.",
              "train { steps = 100 }\ntrain { seed = 0 }", "train { steps = 100, seed = 0 }"),
    "E603": E("`checkpoint best on` or `stop when` names a metric no evaluation produces: name an "
              "evaluation (`eval acc every 100 = ...`), or a key of the dict it returns.",
              "checkpoint best on max accuracy      # the evaluation is named acc",
              "checkpoint best on max acc"),
    "E604": E("mloc cannot guess whether a higher or a lower value of a watched metric is better: "
              "say `max` or `min` (once; two uses of one metric cannot disagree).",
              "checkpoint best on acc", "checkpoint best on max acc"),
    "E605": E("Two evaluations with the same name (given, or taken from the called function): "
              "their metrics would overwrite each other. Name them apart.",
              "eval every 100 = lib.accuracy(model, lib.val())\neval every 100 = lib.accuracy(model, lib.test())",
              "eval val_acc every 100 = lib.accuracy(model, lib.val())\n"
              "eval test_acc every 100 = lib.accuracy(model, lib.test())"),
    "E701": E("The dataflow traced from the real losses (torch.fx, on the meta device) disagrees "
              "with what the file says: a loss names a problem none of whose parameters reach it (an "
              "unused argument, a `.detach()`), or depends on a problem it does not name. Fix the "
              "loss or the names passed to it.",
              "def loss(model, hyper, batch): return ce(model(batch[0]), batch[1])   # hyper unused",
              "def loss(model, hyper, batch): return (hyper.w(batch) * ce_each(...)).mean()"),
    "E702": E("The program's own Python code raised an error while mloc built a module, drew a "
              "batch, traced a loss or ran an evaluation. The message shows the exception and your "
              "file's lines where it was raised; the span is the .mlo field that called it. Data that "
              "yields no batch at all (an empty list or dataset) is reported here too, and so is a "
              "loss of an interlocking chain that breaks the chain contract (stage k's loss calls "
              "stages 1..k once each, in order, each on the previous one's output, and reads "
              "nothing of an earlier stage past the cut; docs/interlocking.md).",
              "module = lib.MLP(hiden=64)       # MLP.__init__() got an unexpected keyword",
              "module = lib.MLP(hidden=64)"),
    "E703": E("A loss must return a floating-point scalar tensor that autograd can differentiate. "
              "Returning a tensor with a batch dimension (forgot `.mean()`), an integer tensor, or a "
              "Python number (`.item()` detaches the loss from the graph) is reported here.",
              "return F.cross_entropy(out, y).item()", "return F.cross_entropy(out, y)"),
    "E704": E("A construct that `mloc check` accepts but that cannot be compiled or run yet (a "
              "built-in without a runtime, or a construct the runtime does not execute). `mloc "
              "check` warns about the latter (W103); the help names what to use for now.",
              "optimizer = shampoo(lr=0.1)     # when it has no runtime", "optimizer = adam(lr=1e-3)"),
    "E705": E("`init = U` starts a problem from U's parameters, so both modules must have the same "
              "parameters (names and shapes). The message names the parameters that differ.",
              "module = lib.MLP(hidden=32)      # meta: lib.MLP(hidden=64), task: init = meta",
              "module = lib.MLP(hidden=64)"),
    "E706": E("A problem's batches and its module's parameters have floating dtypes its loss "
              "cannot mix (float64 data into a float32 model). Cast the data in your loader, or set "
              "the precision in the train block.",
              "return torch.from_numpy(x)        # float64 batches, float32 model",
              "return torch.from_numpy(x).float()"),
    "E707": E("An evaluation is tried once on the initial modules before training: it must return "
              "a number, a 0-dim tensor, or a dict of them (each key a metric).",
              "def accuracy(model, data): return preds == labels        # a tensor of booleans",
              "def accuracy(model, data): return (preds == labels).float().mean()"),
    "E708": E("The stages of an interlocking chain read one batch per chain step, so every stage's "
              "`data` is the same call.",
              "data = lib.loader(batch_size=64)     # stage2; stage1 has batch_size=32",
              "data = lib.loader(batch_size=32)"),
    "E709": E("A problem's `data` is an iterable of batches: each item is one batch that its loss "
              "receives as `batch`. A number, a numpy array, or a tuple of tensors (the fields of one "
              "batch, which would be iterated as two batches) is not; nor are batches of numpy "
              "arrays, since a loss receives tensors. Return a `DataLoader`, or a list of batches.",
              "def loader(): return (x, y)", "def loader(): return DataLoader(TensorDataset(x, y), batch_size=64)"),
    "E710": E("A `torch.optim.lr_scheduler` schedule is driven by the problem's step count and "
              "applied to everything it sets in the optimizer's param group: the rate, and the "
              "momentum OneCycleLR and CyclicLR cycle by default (`betas[0]` of Adam, `momentum` of "
              "SGD). mloc builds the scheduler on the problem's optimizer before training, so what "
              "torch refuses is an error at the schedule: cycling the momentum of an optimizer that "
              "has neither (Adagrad), a scheduler whose `step` needs a metric (ReduceLROnPlateau), "
              "bad arguments; and, while training, a schedule that runs out (OneCycleLR past "
              "`total_steps`).",
              "schedule = torch.optim.lr_scheduler.CyclicLR(base_lr=0.01, max_lr=0.1)   # optimizer: torch.optim.Adagrad",
              "schedule = torch.optim.lr_scheduler.CyclicLR(base_lr=0.01, max_lr=0.1, cycle_momentum=false)"),
    "W101": E("An import no field uses. Remove it, or use it; `mloc check` never runs it either way.",
              "import unused_helpers as h", ""),
    "W102": E("An argument that has no effect with the other options chosen, such as "
              "`nesterov=true` without momentum.",
              "optimizer = sgd(lr=0.1, nesterov=true)", "optimizer = sgd(lr=0.1, momentum=0.9, nesterov=true)"),
    "W103": E("A construct that checks but cannot run yet: `mloc check` reports it as a warning so "
              "that a clean check does not first fail at `mloc run` (which stops with E704 there). "
              "The help says what to do instead.",
              "chain [s1, s2] { interlock = 1 }     # with a stage also in a hierarchy", ""),
    "W104": E("A `data` value whose items are single examples (a map-style `Dataset`) or rows (a "
              "lone tensor), not batches: the loss would get one example per step. Wrap the dataset "
              "in a `DataLoader` with a batch size.",
              "def loader(): return MyDataset()", "def loader(): return DataLoader(MyDataset(), batch_size=64, shuffle=True)"),
    "W105": E("`--steps N` ends the run before a problem's learning-rate schedule ends (a cosine or "
              "linear `total`, a multistep's last milestone, counted in that problem's own steps): "
              "the rate never decays as the schedule says. Fine for a quick try; for a real run, give "
              "more steps or shorten the schedule with `--set`.",
              "mloc run programs/data_reweighting.mlo --steps 200     # cosine(total=3000)",
              "mloc run programs/data_reweighting.mlo --steps 200 --set 'classifier.schedule.total=200'"),
    "W106": E("Shampoo starts preconditioning before its first roots are in use: the roots start "
              "as identities, the first are computed at step `update_every` and used `staleness` "
              "steps later, so the steps in between move along the raw gradient rescaled to the "
              "graft's norm: neither the grafted optimizer's direction nor a preconditioned one "
              "(the reference implementation and pytorch-optimizer's `ScalableShampoo` do the same; "
              "in bench/shampoo_tuning.py, starting at the first roots lowered the −1/2-exponent "
              "runs' 500-step loss on the logistic regression 2–280×). Start at "
              "`update_every + staleness - 1`, or refresh the roots sooner.",
              "optimizer = shampoo(lr=0.01, update_every=10, start_preconditioning_step=5)",
              "optimizer = shampoo(lr=0.01, update_every=10, start_preconditioning_step=9)"),
    "W107": E("OneCycleLR and CyclicLR cycle the momentum by default (`cycle_momentum=true`), from "
              "their own `base_momentum` to `max_momentum`, whatever the optimizer declared: on an "
              "optimizer built without momentum (`sgd(lr=...)`) that turns it on, as torch does with "
              "`torch.optim.SGD`. mloc applies it, and says so.",
              "schedule = torch.optim.lr_scheduler.CyclicLR(base_lr=0.01, max_lr=0.1)   # optimizer: sgd(lr=0.01)",
              "schedule = torch.optim.lr_scheduler.CyclicLR(base_lr=0.01, max_lr=0.1, cycle_momentum=false)"),
    "W108": E("A trainable parameter of a problem reaches no loss its gradient comes from (its own "
              "loss and, for an upper problem, the losses of the problems below it): a BatchNorm or a "
              "head defined in `__init__` but never called in `forward`, an embedding used only under "
              "`no_grad`. Every hypergradient method gives it a zero gradient, and its optimizer leaves "
              "it as it is, with no weight decay or momentum step, as a hand-written loop with "
              "`torch.optim` leaves a parameter whose `.grad` is None. If that is intended, declare "
              "it `frozen`; otherwise call it in the loss.",
              "problem net { module = lib.Net()   # Net defines self.aux = nn.Linear(8, 2), never called",
              'problem net { module = lib.Net()   frozen = ["aux.*"]'),
    "E900": E("A bug in mloc, not in your program: an internal invariant broke. Please report it "
              "with the .mlo file and its Python module; `MLOC_DEBUG=1` shows the traceback.",
              "MLOC_DEBUG=1 mloc compile prog.mlo", ""),
}


def explain(code: str) -> str:
    """The text `mloc explain CODE` prints for a registered code."""
    c = CODES[code]
    e = EXPLANATIONS.get(code)
    head = f"{c.code} ({c.name}, {c.severity}): {c.summary}"
    if e is None:
        return head
    out = [head, "", textwrap.fill(e.text, width=88), "", "example:" if e.right else "example of what it reports:"]
    out += [f"    {line}" for line in e.wrong.splitlines()]
    if e.right:
        out += ["fixed:"] + [f"    {line}" for line in e.right.splitlines()]
    return "\n".join(out)
