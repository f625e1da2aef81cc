"""``dropmask audit TARGET``: audits an example's model and train step."""

from __future__ import annotations

import argparse
import sys

from .._errors import DropmaskError
from .._workflow import add_target_arguments

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``TARGET``, ``--list`` and ``--json`` to ``parser``."""
    add_target_arguments(parser, "target")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Prints the report; 0 when it is clean, 1 with findings or when the example's own
    code raised (its traceback, then one line), 2 for a bad target."""
    from .._workflow import ExampleCodeError, listing, report, report_exception
    from ._target import audit_target, load_target

    if args.list:
        print(listing())
        return 0
    if args.target is None:
        print("dropmask audit: error: give a TARGET, or --list to see them.", file=sys.stderr)
        return 2
    extra = getattr(args, "extra", [])
    if extra:
        print(
            f"dropmask audit: error: unrecognized arguments: {' '.join(extra)} (the audit "
            f"runs the example's tiny config as it is). See dropmask audit --help.",
            file=sys.stderr,
        )
        return 2
    try:
        target = load_target(args.target)
        if target.model is None:
            print(
                "dropmask audit: the example sets no model_inputs, so its model cannot be "
                "called alone: auditing its train step only.",
                file=sys.stderr,
            )
        result = audit_target(target)
    except ExampleCodeError as error:
        report("dropmask audit", error)
        return 1
    except DropmaskError as error:
        print(f"dropmask audit: error: {str(error).rstrip('.')}.", file=sys.stderr)
        return 2
    except Exception as error:
        report_exception("dropmask audit", error)
        return 1
    print(result.to_json() if args.json else str(result), file=sys.stdout)
    return 0 if result.ok else 1
