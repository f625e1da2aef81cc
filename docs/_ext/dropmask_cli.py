"""The ``dropmask`` command's parser with every subcommand's flags, for sphinx-argparse.

``dropmask.cli.main`` adds only the chosen subcommand's flags (each is imported when it
runs); the reference needs them all, built by the same ``add_arguments`` functions.
"""

from __future__ import annotations

import argparse
import importlib

from dropmask import cli


def parser() -> argparse.ArgumentParser:
    """``dropmask``'s parser, every subcommand of ``cli.COMMANDS`` with its flags."""
    top = cli.OneLineParser(
        prog="dropmask", description="Fast, correct dropout and masking for JAX and Flax."
    )
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    for name, (path, summary) in cli.COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        importlib.import_module(path).add_arguments(sub)
    return top
