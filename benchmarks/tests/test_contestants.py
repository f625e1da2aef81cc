"""The dropout contestants: the vjp kept apart, outputs checked, residual bytes named."""

from __future__ import annotations

import pytest
from benchmarks import _contestants


def test_apart_vjp_has_a_barrier_and_the_plain_vjps_values():
    import jax
    import jax.numpy as jnp
    import numpy as np

    ours = _contestants.contestants(full=False)[0][0]
    x, g = _contestants.inputs((8, 64), jnp.float32)
    key = ours.make_aux(jnp.float32)
    y, dx = _contestants.fwd_bwd_fn(ours)(x, key, g)
    want_y, vjp_fn = jax.vjp(lambda x: ours.apply(x, key), x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want_y))
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(vjp_fn(g)[0]))
    lowered = _contestants.fwd_bwd_fn(ours).lower(x, key, g).as_text()
    assert "optimization_barrier" in lowered


def test_outputs_are_checked_for_dropout():
    import jax.numpy as jnp

    ours, _, limit = _contestants.contestants(full=False)[0]
    assert _contestants.checked(ours, (256, 256), "f32", "fwd+bwd")["ok"]
    assert _contestants.checked(limit, (256, 256), "f32", "fwd")["ok"] is None
    x, g = _contestants.inputs((256, 256), jnp.float32)
    assert not _contestants.check_output(x, x, None, None)["ok"]  # nothing dropped


def test_generator_loop_xors_the_packed_words():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dropmask import testing

    key = jax.random.key(5)
    got = _contestants.looped_mask_words((4, 64), 2)(jnp.zeros(()), key)
    want = np.bitwise_xor(
        *(
            np.asarray(testing.packed_mask_words(jax.random.fold_in(key, i), (4, 64), 0.1))
            for i in range(2)
        )
    )
    np.testing.assert_array_equal(np.asarray(got), want)


def test_residuals_name_what_grows_with_the_input():
    import jax.numpy as jnp

    by_name = {c.name: c for c in _contestants.contestants()[0]}
    ours = _contestants.residuals(by_name[_contestants.dropmask_name()], jnp.float32)
    assert ours["residual_bytes_per_element"] == pytest.approx(0.125)
    assert ours["growing_residuals"] == ["uint8[2048,256]"]  # 1 bit per element, in bytes
    assert ours["residual_bytes_constant"] == pytest.approx(0)  # nothing but the flags
    limit = _contestants.residuals(by_name[_contestants.LIMIT], jnp.float32)
    assert limit["residual_bytes_per_element"] == 0 and limit["growing_residuals"] == []
    for choice in _contestants.residual_choices():
        keyed = _contestants.residuals(by_name[f"dropmask residual={choice!r}"], jnp.float32)
        assert keyed["growing_residuals"] == []
