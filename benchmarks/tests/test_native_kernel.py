"""The C kernels of ``benchmarks/bench_native.py`` compute dropmask's mask exactly, so
that their timings stand for a fused dropmask kernel, not for some other mask."""

from __future__ import annotations

import ctypes
import math
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from benchmarks import bench_native

from dropmask import testing

pytestmark = pytest.mark.skipif(
    bench_native.unsupported() is not None,
    reason=f"native kernels cannot build here: {bench_native.unsupported()}",
)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return bench_native.build(tmp_path_factory.mktemp("native"))


@pytest.mark.parametrize("shape", [(64, 1024), (1, 256), (3, 8, 512)])
def test_threefry_kernel_is_bit_exact(native: ctypes.CDLL, shape: tuple[int, ...]) -> None:
    checks = bench_native.check_exact(native, shape)
    assert checks["bit_exact_vs_dropmask"]
    assert set(checks["drop_fraction_2**22"]) == set(bench_native.GENERATORS.values())


def test_check_exact_catches_a_wrong_mask(native: ctypes.CDLL) -> None:
    words = np.asarray(testing.key_words(jax.random.key(7)))
    right, wrong = np.zeros(32, np.uint32), np.zeros(32, np.uint32)
    mask = bench_native.Mask.at(bench_native.RATE)
    native.packed_words(bench_native.DROPMASK, words, right, 32, mask.value, 1)
    native.packed_words(0, words, wrong, 32, mask.value, 1)  # 20 rounds: another mask
    assert not np.array_equal(right, wrong)


def test_mask_is_dropmasks_16_bit_threshold() -> None:
    assert bench_native.Mask.at(0.1).value == round(0.9 * 2**16)
    assert bench_native.Mask.at(0.5).value == 2**15


@pytest.mark.skipif("vaes" not in bench_native.cpu_flags(), reason="no VAES on this CPU")
def test_ars_same_with_and_without_vaes(native: ctypes.CDLL, tmp_path: Path) -> None:
    lib = tmp_path / "no_vaes.so"
    flags = ["-O3", "-mavx2", "-mbmi2", "-maes", "-DNO_VAES", "-fopenmp", "-shared", "-fPIC"]
    subprocess.run(["gcc", *flags, str(bench_native.SOURCE), "-o", str(lib)], check=True)
    plain = ctypes.CDLL(str(lib))
    plain.packed_words.argtypes = native.packed_words.argtypes
    n_words = math.prod((16, 256))
    words = np.asarray(testing.key_words(jax.random.key(3)))
    a, b = np.zeros(n_words, np.uint32), np.zeros(n_words, np.uint32)
    thr = bench_native.Mask.at(0.1).value
    native.packed_words(3, words, a, n_words, thr, 1)
    plain.packed_words(3, words, b, n_words, thr, 1)
    np.testing.assert_array_equal(a, b)


def test_check_exact_rejects_shapes_the_kernels_cannot_lay_out(native: ctypes.CDLL) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        bench_native.check_exact(native, (16, 48))
