"""The ``dropmask`` command: a table of subcommands, each a thin layer over the library.

Each subcommand lives in a module that exposes
``add_arguments(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``; the module is imported only when its
subcommand runs, so ``dropmask --help`` stays fast and one subcommand's
dependencies never burden another.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["COMMANDS", "OneLineParser", "main"]

# name -> (module path, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "dropmask.training._command",
        "train an example with checkpoints, logs, plots and dropout-rate comparisons",
    ),
    "sample": (
        "dropmask.training._sample_command",
        "continue a prompt with a trained run's model (greedy, temperature, top-k)",
    ),
    "audit": (
        "dropmask.audit._command",
        "find dropout bugs in an example's model and train step",
    ),
    "why": (
        "dropmask.why._command",
        "measure, on this machine, why dropout ends in lax.select",
    ),
}


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line naming the fix.

    The examples' own ``python -m`` entry points parse with it too, so that every
    command of the package and its examples answers a mistake the same way.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}. See {self.prog} --help.\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``dropmask COMMAND ...``; returns the exit status.

    Args:
      argv: the arguments after ``dropmask`` (``sys.argv[1:]`` by default).

    Returns:
      0 on success; 2 for a user's mistake (a flag, the target, a config, a workdir);
      1 when the work failed once started, or found what it looks for (audit
      findings, a why verdict that differs); 130 on Ctrl-C. docs/cli.md states each.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineParser(
        prog="dropmask", description="Fast, correct dropout and masking for JAX and Flax."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, (path, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        if name == chosen:
            module = importlib.import_module(path)
            module.add_arguments(sub)
    args, extra = parser.parse_known_args(argv)
    if args.command is None or module is None:
        parser.error(f"choose a command: {', '.join(COMMANDS)}")
    args.extra = extra
    return int(module.run(args))


if __name__ == "__main__":
    sys.exit(main())
