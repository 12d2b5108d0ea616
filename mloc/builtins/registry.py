"""The registries of built-ins: mloc's own descriptors and those other packages declare.

A package adds optimizers, hypergradient methods or schedules without editing mloc, the
way pytest and setuptools take plugins: an entry point in the group `mloc.builtins` names a
torch-free object, a `Descriptor` or a sequence of them (its `pyproject.toml`:
`[project.entry-points."mloc.builtins"] mypkg = "mypkg.builtins:DESCRIPTORS"`). Each goes to
the registry of its capabilities' kind (`OptimizerCaps`, `MethodCaps`, `ScheduleCaps`);
its `runtime` (`"module:attr"`) is imported only when a program runs. Entry points are read
once, at the first look-up in any registry, so importing mloc stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache

from mloc.builtins.descriptor import Descriptor

GROUP = "mloc.builtins"


class PluginError(RuntimeError):
    """An entry point of `mloc.builtins` that cannot be loaded or declares no descriptors."""


@lru_cache(maxsize=1)
def discovered() -> tuple[Descriptor, ...]:
    """Every descriptor the installed packages declare (entry points of `GROUP`)."""
    from importlib.metadata import entry_points

    out: list[Descriptor] = []
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
        except Exception as err:  # noqa: BLE001 - the plugin's own failure, named
            raise PluginError(f"the {GROUP} entry point `{ep.name}` ({ep.value}) cannot be loaded: "
                              f"{type(err).__name__}: {err}") from err
        found = (obj,) if isinstance(obj, Descriptor) else tuple(obj)
        if not found or not all(isinstance(d, Descriptor) for d in found):
            raise PluginError(f"the {GROUP} entry point `{ep.name}` ({ep.value}) is not a Descriptor "
                              "or a sequence of them")
        out += found
    return tuple(out)


class Registry(Mapping[str, Descriptor]):
    """Name -> descriptor for one kind of built-in (`caps`: its capabilities' class): the
    descriptors given, then those discovered (`discovered`), read at the first look-up.
    A name or alias given twice is an error."""

    def __init__(self, caps: type, *descriptors: Descriptor):
        self.caps, self.own, self._table = caps, descriptors, None

    def _load(self) -> dict[str, Descriptor]:
        if self._table is None:
            found = tuple(d for d in discovered() if isinstance(d.caps, self.caps))
            self._table = _table(self.own + found)
        return self._table

    def __getitem__(self, name: str) -> Descriptor:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __repr__(self) -> str:
        return f"Registry({self.caps.__name__}: {', '.join(self._load())})"


def _table(descriptors: tuple[Descriptor, ...]) -> dict[str, Descriptor]:
    table: dict[str, Descriptor] = {}
    for d in descriptors:
        if d.name in table:
            raise PluginError(f"two built-ins are named `{d.name}` (runtimes {table[d.name].runtime} "
                              f"and {d.runtime})")
        table[d.name] = d
    aliases = [a.name for d in descriptors for a in d.aliases]
    clash = {a for a in aliases if aliases.count(a) > 1} | (set(aliases) & set(table))
    if clash:
        raise PluginError(f"built-in aliases given twice or naming a built-in: {sorted(clash)}")
    return table
