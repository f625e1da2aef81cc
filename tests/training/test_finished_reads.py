"""A loop made under reads_finish_before_loops_close finishes its tasks before closing."""

import asyncio
import concurrent.futures
import threading

import pytest

from dropmask.training._finished_reads import reads_finish_before_loops_close


def test_a_loop_closed_with_a_read_in_flight_first_waits_for_it():
    # What orbax does: the restore's coroutine fails while a read waits on another
    # thread's result, and the loop is closed at once.
    release = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(1)

    async def read() -> str:
        return await asyncio.wrap_future(pool.submit(lambda: release.wait(5) and "read"))

    async def restore() -> None:
        asyncio.ensure_future(read())
        raise ValueError("a damaged file")

    with reads_finish_before_loops_close(), reads_finish_before_loops_close():  # re-entrant
        loop = asyncio.new_event_loop()
        with pytest.raises(ValueError, match="a damaged file"):
            loop.run_until_complete(restore())
        (pending,) = asyncio.all_tasks(loop)
        threading.Timer(0.05, release.set).start()
        loop.close()
    pool.shutdown(wait=True)
    assert loop.is_closed() and pending.done() and pending.result() == "read"
    assert "new_event_loop" not in vars(asyncio.get_event_loop_policy())
