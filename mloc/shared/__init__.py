"""Torch-free facts the compiler and the runtime both read, one home each, and neither's:
this package imports nothing else of mloc, so generated code and the runtime read them
without loading the compiler, and the checker without loading torch.

- :mod:`mloc.shared.composition`: the names of the semantics and the `Composition` of an
  upper's hypergradient (the planner computes it, the runtime executes it);
- :mod:`mloc.shared.interlock`: who trains whom in an interlocking chain;
- :mod:`mloc.shared.roots`: when Shampoo's inverse roots are computed and used;
- :mod:`mloc.shared.hyper`: each optimizer's hyperparameter record (its descriptor's
  signature, and what its implementation steps with);
- :mod:`mloc.shared.limits`: mloc's bounds on step counts and seeds (the checker's field
  types, both doors' flags);
- :mod:`mloc.shared.precision`: the autocast precisions;
- :mod:`mloc.shared.version`: mloc's version;
- :mod:`mloc.shared.warning`: mloc's warning category, and its one-line form where mloc owns the
  terminal.
"""
