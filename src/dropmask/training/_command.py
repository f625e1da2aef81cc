"""``dropmask train TARGET``: flags to a config, then :func:`train` or :func:`compare_rates`.

The target names a :class:`dropmask.training.Example`: a bundled example, a
directory whose ``train.py`` defines ``example``, a ``.py`` file, or
``package.module:attribute`` (found by :func:`dropmask._workflow.locate`, as ``dropmask
audit`` finds it).
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
from typing import Any

from .._errors import DropmaskError, DropmaskValueError, user_error
from .._workflow import add_target_arguments

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``dropmask train``'s flags to ``parser``."""
    add_target_arguments(parser, "example")
    parser.add_argument(
        "--workdir", help="directory for metrics, events, plots, checkpoints (runs/NAME)"
    )
    parser.add_argument(
        "--config",
        metavar="NAME",
        help="start from the example's named config NAME, not its default (e.g. lm's long)",
    )
    parser.add_argument("--steps", type=int, help="train steps in total (config.steps)")
    parser.add_argument("--rate", type=float, help="dropout rate (config.rate)")
    parser.add_argument("--seed", type=int, help="root seed of all randomness (config.seed)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the workdir's latest checkpoint"
    )
    parser.add_argument(
        "--devices", type=int, help="local devices per process to shard each batch over (all)"
    )
    parser.add_argument(
        "--compare-rates",
        metavar="R1,R2,...",
        help="train each dropout rate (same data) and compare the generalization gap",
    )
    parser.add_argument(
        "--num-seeds",
        type=int,
        help="with --compare-rates: seeds SEED..SEED+N-1 per rate, for the spread (1)",
    )
    parser.add_argument(
        "--mc-samples",
        type=int,
        metavar="K",
        help="also evaluate with K dropout samples: accuracy, NLL, ECE of both "
        "(config.mc_samples; 0)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--coordinator-address",
        help="multi-process: HOST:PORT of process 0 (or JAX_COORDINATOR_ADDRESS)",
    )
    parser.add_argument(
        "--num-processes", type=int, help="multi-process: process count (or JAX_NUM_PROCESSES)"
    )
    parser.add_argument(
        "--process-id", type=int, help="multi-process: this process's id (or JAX_PROCESS_ID)"
    )
    parser.epilog = (
        "Any config entry can be set with --config.NAME=VALUE, e.g. --config.hidden=(64,) "
        "--config.learning_rate=0.01."
    )


def _rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        rates = []
    if not rates:
        raise user_error(
            DropmaskValueError,
            f"--compare-rates takes comma-separated rates such as 0,0.3,0.6, got {text!r}",
            caller=None,
        )
    return rates


def run(args: argparse.Namespace) -> int:
    """Runs ``dropmask train``; returns the exit status (docs/cli.md).

    A user's mistake exits with 2 and one line saying why: a bad flag, an unknown
    example, config name or entry, a config value the loop or the example refuses, a
    mistake in the example (a hook returning the wrong type), a data path, workdir or
    checkpoint that does not fit the run. A run that fails once started (a non-finite
    loss, a checkpoint that cannot be saved or read back, a path it cannot write)
    exits with 1 and one line. An exception raised in the example's own code exits
    with 1: its traceback, then one line naming the hook and the line of the user's
    code. Ctrl-C exits with 130 and one line naming the last saved checkpoint and the
    command that resumes from it. Any other exception prints its traceback, then one
    line: raised in the user's code, where; else a bug in dropmask, to report.
    """
    from .._workflow import ExampleCodeError, report, report_exception
    from ._errors import exit_status

    if args.list:
        from .._workflow import listing

        print(listing())
        return 0
    try:
        example, config, rates = _parse(args)
    except ExampleCodeError as error:
        report("dropmask train", error)
        return 1
    except DropmaskError as error:
        return _fail(error, 2)
    try:
        return _execute(args, example, config, rates)
    except ExampleCodeError as error:
        report("dropmask train", error)
        return 1
    except DropmaskError as error:
        return _fail(error, exit_status(error))
    except OSError as error:
        # A path the run writes or reads failed under it (disk full, permissions).
        where = f" {error.filename}" if error.filename else ""
        return _fail(f"cannot use{where}: {error.strerror or error}", 1)
    except KeyboardInterrupt:
        print(f"dropmask train: interrupted. {_resume_note(args, rates)}", file=sys.stderr)
        return 130
    except Exception as error:
        report_exception("dropmask train", error)
        return 1


def _fail(error: DropmaskError | str, status: int) -> int:
    # The library's messages name their function ("train: ..."); the command has
    # already said it is dropmask train.
    text = str(error).removeprefix("train: ").rstrip(".")
    print(f"dropmask train: error: {text}.", file=sys.stderr)
    return status


def _workdir(args: argparse.Namespace) -> pathlib.Path:
    # runs/NAME: the example's name, whatever form the target took (a path, a module).
    name = getattr(args, "example_name", None) or args.example
    return pathlib.Path(args.workdir or pathlib.Path("runs", name))


def _resume_note(args: argparse.Namespace, rates: list[float] | None) -> str:
    """The last saved step(s) and the exact command that resumes from them."""
    from ._loop import checkpoint_steps

    workdir = _workdir(args)
    if rates is None:
        runs = {"": checkpoint_steps(workdir)}
    else:
        runs = {
            f"{path.parent.name}/{path.name}: ": checkpoint_steps(path)
            for path in sorted(workdir.glob("rate_*/seed_*"))
        }
    saved = [f"{name}step {steps[-1]}" for name, steps in runs.items() if steps]
    if not saved:
        return f"No checkpoint was saved in {workdir}; run the same command again to start over."
    command = ["dropmask", "train", args.example, f"--workdir={workdir}"]
    names = ("config", "steps", "rate", "seed", "devices", "compare_rates", "num_seeds")
    for name in (*names, "mc_samples"):
        value = getattr(args, name)
        if value is not None:
            command.append(f"--{name.replace('_', '-')}={value}")
    command += ["--no-progress"] if args.no_progress else []
    command += [*getattr(args, "extra", []), "--resume"]
    return (
        f"The last saved checkpoint is {', '.join(saved)} in {workdir}. Resume with: "
        f"{shlex.join(command)}"
    )


def _checked_flags(args: argparse.Namespace) -> list[float] | None:
    """The rates to compare, after every check of the flags alone (before any loading)."""
    for flag in ("steps", "devices", "num_seeds"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise user_error(
                DropmaskValueError,
                f"--{flag.replace('_', '-')} must be >= 1, got {value}",
                caller=None,
            )
    if args.mc_samples is not None and args.mc_samples < 0:
        raise user_error(
            DropmaskValueError,
            f"--mc-samples must be >= 0 (0: no Monte Carlo evaluation), got {args.mc_samples}",
            caller=None,
        )
    if args.workdir is not None and not args.workdir.strip():
        raise user_error(
            DropmaskValueError,
            "--workdir must be a directory path, got ''",
            "Pass e.g. --workdir=runs/NAME, or leave it out for runs/EXAMPLE.",
            caller=None,
        )
    rates = _rates(args.compare_rates) if args.compare_rates is not None else None
    for rate in ([] if args.rate is None else [args.rate]) + (rates or []):
        # Checked here, before any data is loaded; rate 1 would drop every unit.
        if not 0.0 <= rate < 1.0:
            flag = "--rate" if rates is None else "--compare-rates"
            raise user_error(
                DropmaskValueError,
                f"{flag} takes dropout rates in [0, 1) (the probability of dropping), got "
                f"{rate!r}; to keep a fraction p of the units, pass 1 - p",
                caller=None,
            )
    if args.rate is not None and rates is not None:
        raise user_error(
            DropmaskValueError,
            "give --rate or --compare-rates, not both",
            caller=None,
        )
    if args.num_seeds is not None and rates is None:
        raise user_error(
            DropmaskValueError,
            "--num-seeds applies to --compare-rates; for one run pick the seed with --seed",
            caller=None,
        )
    if args.example is None:
        raise user_error(
            DropmaskValueError,
            "give a TARGET to train, or --list to see them",
            caller=None,
        )
    return rates


def _parse(args: argparse.Namespace) -> tuple[Any, Any, list[float] | None]:
    """The example, its config with every flag applied, and the rates to compare."""
    from . import _config

    overrides = _config.parse_overrides(getattr(args, "extra", []))
    rates = _checked_flags(args)
    from .._workflow import load_checked

    example = load_checked(args.example)
    args.example_name = example.name
    config = _config.apply_overrides(_start_config(example, args.config), overrides)
    if args.steps is not None:
        config.steps = int(args.steps)
    if args.rate is not None:
        config.rate = float(args.rate)
    if args.seed is not None:
        config.seed = int(args.seed)
    if args.mc_samples is not None:
        with config.unlocked():
            config.mc_samples = int(args.mc_samples)
    from ._uncertainty import check

    check(example, config)
    return example, config, rates


def _start_config(example: Any, name: str | None) -> Any:
    """The default config, or the example's config ``name`` (same entries as the default)."""
    if name is None:
        return example.get_config()
    if name not in example.configs:
        known = ", ".join(sorted(example.configs)) or "none besides the default"
        raise user_error(
            DropmaskValueError,
            f"--config must name one of {example.name}'s configs ({known}), got {name!r}",
            "Leave --config out for the default.",
            caller=None,
        )
    config = example.configs[name]()
    default = example.get_config()
    if set(config) != set(default):
        raise user_error(
            DropmaskValueError,
            f"{example.name}'s config {name!r} must have the default's entries; it differs in "
            f"{sorted(set(config) ^ set(default))}",
            "Build it from get_config() and change values.",
            caller=None,
        )
    return config


def _execute(args: argparse.Namespace, example: Any, config: Any, rates: list[float] | None) -> int:
    # Before anything touches a device: a multi-process run must join first.
    from ._parallel import initialize_distributed

    initialize_distributed(args.coordinator_address, args.num_processes, args.process_id)

    import jax

    from . import _summary
    from ._loop import compare_rates, train

    workdir = _workdir(args)
    progress = not args.no_progress
    if rates is None:
        result = train(
            example,
            config,
            workdir,
            resume=args.resume,
            devices=args.devices,
            progress=progress,
            config_name=args.config,
        )
        table = _summary.run_table(result.final)
        written = "metrics.jsonl, tensorboard/, curves.png, summary.json, checkpoints/"
        wall = result.wall_seconds
    else:
        seeds = [config.seed + i for i in range(args.num_seeds or 1)]
        summary = compare_rates(
            example,
            config,
            workdir,
            rates,
            seeds,
            resume=args.resume,
            devices=args.devices,
            progress=progress,
            config_name=args.config,
        )
        table = _summary.comparison_table(summary)
        written = "summary.json, curves.png, and rate_R/seed_S/ per run"
        wall = summary["wall_seconds"]
    if jax.process_index() == 0:
        print(table)
        print(f"{wall:.1f} s. Wrote {workdir}/: {written}")
    return 0
