"""``dropmask why``: prints each claim about dropout's last line with its verdict."""

from __future__ import annotations

import argparse
import sys

from ._check import check_claims

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--json``, ``--no-timing``, ``--size`` and ``--repeats``."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-timing", action="store_true", help="skip the speed claims")
    parser.add_argument("--size", type=int, default=1 << 20, help="elements per timed array")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per contestant")


def run(args: argparse.Namespace) -> int:
    """Prints the report; 1 when a verdict differs from the documented one, else 0; 2
    for bad flags (or arguments it does not take), in one line."""
    extra = getattr(args, "extra", [])
    if extra:
        print(f"dropmask why: error: unrecognized arguments: {' '.join(extra)}. See "
              f"dropmask why --help.", file=sys.stderr)  # fmt: skip
        return 2
    if args.size < 1 or args.repeats < 1:
        print(f"dropmask why: error: --size and --repeats must be >= 1, got {args.size} and "
              f"{args.repeats}. Leave them out for 2**20 and 15.", file=sys.stderr)  # fmt: skip
        return 2
    report = check_claims(timing=not args.no_timing, size=args.size, repeats=args.repeats)
    print(report.to_json() if args.json else str(report))
    return 1 if report.differences() else 0
