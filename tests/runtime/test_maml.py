"""Oracle M: MAML (itd through K steps), FO-MAML (first_order), iMAML (cg on the proximal
problem) on quadratic tasks, against their closed forms (float64, relative 1e-10)."""

import pytest

from tests.runtime.oracles import rel
from tests.runtime.oracles_multi import Maml

TOL = 1e-10


@pytest.mark.parametrize("seed,d,steps", [(0, 4, 3), (1, 6, 1), (2, 3, 5), (3, 5, 8)])
@pytest.mark.parametrize("kind", ["maml", "fomaml", "imaml"])
def test_maml_family(seed, d, steps, kind):
    m = Maml(seed, d, steps)
    hier, meta = m.program(kind)
    hier.hypergrad("meta")
    assert rel(meta.grad, getattr(m, kind)()) < TOL
