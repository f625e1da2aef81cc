"""The experimental fused Pallas kernels (benchmarks/_pallas_fused.py) stay exact.

They run on a GPU only in ``bench_gpu``; here they run in Pallas's interpret mode, and
their Triton lowering is checked without a GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmarks._pallas_fused import fused_dropout

import dropmask
from dropmask import testing

LAYOUTS = ("rows", "columns", "joined")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.013])
def test_fused_kernel_equals_dropout(layout, dtype, rate):
    key = jax.random.key(3)
    x = jax.random.normal(jax.random.key(1), (64, 128), dtype)
    got = fused_dropout(x, testing.key_words(key), 1 - rate, layout=layout, rows=64, interpret=True)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(dropmask.dropout(x, rate, key)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fused_kernel_lowers_to_triton(layout):
    def f(x, words):
        return fused_dropout(x, words, 0.9, layout=layout)

    args = (jax.ShapeDtypeStruct((256, 256), jnp.float32), jnp.zeros(4, jnp.uint32))
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "triton" in text


def test_unsupported_shapes_are_refused():
    with pytest.raises(ValueError, match="% 32"):
        fused_dropout(jnp.ones((4, 30)), jnp.zeros(4, jnp.uint32), 0.9, interpret=True)
