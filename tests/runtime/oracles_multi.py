"""Oracles above two levels (T, D, a many-path 4-level DAG) and MAML (M), in float64."""

from __future__ import annotations

import torch

from mloc.runtime import Edge, Problem, cg, first_order, itd, sgd
from tests.runtime.hand_built import hierarchy
from tests.runtime.oracles import F64, gen, leaf, randn, spd

solve = torch.linalg.solve


class Trilevel:
    """Oracles T (``dag=False``) and D (``dag=True``): bottom w, middle x, top λ.

    f₁ = ½wᵀA₁w − wᵀ(B₁x + c₁ + D₁λ);  f₂ = ½xᵀA₂x − xᵀ(B₂λ+c₂) + ½‖C₂w + E₂x − e₂‖²;
    F = ½‖C₃x − e₃‖² + ½ρ‖λ‖². Without feedback: T has C₂ = 0; D has B₁ = 0, and then
    w no longer depends on x, so its hierarchy is λ → w → x, λ → x (Betty's two paths).
    """

    def __init__(self, seed, dag=False, feedback=True, d1=4, d2=3, m=2, p=3, rho=0.2,
                 top_reads_w=False):
        g = gen(seed)
        self.dag, self.feedback, self.rho = dag, feedback, rho
        self.C4 = randn(g, p, d1) if top_reads_w else torch.zeros(p, d1, dtype=F64)
        self.top_reads_w = top_reads_w
        self.A1, self.B1, self.c1 = spd(g, d1), randn(g, d1, d2), randn(g, d1)
        self.D1 = randn(g, d1, m) if dag else torch.zeros(d1, m, dtype=F64)
        self.A2, self.B2, self.c2 = spd(g, d2), randn(g, d2, m), randn(g, d2)
        self.C2, self.E2, self.e2 = randn(g, p, d1), randn(g, p, d2), randn(g, p)
        self.C3, self.e3, self.lam0 = randn(g, p, d2), randn(g, p), randn(g, m)
        if not feedback:
            (self.B1 if dag else self.C2).zero_()
        self.G = self.C2 @ solve(self.A1, self.B1) + self.E2
        self.K = self.C2 @ solve(self.A1, self.D1)

    def w_star(self, x, lam):
        return solve(self.A1, self.B1 @ x + self.c1 + self.D1 @ lam)

    def x_star(self, lam):
        h = self.C2 @ solve(self.A1, self.c1 + self.D1 @ lam) - self.e2
        return solve(self.A2 + self.G.T @ self.G, self.B2 @ lam + self.c2 - self.G.T @ h)

    def top(self, x, lam):
        return 0.5 * ((self.C3 @ x - self.e3) ** 2).sum() + 0.5 * self.rho * (lam ** 2).sum()

    def outer(self, lam):
        """F(λ) with both inner problems solved exactly (nested)."""
        x = self.x_star(lam)
        return self.top(x, lam) + self.top_w(self.w_star(x, lam))

    def top_w(self, w):
        """The top's direct term in the bottom (zero unless ``top_reads_w``)."""
        return 0.5 * ((self.C4 @ w - self.e3) ** 2).sum() if self.top_reads_w else 0.0

    def r(self):
        return self.C3.T @ (self.C3 @ self.x_star(self.lam0) - self.e3)

    def exact(self):
        h = solve(self.A2 + self.G.T @ self.G, self.r())
        return self.rho * self.lam0 + (self.B2 - self.G.T @ self.K).T @ h

    def reduced_hessian(self, semantics):
        """The middle's Hessian each semantics inverts: A₂ + GᵀG (exact) or A₂ + E₂ᵀE₂."""
        g = self.G if semantics == "exact" or (self.dag and not self.feedback) else self.E2
        return self.A2 + g.T @ g

    def with_q(self, q, semantics):
        """ρλ + (mixed)ᵀq for a middle method whose solve returns q (the bottom exact)."""
        exact_mixed = semantics == "exact" or (self.dag and not self.feedback)
        mixed = self.B2 - self.G.T @ self.K if exact_mixed else self.B2
        return self.rho * self.lam0 + mixed.T @ q

    def per_edge(self):
        """IFT on each edge's own loss; equals ``exact`` for D without feedback (two paths)."""
        if self.dag and not self.feedback:
            return self.exact()
        return self.rho * self.lam0 + self.B2.T @ solve(self.A2 + self.E2.T @ self.E2, self.r())

    def middle_grad(self, semantics):
        """The middle's stationarity map each semantics differentiates: the reduced
        gradient (w at w*(x, λ)) for `exact`; per edge, the gradient with w frozen at w*,
        tilted by a constant so that x* stays its zero."""
        if semantics == "exact" or (self.dag and not self.feedback):
            def reduced(x, lam):
                h = self.C2 @ solve(self.A1, self.c1 + self.D1 @ lam) - self.e2
                return self.A2 @ x - self.B2 @ lam - self.c2 + self.G.T @ (self.G @ x + h)
            return reduced
        x0 = self.x_star(self.lam0)
        w0 = self.w_star(x0, self.lam0)

        def frozen(x, lam):
            return (self.A2 @ x - self.B2 @ lam - self.c2
                    + self.E2.T @ (self.C2 @ w0 + self.E2 @ x - self.e2))
        tilt = frozen(x0, self.lam0)
        return lambda x, lam: frozen(x, lam) - tilt

    def frozen_outer(self, lam):
        """The bilevel problem the per-edge formula differentiates exactly (x solves the
        frozen, tilted stationarity map; it is affine in x)."""
        x0 = self.x_star(self.lam0)
        grad = self.middle_grad("per_edge")
        return self.top(x0 - solve(self.reduced_hessian("per_edge"), grad(x0, lam)), lam)

    def unrolled_outer(self, semantics, steps, alpha):
        """F_T(λ): T gradient steps on the middle's map (per semantics) from the fixed x*."""
        x0, grad = self.x_star(self.lam0), self.middle_grad(semantics)

        def f(lam):
            x = x0
            for _ in range(steps):
                x = x - alpha * grad(x, lam)
            return self.top(x, lam)
        return f

    def f1(self, w, x, lam):
        return 0.5 * w @ self.A1 @ w - w @ (self.B1 @ x + self.c1 + self.D1 @ lam)

    def f2(self, x, w, lam):
        return (0.5 * x @ self.A2 @ x - x @ (self.B2 @ lam + self.c2)
                + 0.5 * ((self.C2 @ w + self.E2 @ x - self.e2) ** 2).sum())

    def program(self, semantics, wrap=lambda m: m, middle=None):
        x0 = self.x_star(self.lam0)
        w, x, lam = leaf(self.w_star(x0, self.lam0)), leaf(x0), leaf(self.lam0)
        cw, cx = wrap(cg(len(w))), wrap(middle or cg(len(x)))
        probs = [
            Problem("w", (w,), lambda w, x, l: self.f1(w[0], x[0], l[0]), ("w", "x", "lam"), sgd(0.1)),
            Problem("x", (x,), lambda x, w, l: self.f2(x[0], w[0], l[0]), ("x", "w", "lam"), sgd(0.1)),
            Problem("lam", (lam,), lambda x, w, l: self.top(x[0], l[0]) + self.top_w(w[0]),
                    ("x", "w", "lam")),
        ]
        if self.dag and not self.feedback:
            edges = [Edge("lam", "w", cw), Edge("w", "x", cx), Edge("lam", "x", cx)]
        else:
            edges = [Edge("lam", "x", cx), Edge("x", "w", cw)]
            edges += [Edge("lam", "w", cw)] if self.dag else []
        return hierarchy(probs, edges, semantics), lam


class Layered:
    """A 4-level quadratic DAG with many paths: top λ, then ``width`` problems per level,
    dense edges between consecutive levels and skip edges λ → level 2. Each lower solves
    ½θᵀAθ − θᵀ(Σ_u B_u θ_u + c); the top reads the bottom level. No feedback, so the
    nested and per-edge hypergradients agree."""

    def __init__(self, seed, width=3, d=3, m=2, rho=0.1):
        g = gen(seed)
        self.levels = [["lam"]] + [[f"p{k}{i}" for i in range(width)] for k in (1, 2, 3)]
        self.uppers = {n: list(self.levels[k - 1]) for k in (1, 2, 3) for n in self.levels[k]}
        for n in self.levels[2]:
            self.uppers[n].append("lam")
        dim = {n: d for lv in self.levels[1:] for n in lv} | {"lam": m}
        self.A = {n: spd(g, d) for n in self.uppers}
        self.B = {(n, u): randn(g, d, dim[u]) for n in self.uppers for u in self.uppers[n]}
        self.c = {n: randn(g, d) for n in self.uppers}
        self.C = {n: randn(g, 4, d) for n in self.levels[3]}
        self.e, self.lam0, self.rho = randn(g, 4), randn(g, m), rho

    def solve_all(self, lam):
        value = {"lam": lam}
        for level in self.levels[1:]:
            for n in level:
                rhs = sum(self.B[n, u] @ value[u] for u in self.uppers[n]) + self.c[n]
                value[n] = solve(self.A[n], rhs)
        return value

    def top(self, bottoms, lam):
        y = sum(self.C[n] @ b for n, b in zip(self.levels[3], bottoms))
        return 0.5 * ((y - self.e) ** 2).sum() + 0.5 * self.rho * (lam ** 2).sum()

    def outer(self, lam):
        value = self.solve_all(lam)
        return self.top([value[n] for n in self.levels[3]], lam)

    def program(self, semantics="per_edge", wrap=lambda m: m):
        value = {n: leaf(t) for n, t in self.solve_all(self.lam0).items()}
        probs = [Problem("lam", (value["lam"],), lambda *a: self.top([t[0] for t in a[:-1]], a[-1][0]),
                         tuple(self.levels[3]) + ("lam",))]
        edges = []
        for n, ups in self.uppers.items():
            method = wrap(cg(len(value[n])))
            probs.append(Problem(n, (value[n],), self._loss(n), (n, *ups), sgd(0.1)))
            edges += [Edge(u, n, method) for u in ups]
        return hierarchy(probs, edges, semantics), value["lam"]

    def _loss(self, n):
        def loss(theta, *ups):
            rhs = sum(self.B[n, u] @ t[0] for u, t in zip(self.uppers[n], ups)) + self.c[n]
            return 0.5 * theta[0] @ self.A[n] @ theta[0] - theta[0] @ rhs
        return loss


class Maml:
    """Oracle M: L_tr = ½(θ−a)ᵀA(θ−a), L_val = ½(θ−b)ᵀC(θ−b), K steps of size α."""

    def __init__(self, seed, d=4, steps=3, alpha=0.1, kappa=0.7):
        g = gen(seed)
        self.A, self.C = spd(g, d), spd(g, d)
        self.a, self.b, self.theta0 = randn(g, d), randn(g, d), randn(g, d)
        self.steps, self.alpha, self.kappa = steps, alpha, kappa
        self.eye = torch.eye(d, dtype=F64)

    def adapted(self, theta0):
        contraction = torch.linalg.matrix_power(self.eye - self.alpha * self.A, self.steps)
        return self.a + contraction @ (theta0 - self.a)

    def proximal(self, theta0):
        return solve(self.A + self.kappa * self.eye, self.A @ self.a + self.kappa * theta0)

    def val(self, theta):
        return 0.5 * (theta - self.b) @ self.C @ (theta - self.b)

    def tr(self, theta):
        return 0.5 * (theta - self.a) @ self.A @ (theta - self.a)

    def maml(self):
        contraction = torch.linalg.matrix_power(self.eye - self.alpha * self.A, self.steps)
        return contraction @ self.C @ (self.adapted(self.theta0) - self.b)

    def fomaml(self):
        return self.C @ (self.adapted(self.theta0) - self.b)

    def imaml(self):
        phi = self.proximal(self.theta0)
        return self.kappa * solve(self.A + self.kappa * self.eye, self.C @ (phi - self.b))

    def program(self, kind):
        """``maml``/``fomaml``: the task adapts δ with θ = θ₀ + δ; ``imaml``: proximal φ."""
        meta = leaf(self.theta0)
        if kind == "imaml":
            task = leaf(self.proximal(self.theta0))
            inner = lambda p, t: self.tr(p[0]) + 0.5 * self.kappa * ((p[0] - t[0]) ** 2).sum()  # noqa: E731
            outer, reads, method = (lambda p: self.val(p[0])), ("task",), cg(len(task))
        else:
            start = self.adapted(self.theta0) - self.theta0 if kind == "fomaml" else 0 * meta
            task = leaf(start.detach())
            inner = lambda p, t: self.tr(t[0] + p[0])  # noqa: E731
            outer, reads = (lambda p, t: self.val(t[0] + p[0])), ("task", "meta")
            method = first_order() if kind == "fomaml" else itd(self.steps)
        probs = [Problem("task", (task,), inner, ("task", "meta"), sgd(self.alpha)),
                 Problem("meta", (meta,), outer, reads)]
        return hierarchy(probs, [Edge("meta", "task", method)]), meta
