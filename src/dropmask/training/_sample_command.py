"""``dropmask sample TARGET``: a trained run's model continues a prompt.

The target names a :class:`dropmask.training.Example` whose ``sample`` hook generates
(the lm example's does); the run's latest checkpoint (or ``--step``) is restored with
:func:`~dropmask.training.restore_run`, so the text comes from exactly the model the
run saved. Every argument is checked before anything is restored.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

from .._errors import DropmaskError, DropmaskValueError, user_error
from .._workflow import add_target_arguments

__all__ = ["add_arguments", "run"]

_COMMAND = "dropmask sample"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``dropmask sample``'s flags to ``parser``."""
    add_target_arguments(parser, "example")
    parser.add_argument("--workdir", help="the run's directory, as trained (runs/NAME)")
    parser.add_argument("--prompt", help="the text to continue (UTF-8, at least one character)")
    parser.add_argument("--length", type=int, default=300, help="tokens to add (300)")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0: greedy; else softmax(logits / T) (0)"
    )
    parser.add_argument(
        "--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="the sampling key's seed: one seed, one text (0)"
    )
    parser.add_argument("--step", type=int, help="the checkpoint to restore (the latest)")


def _check(args: argparse.Namespace) -> None:
    """Raises on any argument that cannot be served, before anything is loaded."""
    if args.example is None:
        raise user_error(
            DropmaskValueError,
            "give a TARGET whose run to sample, or --list to see them",
            caller=None,
        )
    if args.extra:
        raise user_error(
            DropmaskValueError,
            f"unrecognized arguments: {' '.join(args.extra)}",
            f"See {_COMMAND} --help.",
            caller=None,
        )
    if args.prompt is None or not args.prompt:
        raise user_error(
            DropmaskValueError,
            "--prompt must be at least one character, got none",
            "Pass e.g. --prompt 'The '.",
            caller=None,
        )
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = args.prompt[error.start : error.end].encode("utf-8", "surrogateescape")
        raise user_error(
            DropmaskValueError,
            f"--prompt must be UTF-8 text, got the byte(s) {bad!r} at position {error.start}",
            "Pass the prompt in UTF-8 (e.g. iconv -t utf-8).",
            caller=None,
        ) from None
    if args.length < 1:
        raise user_error(
            DropmaskValueError,
            f"--length must be >= 1 (tokens to add), got {args.length}",
            caller=None,
        )
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise user_error(
            DropmaskValueError,
            f"--temperature must be a finite number >= 0 (0: greedy), got {args.temperature}",
            caller=None,
        )
    if args.top_k < 0:
        raise user_error(
            DropmaskValueError,
            f"--top-k must be >= 0 (0: every token), got {args.top_k}",
            caller=None,
        )
    if args.top_k and args.temperature == 0:
        raise user_error(
            DropmaskValueError,
            f"--top-k {args.top_k} needs --temperature > 0 (at 0 the most likely token is "
            "taken anyway)",
            "Pass e.g. --temperature 0.8, or leave --top-k out.",
            caller=None,
        )
    if args.step is not None and args.step < 0:
        raise user_error(
            DropmaskValueError,
            f"--step must be >= 0 (a saved train step), got {args.step}",
            caller=None,
        )
    if args.workdir is not None:
        _check_workdir(args, pathlib.Path(args.workdir))


def _check_workdir(args: argparse.Namespace, workdir: pathlib.Path) -> None:
    if not (workdir / "checkpoints").is_dir():
        raise user_error(
            DropmaskValueError,
            f"{workdir} holds no checkpoints/: no run was trained there",
            f"Train first (dropmask train {args.example} --workdir {workdir}), or pass the "
            "run's --workdir (for --compare-rates, one of its rate_R/seed_S).",
            caller=None,
        )


def _sample(args: argparse.Namespace) -> str:
    import jax

    from .._workflow import load_checked
    from ._restore import restore_run

    example = load_checked(args.example)
    if example.sample is None:
        raise user_error(
            DropmaskValueError,
            f"the example {example.name!r} does not generate text: its Example sets no sample=",
            "Sample an example that does (e.g. lm), or add a sample hook.",
            caller=None,
        )
    # runs/NAME, as dropmask train names it: the example's name, whatever the target's form.
    workdir = pathlib.Path(args.workdir or pathlib.Path("runs", example.name))
    _check_workdir(args, workdir)
    state, config, _ = restore_run(workdir, example, step=args.step)
    key = jax.random.key(args.seed)
    return example.sample(
        state, config, args.prompt, args.length, args.temperature, args.top_k, key
    )


def run(args: argparse.Namespace) -> int:
    """Runs ``dropmask sample``; returns the exit status (docs/cli.md).

    A user's mistake exits with 2 and one line saying why: a bad flag, an unknown
    example or one that does not generate, a workdir without checkpoints or of another
    example's run, a ``--step`` that was never saved. A checkpoint that cannot be read
    back exits with 1 and one line.
    """
    from .._workflow import ExampleCodeError, report, report_exception
    from ._errors import exit_status

    if args.list:
        from .._workflow import listing

        print(listing())
        return 0
    try:
        _check(args)
    except DropmaskError as error:
        return _fail(error, 2)
    try:
        text = _sample(args)
    except ExampleCodeError as error:
        report(_COMMAND, error)
        return 1
    except DropmaskError as error:
        return _fail(error, exit_status(error))
    except OSError as error:
        where = f" {error.filename}" if error.filename else ""
        return _fail(f"cannot use{where}: {error.strerror or error}", 1)
    except Exception as error:
        report_exception(_COMMAND, error)
        return 1
    print(text)
    return 0


def _fail(error: DropmaskError | str, status: int) -> int:
    text = str(error).removeprefix("restore_run: ").rstrip(".")
    print(f"{_COMMAND}: error: {text}.", file=sys.stderr)
    return status
