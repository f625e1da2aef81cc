"""What ``dropmask train`` and ``dropmask audit`` share: the example, its keys, its lookup.

The workflow's common base, which :mod:`dropmask.training` and :mod:`dropmask.audit`
both import by the names below and neither owns: an application described once as an
:class:`Example` (with the config entries every run starts from and the keys every
run splits), found one way from a command's ``TARGET`` (:func:`locate`), and its
code checked one way where a command runs it (:func:`checked`). The loop's config
entries are one table (``_entries.py``), from which :func:`base_config` and every
list of entries derive. ``Example``,
``base_config`` and ``run_keys`` are public as ``dropmask.training``'s.
"""

from ._entries import PER_RUN_ENTRIES as PER_RUN_ENTRIES
from ._entries import RUN_LENGTH_ENTRIES as RUN_LENGTH_ENTRIES
from ._entries import SCHEDULE_ENTRIES as SCHEDULE_ENTRIES
from ._example import Example as Example
from ._example import base_config as base_config
from ._example import run_keys as run_keys
from ._locate import Located as Located
from ._locate import add_target_arguments as add_target_arguments
from ._locate import available as available
from ._locate import is_library as is_library
from ._locate import listing as listing
from ._locate import load_example as load_example
from ._locate import locate as locate
from ._user_code import ExampleCodeError as ExampleCodeError
from ._user_code import checked as checked
from ._user_code import load_checked as load_checked
from ._user_code import report as report
from ._user_code import report_exception as report_exception

__all__ = [
    "PER_RUN_ENTRIES",
    "RUN_LENGTH_ENTRIES",
    "SCHEDULE_ENTRIES",
    "Example",
    "ExampleCodeError",
    "Located",
    "add_target_arguments",
    "available",
    "base_config",
    "checked",
    "is_library",
    "listing",
    "load_checked",
    "load_example",
    "locate",
    "report",
    "report_exception",
    "run_keys",
]
