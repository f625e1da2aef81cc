"""``dropmask audit EXAMPLE``: audits a bundled example's model and train step."""

from __future__ import annotations

import argparse
import sys

from ._target import audit_target, load_target

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``EXAMPLE`` and ``--json`` to ``parser``."""
    parser.add_argument(
        "example",
        metavar="EXAMPLE",
        help="a bundled example (e.g. digits), a dotted hook module, or a hook .py file",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Prints the report; returns 0 when it is clean and 1 when there are findings."""
    report = audit_target(load_target(args.example))
    print(report.to_json() if args.json else str(report), file=sys.stdout)
    return 0 if report.ok else 1
