"""What the trace pass says about the user's values, in the user's terms.

- `raised`: an exception from the user's code, at the `.mlo` span that called it, with the
  user's own `file:line` frames as notes (as `mloc run` shows them; mloc's, torch's and the
  standard library's frames are left out);
- `check_data`: what a `data` call returned, before a batch is drawn from it. `data` is an
  iterable of batches (a `DataLoader`, a list of batches, a generator). A number, a string,
  a numpy array or a tuple of tensors (one batch's fields, not batches) is an
  error (E709) at the `data` field, naming the expected type; a map-style `Dataset` yields
  single examples, and a lone tensor its rows, not batches: a warning (W104);
- `init_mismatch`: which parameters of two modules joined by `init` differ, by name and by
  shape (E705);
- `not_a_loss`: E703's message for a loss that returned a Python number (`.item()`);
- `unused_warning`: W108's message for trainable parameters no loss reaches, with the
  `frozen` globs that declare them.

Nothing here imports torch: values are recognised by their classes' qualified names.
"""

from __future__ import annotations

from mloc.diagnostics import Diagnostic

_DATASET = "torch.utils.data.dataset.Dataset"
_ITERABLE_DATASET = "torch.utils.data.dataset.IterableDataset"
_TENSOR = "torch.Tensor"
_NDARRAY = "numpy.ndarray"
_EXPECTED = ("an iterable of batches: a `torch.utils.data.DataLoader`, a list of batches such as "
             "`[(x, y)]`, or a generator")


def raised(span, what: str, err: BaseException) -> Diagnostic:
    """E702 for `err`, raised by the user's code while mloc ran `what` (at `span`)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    frames = user_frames(err)
    help = ("fix the code at the last location below" if frames else
            "fix the Python code or its arguments; run the call in a Python shell to see the full traceback")
    return Diagnostic("E702", f"{what} raised {type(err).__name__}" + (f": {text}" if text else ""), span,
                      label="raised here", help=help, notes=tuple(f"in {f}" for f in frames[-4:]))


def no_batch(span, text: str) -> Diagnostic:
    """E702 for data that yields no batch at all (its iterator stops at once)."""
    return Diagnostic("E702", f"`{text}` yields no batch: the data is empty", span, label="no first batch",
                      help="return data with at least one batch (an empty list, a generator that yields "
                           "nothing, or a DataLoader over an empty dataset has none)")


def user_frames(err: BaseException) -> list[str]:
    """`file:line in function: code` for the user's frames of `err`'s traceback (the rule
    `mloc run` applies: `mloc.runtime.processes.launch`)."""
    from mloc.runtime.base.usercode import user_frames   # deferred: only on an error
    return user_frames(err)


def _classes(value) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(value).__mro__}


def _is(value, name: str) -> bool:
    return name in _classes(value) or (name == _TENSOR and "torch._C.TensorBase" in _classes(value))


def check_data(p, value) -> Diagnostic | None:
    """E709 or W104 for what problem `p`'s `data` call returned (None when it looks right)."""
    span, text = p.data.span, p.data.text
    got = _describe(value)
    if got is not None:
        return Diagnostic("E709", f"`data` of `{p.name}` must be {_EXPECTED.split(':')[0]}, but `{text}` "
                          f"returned {got}", span, label=f"returns {got.split(' (')[0]}",
                          help=_fix(value), notes=(f"expected {_EXPECTED}",))
    if _is(value, _TENSOR):
        return Diagnostic("W104", f"`data` of `{p.name}` is a single tensor (shape {list(value.shape)}): "
                          "iterating it yields its rows as batches", span, label="a tensor, not batches",
                          help=_fix(value))
    if _is(value, _DATASET) and not _is(value, _ITERABLE_DATASET):
        return Diagnostic("W104", f"`data` of `{p.name}` is a `Dataset`: iterating it yields single "
                          "examples, not batches", span, label="a Dataset, not a DataLoader",
                          help=f"wrap it: `torch.utils.data.DataLoader({text}, batch_size=..., shuffle=True)` "
                               "in your Python function")
    return None


def _describe(value) -> str | None:
    """What `value` is, when it cannot be an iterable of batches."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        name = type(value).__name__
        return "None" if value is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
    if _is(value, _NDARRAY):
        return f"a numpy array (shape {list(value.shape)})"
    if isinstance(value, tuple) and len(value) > 1 and all(_is(v, _TENSOR) or _is(v, _NDARRAY) for v in value):
        kind = "tensors" if all(_is(v, _TENSOR) for v in value) else "arrays"
        return f"a tuple of {len(value)} {kind} (the fields of one batch?)"
    if not hasattr(value, "__iter__") and not hasattr(value, "__getitem__"):
        return f"a `{type(value).__name__}`, which is not iterable"
    return None


def _fix(value) -> str:
    if _is(value, _NDARRAY) or (isinstance(value, tuple) and any(_is(v, _NDARRAY) for v in value)):
        return ("convert the arrays and batch them in your function: `DataLoader(TensorDataset("
                "torch.from_numpy(x), torch.from_numpy(y)), batch_size=...)`")
    if isinstance(value, tuple) or _is(value, _TENSOR):
        return ("return a list of batches, `[(x, y)]` for one full batch, or "
                "`DataLoader(TensorDataset(x, y), batch_size=...)`")
    return "return the data loader itself from the function the `data` field calls"


def check_batch(p, batch) -> Diagnostic | None:
    """E709 for a first batch holding numpy arrays (the loss would get arrays, not tensors)."""
    leaves = list(batch) if isinstance(batch, (tuple, list)) else [batch]
    if any(_is(x, _NDARRAY) for x in leaves):
        return Diagnostic("E709", f"the batches of `{p.name}` hold numpy arrays; losses receive tensors",
                          p.data.span, label="batches of arrays",
                          help="convert them in the data function (`torch.from_numpy(x)`), or use a "
                               "DataLoader, which collates arrays into tensors")
    return None


def init_mismatch(own: list[tuple[str, tuple]], base: list[tuple[str, tuple]]) -> tuple[str, str]:
    """(what differs, label) for two modules' `(name, shape)` lists that are not equal."""
    if [s for _, s in own] == [s for _, s in base]:
        pairs = [(a, b) for (a, _), (b, _) in zip(own, base) if a != b]
        listed = ", ".join(f"`{a}` vs `{b}`" for a, b in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
        return f"their parameters have the same shapes but different names: {listed}", "different names"
    first = next(((a, b) for a, b in zip(own, base) if a != b), None)
    detail = f"`{first[0][0]}` {list(first[0][1])} vs `{first[1][0]}` {list(first[1][1])}" if first \
        else f"{len(own)} vs {len(base)} parameters"
    own_d, base_d = dict(own), dict(base)
    only_own, only_base = [n for n in own_d if n not in base_d], [n for n in base_d if n not in own_d]
    reshaped = [n for n in own_d if n in base_d and own_d[n] != base_d[n]]
    for what, names in (("different shapes", reshaped), ("only here", only_own), ("only there", only_base)):
        if names:
            detail += f"; {what}: " + ", ".join(f"`{n}`" for n in names[:3]) + (" ..." if len(names) > 3 else "")
    return f"their parameters differ ({detail})", "different shapes"


def not_a_loss(p, probe) -> Diagnostic:
    """E703 for a loss whose value is not a floating-point scalar tensor."""
    returned = getattr(probe, "returned", "Tensor")
    if returned in {"float", "int", "bool"}:
        return Diagnostic("E703", f"the loss of `{p.name}` returns a Python {returned}, not a tensor: it was "
                          "detached from the autograd graph (`.item()`, `float(...)`)", p.loss.span,
                          label=f"a Python {returned}",
                          help="return the loss tensor itself (drop `.item()`); to log a number, "
                               "use an evaluation")
    if returned != "Tensor":
        return Diagnostic("E703", f"the loss of `{p.name}` returns a `{returned}`, not a tensor", p.loss.span,
                          help="return a 0-dim floating-point tensor, e.g. `F.cross_entropy(out, y)`")
    what = f"shape {list(probe.shape)}" if probe.shape else "a tensor that is not floating-point"
    return Diagnostic("E703", f"the loss of `{p.name}` returns {what}, not a scalar", p.loss.span,
                      help="reduce it, e.g. with `.mean()` or `.sum()`" if probe.shape else
                           "compute it in floating point (an integer or boolean tensor has no gradient)")


def unused_warning(p, unused: list[str], names: list[str]) -> Diagnostic:
    """W108 at `p`'s module for its trainable parameters `unused` (of all its parameter
    `names`, in order): the `frozen` globs are the shortest module prefixes all of whose
    parameters are unused (`norm.*`), else the names themselves."""
    dead = set(unused)
    globs: list[str] = []
    for n in unused:
        parts = n.split(".")
        glob = n
        for k in range(1, len(parts)):
            prefix = ".".join(parts[:k]) + "."
            if all(m in dead for m in names if m.startswith(prefix)):
                glob = prefix + "*"
                break
        if glob not in globs:
            globs.append(glob)
    shown = ", ".join(f"`{n}`" for n in unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
    count = f"{len(unused)} parameter{'s' * (len(unused) != 1)}"
    frozen = "frozen = [" + ", ".join(f'"{g}"' for g in globs) + "]"
    return Diagnostic(
        "W108", f"{count} of `{p.name}` reach no loss its gradient comes from: {shown}", p.module.span,
        label="never used by the loss",
        help=f"they get a zero gradient and the optimizer leaves them as they are (as a hand loop leaves a "
             f"`.grad` of None); if that is intended, say so with `{frozen}` in `{p.name}`, else call them "
             "in the loss (a layer defined but not called in `forward`?)")
