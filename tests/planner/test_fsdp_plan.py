"""`strategy = fsdp` at `mloc plan`: a method the registry does not shard is refused (E220,
its reason from `MethodCaps.unsharded_reason`), and `auto` chooses among those that shard.
(The other settings fsdp refuses are E221: tests/runtime/test_fsdp_refusals.py.)"""

from __future__ import annotations

from tests.run.helpers import SMALL

FSDP = ["--set", "train.strategy=fsdp"]
AUTO = ["--set", "weights->net.hypergrad=auto"]


def test_neumann_is_refused_with_the_registry_reason(mloc_here):
    ran = mloc_here("plan", SMALL, *FSDP)
    assert ran.returncode == 1
    assert "E220" in ran.stderr and "E305" not in ran.stderr
    assert ("`neumann` on `weights -> net` cannot run under `strategy = fsdp`: it solves with "
            "Hessian-vector products of the lower's whole loss") in ran.stderr
    assert "use `finite_diff`, `sama` or `first_order` on this edge" in ran.stderr


def test_auto_where_only_itd_applies_is_refused(mloc_here):
    maml = SMALL.parents[2] / "programs" / "maml.mlo"
    ran = mloc_here("plan", maml, *FSDP, "--set", "meta->adapt.hypergrad=auto")
    assert ran.returncode == 1
    assert ("`auto` (itd: the upper enters only through `init`) on `meta -> adapt` cannot run under "
            "`strategy = fsdp`: it differentiates through the lower's unrolled optimizer steps") in ran.stderr


def test_auto_chooses_a_method_that_shards(mloc_here):
    whole = mloc_here("plan", SMALL, *AUTO)
    sharded = mloc_here("plan", SMALL, *AUTO, *FSDP)
    assert whole.returncode == 0 and sharded.returncode == 0, sharded.stderr
    edge = lambda out: next(line for line in out.splitlines() if line.startswith("weights -> net"))  # noqa: E731
    assert edge(whole.stdout).split()[3].startswith("cg")
    assert edge(sharded.stdout).split()[3].startswith("sama")
