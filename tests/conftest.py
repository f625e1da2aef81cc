"""Strict JAX settings for every test; 8 fake CPU devices for the sharding tests."""

import os

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
