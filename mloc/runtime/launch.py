"""Entry point of a generated `train.py`: parse its options, build the program, train.

    python train.py [--steps N] [--seed S] [--device D] [--precision P] [--dtype float64]
                    [--out DIR] [--resume DIR] [--quiet]

Under `torchrun` every process runs this; data parallelism comes from the environment
(`mloc.runtime.distributed.DistContext`). Exit codes: 0 done, 1 the run failed (NaN/Inf,
an error in the program's code), 2 a bad option or checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from mloc.runtime.checkpoint import CheckpointError
from mloc.runtime.precision import DeviceError
from mloc.runtime.engine import Program, RunConfig
from mloc.runtime.loop import Intervals, resume, train
from mloc.runtime.metrics import NonFiniteError
from mloc.runtime.progress import Progress
from mloc.runtime.user_modules import put_first


def program_dir(generated_file: str, relative: str) -> Path:
    """Put the program's directory (relative to the generated file) first on sys.path; the
    modules it has are imported from it even if another program's ran before
    (:mod:`mloc.runtime.user_modules`)."""
    return put_first(Path(generated_file).resolve().parent / relative)


def build(ns: dict, config: RunConfig) -> Program:
    """Instantiate the program a generated module (`ns`, its globals) declares."""
    return Program(name=ns["NAME"], specs=ns["PROBLEMS"], edges=ns["EDGES"], semantics=ns["SEMANTICS"],
                   build_modules=ns["build_modules"], data=ns["DATA"], schedule=ns["outer_step"],
                   config=config, evaluations=ns["EVALUATIONS"], compositions=ns.get("COMPOSITION"))


@dataclass(frozen=True)
class RunOptions:
    """What `train.py`'s command line (and `mloc run`) may set; None keeps the program's
    default (its `DEFAULTS`). `dtype` None trains in the modules' own dtype."""

    steps: int | None = None
    seed: int | None = None
    device: str | None = None
    precision: str | None = None
    dtype: str | None = None
    out: Path = Path("runs/latest")
    resume: Path | None = None
    quiet: bool = False

    def config(self, defaults: RunConfig) -> RunConfig:
        given = {k: v for k, v in (("steps", self.steps), ("seed", self.seed), ("device", self.device),
                                    ("precision", self.precision)) if v is not None}
        return replace(defaults, dtype=self.dtype, **given)

    def argv(self) -> list[str]:
        """The same options as `train.py` arguments (what a torchrun launch passes on)."""
        out = []
        for flag in ("steps", "seed", "device", "precision", "dtype"):
            if getattr(self, flag) is not None:
                out += [f"--{flag}", str(getattr(self, flag))]
        out += ["--out", str(self.out)] + (["--resume", str(self.resume)] if self.resume else [])
        return out + (["--quiet"] if self.quiet else [])


def parser(defaults: RunConfig) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train this compiled mloc program.")
    p.add_argument("--steps", type=int, help=f"outer steps (default {defaults.steps})")
    p.add_argument("--seed", type=int, help=f"random seed (default {defaults.seed})")
    p.add_argument("--device", help=f"cpu, cuda, cuda:N or auto (default {defaults.device})")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help=f"default {defaults.precision}")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None, help="parameter dtype")
    p.add_argument("--out", type=Path, default=Path("runs/latest"), help="folder for metrics.jsonl and checkpoint.pt")
    p.add_argument("--resume", type=Path, metavar="DIR", help="continue from DIR/checkpoint.pt")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def _user_error(err: Exception, when: str) -> int:
    """Report an exception raised by the program's code (exit 1); re-raise mloc's own."""
    frames = _user_frames(err)
    if not frames:
        raise err
    print(f"error[E702]: the program's code raised {type(err).__name__} during {when}: {err}", file=sys.stderr)
    for line in frames[-4:]:
        print(f"  --> {line}", file=sys.stderr)
    print("  = help: fix the code at the last location above; the checkpoint on disk (if any) is the "
          "last good state", file=sys.stderr)
    return 1


def main(ns: dict, argv: list[str] | None = None) -> int:
    """`python train.py [options]`: parse the options, then `run`."""
    options = RunOptions(**vars(parser(ns["DEFAULTS"]).parse_args(argv)))
    if options.steps is not None and options.steps < 1:
        print("error: --steps must be at least 1", file=sys.stderr)
        return 2
    return run(ns, options.config(ns["DEFAULTS"]), options.out, options.resume, quiet=options.quiet)


def _user_frames(err: BaseException) -> list[str]:
    """`file:line in function` for the frames of the traceback that are the user's code
    (not mloc's runtime, not torch, not the standard library)."""
    import traceback

    mloc_dir = str(Path(__file__).resolve().parents[1])
    frames = []
    for f in traceback.extract_tb(err.__traceback__):
        path = str(Path(f.filename).resolve()) if f.filename and not f.filename.startswith("<") else ""
        if not path or path.startswith(mloc_dir) or "site-packages" in path or "/lib/python3" in path:
            continue
        frames.append(f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}")
    return frames


def run(ns: dict, config: RunConfig, out: Path, resume_dir: Path | None = None, quiet: bool = False) -> int:
    """Build the program a generated module declares, train it for `config.steps` outer
    steps (from `resume_dir`'s checkpoint if given), writing to `out`.
    Exit codes: 0 done, 1 the run failed, 2 a bad checkpoint."""
    try:
        program = build(ns, config)
    except DeviceError as e:
        print(f"error: {e}\n  = help: {e.help}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - user code raising while the program is built
        return _user_error(err, "building the program")
    try:
        if resume_dir:
            resume(program, Path(resume_dir))
        intervals = Intervals(**ns["INTERVALS"])
        start, t0 = program.step_count, time.perf_counter()
        with Progress(ns["NAME"], config.steps, enabled=not quiet and program.dist.is_main) as progress:
            train(program, config.steps, out, intervals, progress)
            seconds = time.perf_counter() - t0
            progress.note(f"done: {config.steps - start} steps in {seconds:.1f} s; wrote "
                          f"{out / 'checkpoint.pt'} and {out / 'metrics.jsonl'}")
    except CheckpointError as e:
        print(f"error: {e}\n  = help: {e.help}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"error: {e}\n  = help: the last good checkpoint is {out / 'checkpoint.pt'} (if one was "
              "written); lower the learning rate, clip gradients or check the data", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - the program's own code raising during training
        return _user_error(err, f"step {program.step_count + 1}")
    finally:
        program.close()
    return 0
