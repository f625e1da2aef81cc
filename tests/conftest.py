"""Strict JAX settings for every test; 8 fake CPU devices for the sharding tests."""

import gc
import itertools
import os
import subprocess
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"

# The tests check values, masks and memory, never speed: XLA's LLVM back end at its
# lowest optimisation level compiles the suite's thousands of small programs in about
# two thirds of the time. XLA's own passes (fusion, buffer assignment) still run, so
# compiled temporaries and program structure are those a user gets. Set in the
# environment, so that the commands the tests start in subprocesses inherit it;
# `make bench` and the commands a user runs keep JAX's default.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# XLA:CPU's older emitter for fused computations: the suite's programs compile in about
# three quarters of the time (paired cold runs of seven test files, 2 cores: 17-32% less
# wall time in each of five pairs). Only code generation differs: fusion decisions,
# buffer assignment and compiled temporaries are the same (checked on dropout forward
# and backward programs and an attention gradient; the memory tests pass). A jaxlib
# that no longer knows the flag would abort at start-up, so a subprocess tries it
# first; the verdict reaches pytest-xdist's workers through the environment.
# DROPMASK_TEST_EMITTER=default, or the flag already in XLA_FLAGS, keeps the caller's
# choice.
_EMITTER_FLAG = "--xla_cpu_use_fusion_emitters=false"
if (
    "DROPMASK_TEST_EMITTER" not in os.environ
    and "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]
):
    _probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices('cpu')"],
        env={**os.environ, "XLA_FLAGS": _EMITTER_FLAG},
        capture_output=True,
        check=False,
    )
    os.environ["DROPMASK_TEST_EMITTER"] = "older" if _probe.returncode == 0 else "default"
    if os.environ["DROPMASK_TEST_EMITTER"] == "older":
        os.environ["XLA_FLAGS"] += f" {_EMITTER_FLAG}"

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    """Keeps XLA's compiled programs in pytest's cache directory between runs.

    Most of the suite's time is XLA compiling small programs on the CPU; a later run
    (the edit-test loop) loads them instead. JAX keys each entry by the program, the
    JAX and XLA versions and the compile options, so a changed source compiles afresh.
    ``-p no:cacheprovider`` runs with no cache, as a fresh clone does.
    """
    cache = getattr(config, "cache", None)
    if cache is None:
        return
    jax.config.update("jax_compilation_cache_dir", str(cache.mkdir("jax-compilation")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


@pytest.fixture
def key() -> jax.Array:
    return jax.random.key(0)


@pytest.fixture
def lowering_for_a_tpu(monkeypatch):
    """The TPU kernels lowered for a TPU on this CPU (Pallas to Mosaic, as ``jax.export``
    does for another platform): compiled, not interpreted, and a v5e's description where
    Pallas asks for the device's. Catches a kernel Mosaic cannot lower before a TPU
    does; what only the device's compiler sees still needs a TPU."""
    from dropmask._attention import _dot_product
    from dropmask._random import _draw

    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")
    if not hasattr(tpu_info, "_get_tpu_info_impl"):
        pytest.skip("this jax describes TPUs differently")
    info = tpu_info._get_tpu_info_impl(tpu_info.ChipVersion.TPU_V5E, 1)
    monkeypatch.setattr(tpu_info, "get_tpu_info", lambda: info)
    monkeypatch.setattr(_dot_product, "tpu_interpret", lambda: False)
    monkeypatch.setattr(_draw, "tpu_interpret", lambda: False)


@pytest.fixture(autouse=True)
def _checkify_codes_from_one():
    """Numbers ``checkify`` checks from 1 in every test.

    ``checkify.debug_check`` (the run-time rate check) writes a process-wide counter
    into the program as a constant, so a program traced after other tests differs from
    run to run with pytest-xdist's test order, and misses the compilation cache above.
    Restarting the count per test makes each test's programs the same on every run;
    codes only need to differ within one checkified function, which one test traces.
    """
    from jax._src import checkify as checkify_internals

    if not callable(getattr(checkify_internals, "next_code", None)):
        yield
        return
    saved = checkify_internals.next_code
    checkify_internals.next_code = itertools.count(1).__next__
    yield
    checkify_internals.next_code = saved


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Moves what a test leaves alive out of reach of Python's cyclic collector.

    JAX's caches (traced programs, lowered modules, compiled executables) grow to
    millions of Python objects over the suite, and each full collection walked all of
    them: 22-26 s of collector time per pytest-xdist worker in a full run, about 4 s
    frozen. Six of the heaviest files in one process took 7-9% less time (two paired
    runs). Frozen objects are still freed when their last reference goes; only cycles
    frozen before the collector reached them stay (worker peak memory was unchanged,
    about 5 GiB).
    """
    del item, nextitem
    gc.freeze()
