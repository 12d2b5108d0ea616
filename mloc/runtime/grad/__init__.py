"""How a problem's gradient is produced and composed: the ``Problem`` and its lower
linearization, the gradient sources (plain, hypergradient, the interlocking chain step with
its contract, a vectorized meta-batch), accumulation, the composition of BR-VJPs by
adjoints, and the one commit pipeline every source feeds, with the rules around a step
(module buffers change only in their own problem's steps; the finite guard), and the look
at models and losses on the meta device that the chain contract and the compiler's trace
use. It may import ``files``, ``base``, ``optim`` and ``methods``.
"""
