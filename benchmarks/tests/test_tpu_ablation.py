"""``tpu_ablation``'s prototype kernels draw dropmask's mask, in either packed layout."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmarks import bench_tpu
from benchmarks import tpu_ablation as ta

import dropmask
from dropmask import testing


@pytest.mark.parametrize(
    "shape",
    [(2, 197, 768), (40, 64, 256), (512, 1024), (33, 32, 128)],
)
@pytest.mark.parametrize("layout", ["rows", "lead"])
def test_the_prototype_kernels_draw_the_fast_mask_bit_for_bit(shape, layout):
    key = jax.random.key(7)
    words, keep = (
        (ta.rows_words, ta.rows_keep) if layout == "rows" else (ta.lead_words, ta.lead_keep)
    )
    got = keep(words(key, shape, jnp.bfloat16), shape)
    np.testing.assert_array_equal(
        np.asarray(got), np.asarray(dropmask.keep_mask(key, shape, ta.RATE))
    )


def test_a_shape_or_variant_it_does_not_know_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        ta.main(["--out", str(tmp_path / "a.json"), "--shapes", "vit"])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "unknown shapes or variants ['vit']" in lines[0]


@pytest.mark.slow  # every variant's step compiled and timed at a tiny shape: about a minute
def test_every_variant_runs_at_a_tiny_shape(tmp_path):
    out = tmp_path / "a.json"
    assert ta.main(["--out", str(out), "--shapes", "tiny", "--repeats", "1"]) == 0
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == list(ta.VARIANTS)
    assert all(r["step_ms"] > 0 and r["ratio"] > 0 for r in rows)


def test_the_default_and_kernel_variants_differ_only_in_what_draws_differentiated():
    """Under ``grad``: ``default`` selects the flags kernel's bytes by XLA, ``kernel``
    runs the dropout kernel in both passes; the same gradients."""
    x, key = jax.random.normal(jax.random.key(0), (64, 256)), jax.random.key(1)
    grads = {}
    with testing.tpu_kernels():
        for name, path in [("default", bench_tpu.BYTES), ("kernel", bench_tpu.KERNEL)]:
            grad = jax.grad(lambda x, f=ta.VARIANTS[name]: jnp.sum(jnp.sin(f(x, key))))
            assert bench_tpu.dropout_path(grad, x) == path
            grads[name] = grad(x)
    np.testing.assert_array_equal(np.asarray(grads["default"]), np.asarray(grads["kernel"]))
