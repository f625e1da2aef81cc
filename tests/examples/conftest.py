"""Makes the repository's ``examples`` package importable however pytest is started.

``python -m pytest`` puts the working directory on ``sys.path``; a bare ``pytest``
does not, and ``import examples`` would then fail at collection.
"""

import pathlib
import sys

_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
