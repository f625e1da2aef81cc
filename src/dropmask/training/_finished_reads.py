"""A failed restore returns only once every read it started has finished.

Orbax runs a restore's reads as tasks on an event loop it makes with
``asyncio.new_event_loop()``, and closes that loop as soon as the restore's coroutine
ends. When one read fails (a truncated file), the coroutine ends at once while the
other reads are still in flight: the loop is closed under them, TensorStore later hands
their results to a closed loop, and their tasks are finalized whenever the garbage
collector gets to them, often at exit, each printing tracebacks to stderr
("Exception ignored in: <coroutine object _read_array_index_and_device_put ...>") long
after the damaged checkpoint was reported in one line.

:func:`reads_finish_before_loops_close` makes every loop made while it is active wait
for its pending tasks before it closes, as ``asyncio.run`` does before it closes its
own. The reads are waited for rather than cancelled: a cancelled task stops waiting, but
its TensorStore read goes on and would still report to the closed loop. Loops are made
through the event loop policy, the one hook asyncio gives for it; a Python without
policies (3.16) or a restore run from a running loop (orbax then makes a uvloop loop
itself) reads as before, with the same result and the same risk of a late traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["reads_finish_before_loops_close"]

_lock = threading.Lock()
_active = 0
_changed: Any = None  # the policy whose new_event_loop is replaced, while one is


def _policy() -> Any:
    """The event loop policy, or None on a Python without them."""
    # 3.14 deprecates the public getter (it warns); its private twin is the same object.
    getter = getattr(asyncio.events, "_get_event_loop_policy", None) or getattr(
        asyncio, "get_event_loop_policy", None
    )
    return getter() if getter is not None else None


def _finish_pending_then_close(loop: asyncio.AbstractEventLoop, close: Any) -> None:
    """Runs ``loop`` until every task on it is done (each outcome kept by the gather, so
    that none is reported as never retrieved), then closes it."""
    if not loop.is_closed() and not loop.is_running():
        pending = asyncio.all_tasks(loop)
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    close()


def _waiting_loop_factory(new_event_loop: Any) -> Any:
    def new_waiting_loop() -> asyncio.AbstractEventLoop:
        loop = new_event_loop()
        close = loop.close
        loop.close = lambda: _finish_pending_then_close(loop, close)  # type: ignore[method-assign]
        return loop

    return new_waiting_loop


@contextlib.contextmanager
def reads_finish_before_loops_close() -> Iterator[None]:
    """While active, an event loop made by ``asyncio.new_event_loop()`` (in any thread)
    finishes its pending tasks when it is closed, before closing.

    Re-entrant and safe across threads: the first to enter changes the policy's
    ``new_event_loop``, the last to leave puts the policy's own back.
    """
    global _active, _changed
    with _lock:
        if _active == 0:
            policy = _policy()
            if policy is not None:
                policy.new_event_loop = _waiting_loop_factory(policy.new_event_loop)
            _changed = policy
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _changed is not None:
                # Removes the instance's attribute: the class's method shows through.
                del _changed.new_event_loop
                _changed = None
