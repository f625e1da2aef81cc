"""Every public function and layer that draws a mask, as one call ``(x, rate, key)`` each.

The properties that must hold for all of them run over this catalogue (the same mask
under a mesh of explicit axes, in ``tests/random/test_explicit_sharding.py``; rate
errors that name the caller, in ``tests/test_errors.py``), and
``test_every_public_mask_drawer_has_a_site`` there fails when a public name that draws
a mask has no site here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

import dropmask as dm
from dropmask import linen as dl
from dropmask import nnx as dn

# [batch, *, *, features]: the batch axis splits over 8 devices, or 4 of a 4 x 2 mesh.
SHAPE = (8, 6, 6, 4)
RNN_SHAPE = (8, 5, 3)  # [batch, time, features]
UNK = 0


@dataclasses.dataclass(frozen=True)
class Site:
    """One public function or layer, called on ``x`` with a rate and a key.

    Attributes:
      id: the test id.
      name: what its errors name (the function, or the layer's qualified name).
      public: the public name the site covers (``dropout``, ``dropmask.linen.Dropout``).
      call: ``(x, rate, key) -> output`` (a pytree of arrays).
      arg: the name of the rate argument the user passes it.
      shape, dtype: of ``x``.
      spec_2d: ``x``'s sharding over the 4 x 2 mesh ``("data", "model")``; None: the
        site runs on the 8-device mesh only (its only axis to split is the batch).
      traced_rate: whether the rate may be a JAX scalar.
      differentiable: whether ``x`` is differentiated (a floating input it transforms).
      refuses: the rates within ``2**-17`` of 0 or 1 that it refuses (those it draws
        with the ``"fast"`` generator, whose threshold would round them to 0 or 1).
      slow: its properties run with the slow tests only, but under ``jit`` on 8
        devices in one of its Linen and NNX forms (a recurrent layer: an eager call
        dispatches every step's ops).
    """

    id: str
    name: str
    public: str
    call: Callable[[jax.Array, Any, Any], Any]
    arg: str = "rate"
    shape: tuple[int, ...] = SHAPE
    dtype: Any = jnp.float32
    spec_2d: P | None = P("data", None, None, "model")
    traced_rate: bool = True
    differentiable: bool = True
    refuses: tuple[float, ...] = (1e-6, 1 - 1e-6)
    slow: bool = False


class _Double(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return x * 2.0


class _DoubleNnx(nnx.Module):
    def __call__(self, x: jax.Array) -> jax.Array:
        return x * 2.0


def _linen(layer: nn.Module, x: jax.Array, key: Any) -> Any:
    return layer.apply({}, x, rngs={"dropout": key})


def _carry(x: jax.Array) -> jax.Array:
    """A GRU(4) carry of zeros, its batch axis sharded as ``x``'s.

    ``lax.scan`` keeps its carry's type, and under a mesh of explicit axes a step on a
    sharded batch gives a sharded carry: like Flax's ``nn.RNN``, ``MaskedRNN`` needs an
    initial carry sharded so (its default one is not).
    """
    carry = jnp.zeros((x.shape[0], 4))
    spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
    return jax.sharding.reshard(carry, P(spec[0])) if spec and spec[0] is not None else carry


def _linen_rnn(rnn: nn.Module, x: jax.Array, key: Any, carry: Any) -> Any:
    params = rnn.init(jax.random.key(1), x, deterministic=True, initial_carry=carry)
    return rnn.apply(params, x, deterministic=False, rngs={"dropout": key}, initial_carry=carry)


def _nnx_rnn(x: jax.Array, key: Any, **rates: Any) -> Any:
    rnn = dn.MaskedRNN(nnx.GRUCell(RNN_SHAPE[-1], 4, rngs=nnx.Rngs(1)), **rates)
    return rnn(x, rngs=key, initial_carry=_carry(x))


def _attention(x: jax.Array, key: Any, **rates: Any) -> jax.Array:
    return dm.dot_product_attention(x, x, x, key=key, deterministic=False, **rates)


def _head_attention(x: jax.Array, key: Any, **rates: Any) -> jax.Array:
    return dm.drop_head_attention(x, x, x, key=key, deterministic=False, **rates)


_ATTENTION_2D = P("data", None, "model")  # [batch, length, heads, depth]: heads split


def _functions() -> list[Site]:
    return [
        Site("dropout", "dropout", "dropout", lambda x, r, k: dm.dropout(x, r, k)),
        Site(
            "dropout, impl='flax'",
            "dropout",
            "dropout",
            lambda x, r, k: dm.dropout(x, r, k, impl="flax"),
            refuses=(),
        ),
        Site(
            "keep_mask",
            "keep_mask",
            "keep_mask",
            lambda x, r, k: dm.keep_mask(k, x.shape, r),
            differentiable=False,
        ),
        Site(
            "word_dropout",
            "word_dropout",
            "word_dropout",
            lambda x, r, k: dm.word_dropout(x, r, k, unk_id=UNK),
            dtype=jnp.int32,
            differentiable=False,
        ),
        Site("drop_path", "drop_path", "drop_path", lambda x, r, k: dm.drop_path(x, r, k)),
        Site(
            "gaussian_dropout",
            "gaussian_dropout",
            "gaussian_dropout",
            lambda x, r, k: dm.gaussian_dropout(x, r, k),
            refuses=(),  # Gaussian noise: no threshold to round
        ),
        Site(
            "alpha_dropout",
            "alpha_dropout",
            "alpha_dropout",
            lambda x, r, k: dm.alpha_dropout(x, r, k),
        ),
        Site(
            "drop_block",
            "drop_block",
            "drop_block",
            lambda x, r, k: dm.drop_block(x, r, k, block_size=3),
            refuses=(1e-6,),  # its seed probability; near 1 it is far from 1
        ),
        Site(
            "drop_block, per_channel",
            "drop_block",
            "drop_block",
            lambda x, r, k: dm.drop_block(x, r, k, block_size=(3, 2), per_channel=True),
            refuses=(1e-6,),
        ),
        Site("drop_head", "drop_head", "drop_head", lambda x, r, k: dm.drop_head(x, r, k)),
        Site(
            "drop_head_attention",
            "drop_head_attention",
            "drop_head_attention",
            lambda x, r, k: _head_attention(x, k, dropout_rate=r),
            arg="dropout_rate",
            spec_2d=_ATTENTION_2D,
        ),
        Site(
            "drop_head_attention, weights_rate",
            "drop_head_attention",
            "drop_head_attention",
            lambda x, r, k: _head_attention(x, k, dropout_rate=0.3, weights_rate=r),
            arg="weights_rate",
            spec_2d=_ATTENTION_2D,
        ),
        Site(
            "drop_tokens",
            "drop_tokens",
            "drop_tokens",
            lambda x, r, k: dm.drop_tokens(x, r, k),
            traced_rate=False,  # it fixes the output's length
            refuses=(),  # it draws an order, not flags
        ),
        Site(
            "layer_drop",
            "layer_drop",
            "layer_drop",
            lambda x, r, k: dm.layer_drop(lambda h: h * 2.0, x, r, k),
        ),
        Site(
            "r_drop_passes",
            "r_drop_passes",
            "r_drop_passes",
            # It takes no rate: the user's passes draw with their own.
            lambda x, r, k: dm.r_drop_passes(lambda key: dm.dropout(x, 0.3, key), k),
            refuses=(),
        ),
        Site(
            "zoneout",
            "zoneout",
            "zoneout",
            lambda x, r, k: dm.zoneout(x, jnp.tanh(x), r, k),
        ),
        Site(
            "dot_product_attention",
            "dot_product_attention",
            "dot_product_attention",
            lambda x, r, k: _attention(x, k, dropout_rate=r),
            arg="dropout_rate",
            spec_2d=_ATTENTION_2D,
        ),
        Site(
            "dot_product_attention, broadcast_dropout=False",
            "dot_product_attention",
            "dot_product_attention",
            lambda x, r, k: _attention(x, k, dropout_rate=r, broadcast_dropout=False),
            arg="dropout_rate",
            spec_2d=_ATTENTION_2D,
        ),
    ]


def _layers(front: str) -> list[Site]:
    """The layers of ``dropmask.linen`` or ``dropmask.nnx``, called alike."""
    linen = front == "linen"
    mod = dl if linen else dn
    prefix = f"dropmask.{front}."

    def layer(cls_name: str, **fields: Any) -> Callable[[jax.Array, Any, Any], Any]:
        cls = getattr(mod, cls_name)
        if linen:
            return lambda x, r, k: _linen(cls(r, deterministic=False, **fields), x, k)
        return lambda x, r, k: cls(r, **fields)(x, rngs=k)

    def site(cls_name: str, **kw: Any) -> Site:
        fields = kw.pop("fields", {})
        return Site(prefix + cls_name, prefix + cls_name, prefix + cls_name,
                    layer(cls_name, **fields), **kw)  # fmt: skip

    def layer_drop(x: jax.Array, r: Any, k: Any) -> Any:
        if linen:
            return _linen(dl.LayerDrop(_Double(), rate=r, deterministic=False), x, k)
        return dn.LayerDrop(_DoubleNnx(), r, rngs=nnx.Rngs(dropout=k))(x)

    def rnn(x: jax.Array, k: Any, **rates: Any) -> Any:
        if linen:
            return _linen_rnn(dl.MaskedRNN(nn.GRUCell(4), **rates), x, k, _carry(x))
        return _nnx_rnn(x, k, **rates)

    def bidirectional(x: jax.Array, r: Any, k: Any) -> Any:
        carries = (_carry(x), _carry(x))
        if linen:
            pair = (dl.MaskedRNN(nn.GRUCell(4), zoneout=r) for _ in range(2))
            return _linen_rnn(dl.Bidirectional(*pair), x, k, carries)
        cells = (nnx.GRUCell(RNN_SHAPE[-1], 4, rngs=nnx.Rngs(i)) for i in range(2))
        pair = (dn.MaskedRNN(cell, zoneout=r) for cell in cells)
        return dn.Bidirectional(*pair)(x, rngs=k, initial_carry=carries)

    rnn_site = {"shape": RNN_SHAPE, "spec_2d": None, "slow": True}
    masked_rnn = prefix + "MaskedRNN"
    return [
        site("Dropout"),
        site("DropPath"),
        site("AlphaDropout"),
        site("GaussianDropout", refuses=()),
        site("WordDropout", fields={"unk_id": UNK}, dtype=jnp.int32, differentiable=False),
        site("DropBlock", fields={"block_size": 3}, refuses=(1e-6,)),
        site("DropHead"),
        Site(prefix + "LayerDrop", prefix + "LayerDrop", prefix + "LayerDrop", layer_drop),
        Site(
            masked_rnn + ", zoneout",
            masked_rnn,
            masked_rnn,
            lambda x, r, k: rnn(x, k, zoneout=r),
            arg="zoneout",
            **rnn_site,
        ),
        Site(
            masked_rnn + ", weight_dropout",
            masked_rnn,
            masked_rnn,
            lambda x, r, k: rnn(x, k, weight_dropout=r),
            arg="weight_dropout",
            **rnn_site,
        ),
        # The zoneout given to each MaskedRNN is theirs: errors name MaskedRNN.
        Site(
            prefix + "Bidirectional",
            masked_rnn,
            prefix + "Bidirectional",
            bidirectional,
            arg="zoneout",
            **rnn_site,
        ),
    ]


SITES: list[Site] = [*_functions(), *_layers("linen"), *_layers("nnx")]


def site_input(site: Site) -> jax.Array:
    """A fixed input for ``site``: token ids, or floats with ``|x|`` in ``[0.5, 1.5]``
    (so that an element kept in one run and dropped in another differs by far more
    than rounding)."""
    if site.dtype == jnp.int32:
        return jax.random.randint(jax.random.key(1), site.shape, 1, 50, dtype=jnp.int32)
    size = jax.random.uniform(jax.random.key(1), site.shape, site.dtype, 0.5, 1.5)
    return jnp.where(jax.random.bernoulli(jax.random.key(2), 0.5, site.shape), size, -size)


def public_mask_drawers() -> set[str]:
    """The public names that draw masks: the functions of ``dropmask`` that take a
    ``key``, and the Flax modules of ``dropmask.linen`` and ``dropmask.nnx``."""
    names = {
        name
        for name in dm.__all__
        if inspect.isfunction(getattr(dm, name))
        and "key" in inspect.signature(getattr(dm, name)).parameters
    }
    for mod, base in ((dl, nn.Module), (dn, nnx.Module)):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, base):
                names.add(f"{mod.__name__}.{name}")
    return names
