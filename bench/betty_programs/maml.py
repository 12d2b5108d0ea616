"""programs/maml.mlo (MAML: the meta-gradient through 5 unrolled SGD steps, ``itd``) and Betty.

Betty's implicit types (``darts``, ``sama``, ``neumann``, ``cg``; ``reinforce`` a stub) are
implicit-function approximations; differentiating through the unrolled steps is its
``IterativeProblem`` (functorch's functional modules and patched optimizers), which 0.2.1 cannot
construct on torch 2.x: its ``initialize`` walks the patched optimizer's ``param_groups`` for a
``"params"`` key that is not there. The evidence is that failure, reproduced here."""

from __future__ import annotations

import torch

import sinusoid as tasks
from betty_programs.common import Cast, copies, engine, failure

PROGRAM = "maml"
BETTY = ("no unrolled differentiation: its IterativeProblem (ITD) fails at Engine set-up on torch 2.x "
         "(KeyError 'params' in initialize_optimizer_state)")
METHOD = "itd(steps=5, mode=reverse) → IterativeProblem (none of Config.type is ITD)"


def _attempt():
    """Betty's MAML as its docs write an ITD problem: the inner problem an IterativeProblem."""
    from betty.configs import Config
    from betty.problems import ImplicitProblem, IterativeProblem
    m = copies({"meta": tasks.SineNet(hidden=40), "adapt": tasks.SineNet(hidden=40)})

    class Adapt(IterativeProblem):
        def training_step(self, batch):
            return tasks.mse(lambda x: self.fmodule(self.params, self.buffers, x), batch)

    class Meta(ImplicitProblem):
        def training_step(self, batch):
            return tasks.mse(lambda x: self.adapt.fmodule(self.adapt.params, self.adapt.buffers, x), batch)

    adapt = Adapt(name="adapt", module=m["adapt"], optimizer=torch.optim.SGD(m["adapt"].parameters(), lr=0.01),
                  config=Config(unroll_steps=5, first_order=False),
                  train_data_loader=Cast(tasks.sine_tasks(split="support", shots=10), torch.float32))
    meta = Meta(name="meta", module=m["meta"], optimizer=torch.optim.Adam(m["meta"].parameters(), lr=1e-3),
                config=Config(first_order=False),
                train_data_loader=Cast(tasks.sine_tasks(split="query", shots=10), torch.float32))
    engine([meta, adapt], {meta: [adapt]}, {adapt: [meta]}, calls=5)()


def evidence() -> list[tuple[str, str]]:
    return [("Engine([meta, adapt]) with adapt an IterativeProblem", failure(_attempt))]
