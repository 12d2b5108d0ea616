"""Errors raised by the program's own code: which frames of a traceback are the user's
(not mloc's, not torch's or the standard library's), and the E702 report that points at
them (exit 1). `mloc run`, `python train.py`, `--pipeline` workers, `mloc hypergrad` and
the trace pass all report through here, so an error reads the same wherever it is met.
So does one of mloc's own warnings that Python's warning filter made an error
(``warnings.simplefilter("error", MlocWarning)`` in code, or ``-W "error:the data of"`` /
``PYTHONWARNINGS`` by the message's start): the run stops there, exit 1, saying the warning
as the error it was made."""

from __future__ import annotations

import sys
from pathlib import Path

from mloc.shared.warning import MlocWarning


def user_error(err: Exception, when: str, dtype: str | None = None, device=None,
                after: str = "the checkpoint on disk (if any) is the last good state") -> int:
    """Report an exception raised by the program's code (exit 1); re-raise mloc's own. In a
    ``--dtype`` run a dtype mismatch gets a note, and on a device other than the CPU a device
    mismatch: mloc casts and moves what it passes to the code (the modules, the batches, an
    evaluation's data arguments), not what a function makes or loads in its own body."""
    if isinstance(err, MlocWarning):
        print(f"error: {err} (during {when})\n  = note: one of mloc's warnings, made an error by Python's warning "
              f"filter (-W error or PYTHONWARNINGS)\n  = help: {after}", file=sys.stderr)
        return 1
    frames = getattr(err, "frames", None) or user_frames(err)   # EvaluationError: located
    if not frames:
        raise err
    print(f"error[E702]: the program's code raised {type(err).__name__} during {when}: {err}", file=sys.stderr)
    for line in frames[-4:]:
        print(f"  --> {line}", file=sys.stderr)
    for note in mismatch_notes(str(err), dtype, device):
        print(f"  = note: {note}", file=sys.stderr)
    print(f"  = help: fix the code at the last location above; {after}", file=sys.stderr)
    return 1


def mismatch_notes(message: str, dtype: str | None, device) -> list[str]:
    """What mloc casts and moves for the code, when ``message`` is a dtype mismatch in a
    ``--dtype`` run or a device mismatch off the CPU: not what a function makes or loads in
    its own body."""
    notes = []
    if dtype and any(s in message for s in ("same dtype", "scalar type", "Float and Double", "Double and Float")):
        notes.append(f"`--dtype {dtype}` casts the modules, the batches and an evaluation's data arguments "
                     "that mloc passes to the code; a tensor a function makes or loads in its own body keeps "
                     "its dtype: cast it to the module's there, or run without `--dtype`")
    if device is not None and str(device) != "cpu" and "same device" in message:
        notes.append(f"mloc moves the modules, the batches and an evaluation's data arguments it passes to the "
                     f"code to {device}; a tensor a function makes or loads in its own body stays where it was "
                     "made: move it there (`x.to(next(model.parameters()).device)`), or run with `--device cpu`")
    return notes


def user_frames(err: BaseException) -> list[str]:
    """`file:line in function` for the frames of the traceback that are the user's code
    (not mloc's runtime, not torch, not the standard library)."""
    import traceback

    return user_lines(traceback.extract_tb(err.__traceback__))


def user_lines(summaries) -> list[str]:
    """`file:line in function: code` for the user's frames among ``summaries`` (a
    ``traceback.StackSummary``: an exception's traceback, or ``traceback.extract_stack()``
    where mloc's code was called from the user's)."""
    mloc_dir = str(Path(__file__).resolve().parents[2])
    frames = []
    for f in summaries:
        path = str(Path(f.filename).resolve()) if f.filename and not f.filename.startswith("<") else ""
        if not path or path.startswith(mloc_dir) or "site-packages" in path or "/lib/python3" in path:
            continue
        frames.append(f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}")
    return frames
