"""Best-response vector-Jacobian products (BR-VJPs): one small factory per method.

For a lower problem ``θ*(x) = argmin_θ L(θ, x)`` and an adjoint ``v = ∂F/∂θ``, a BR-VJP
returns ``(dθ*/dx)ᵀ v = -J_xᵀ H⁻¹ v`` (``H = ∇²_θθ L``, ``J_x = ∇²_θx L``) for every upper
``x`` the loss reads, never building a Jacobian. Methods differ only in how
``q ≈ H⁻¹v`` is formed, each derived in its module with the paper it follows: ``itd``
(``unrolled.py``: Maclaurin et al. 2015, Franceschi et al. 2017), ``cg`` and ``neumann``
(``implicit.py``: Rajeswaran et al. 2019, Lorraine et al. 2020), ``finite_diff``, ``sama``
and ``first_order`` (``finite.py``: Liu et al. 2019, Choe et al. 2023, Finn et al. 2017).
The closed forms the tests compare them with are ``tests/runtime/oracles.py``.

Every method object has

- ``prepare(op) -> point``: where the uppers evaluate this lower. The live parameters,
  except for ``itd``, which unrolls its steps here and returns ``θ_K`` as a fresh leaf.
- ``vjp(op, v, create_graph=False) -> (outputs, cotangents) | None``: a VJP *spec*. The
  contribution to an upper's parameters ``x`` is ``autograd.grad(outputs, x, cotangents)``;
  the composer folds the specs of an upper's own edges into one final ``backward``.
  ``None`` means "no indirect term" (``first_order``).

Methods are frozen dataclasses (their fields are the options of the language) and are
linear in ``v``: adjoints can be summed before a single application. What the composer
plans around (a method that unrolls, reverse-mode ``itd`` fused with the top's backward,
``first_order`` skipped entirely) is declared once, in the descriptor's ``MethodCaps``.
A method may also offer ``two_level(lower, args, buffers, upper_loss, upper_args, seeds,
params) -> step``: its whole two-level hypergradient step as one closure, built once per
plan (``finite_diff`` and ``sama``, whose steps are short enough for the runtime's own
Python to show); it must write the same ``.grad`` bits as the general path.

Each factory is named by its descriptor's ``runtime`` in ``mloc.builtins.methods`` (the one
registry of methods: signature, capabilities, cost).
"""

from mloc.runtime.methods.finite import finite_diff, first_order, sama
from mloc.runtime.methods.implicit import cg, neumann
from mloc.runtime.methods.unrolled import itd

__all__ = ["cg", "finite_diff", "first_order", "itd", "neumann", "sama"]
