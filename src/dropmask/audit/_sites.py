"""Recognising dropout sites and recording, per call, which elements they dropped.

A site is recorded from inside the model's forward pass, where values may be tracers
(under ``jit``, ``grad``, ``scan``): the drop pattern is computed there and sent to
the host with ``jax.debug.callback``, so the same code audits eager, jitted and
differentiated calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn import attention as nnx_attention
from jax.core import Tracer

from .._attention import dot_product_attention as _dropmask_attention
from .._checks import concrete_value
from ._audit_report import SiteFields

__all__ = ["Observation", "Recorder", "SiteInfo", "classify", "watch_attention"]

# SELU's saturation value -scale * alpha: where alpha dropout's dropped units sit
# before its affine correction.
_ALPHA_PRIME = -1.7580993408473766


@dataclasses.dataclass(frozen=True)
class SiteInfo(SiteFields):
    """What is known about a site when its call is traced (static, Python-side)."""

    decision_shape: tuple[int, ...]
    drew: bool
    vmapped: bool = False


@dataclasses.dataclass
class Observation:
    """One executed call of a site: the dropped and valid (nonzero input) elements."""

    phase: str
    site: str
    dropped: np.ndarray | None
    valid: np.ndarray | None
    key: np.ndarray | None


def _kind_by_type(module: Any) -> str | None:
    """The kind of a known dropout class (Flax's or dropmask's), matched by name."""
    names = {c.__module__ + "." + c.__name__ for c in type(module).__mro__}
    for prefix in ("flax.linen.stochastic.", "flax.nnx.nn.stochastic."):
        if prefix + "Dropout" in names:
            return "dropout"
    table = {
        "Dropout": "dropout",
        "WordDropout": "word",
        "DropPath": "drop_path",
        "GaussianDropout": "gaussian",
        "AlphaDropout": "alpha",
    }
    for name, kind in table.items():
        if f"dropmask.linen.{name}" in names or f"dropmask.nnx.{name}" in names:
            return kind
    return None


def _configured_rate(module: Any) -> float | None:
    for attr in ("rate", "dropout_rate"):
        if hasattr(module, attr):
            value = getattr(module, attr)
            try:
                return concrete_value(value)
            except (TypeError, ValueError):
                return None
    return None


def _has_children(module: Any) -> bool:
    """Whether a Linen or NNX module holds submodules (a block, not a layer)."""
    state = getattr(module, "_state", None)
    if getattr(state, "children", None):
        return True
    return any(isinstance(v, nnx.Module) for v in getattr(module, "__dict__", {}).values())


def _looks_stochastic(module: Any) -> bool:
    """A custom leaf layer with a ``rate`` (or ``dropout_rate``) field.

    Blocks that merely carry a rate for their children are not sites: their children
    are, and a block's own output is not a masked copy of its input.
    """
    has_rate = hasattr(module, "rate") or hasattr(module, "dropout_rate")
    return has_rate and not _has_children(module)


def _batched(x: Any) -> bool:
    """Whether ``x`` is traced by ``vmap`` (``jax.vmap``, ``nnx.vmap``, ``nn.vmap``): each
    member of the batch then reports its own execution of the site."""
    return isinstance(x, Tracer) and any(c.__name__ == "BatchTracer" for c in type(x).__mro__)


def _first_array(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    for value in (*args, kwargs.get("inputs"), kwargs.get("x")):
        if isinstance(value, jax.Array | np.ndarray):
            return value
    return None


def classify(module: Any, drew: bool) -> str | None:
    """``kind`` of a site, or None when ``module`` is not one."""
    kind = _kind_by_type(module)
    if kind is not None:
        return kind
    if drew and _has_children(module):
        # A block that draws a key itself, like Flax's MultiHeadDotProductAttention
        # dropping attention weights: its output is not a masked copy of its input.
        return "other"
    if drew or _looks_stochastic(module):
        return "custom"
    return None


def _explicit_key(kwargs: Mapping[str, Any]) -> Any:
    for name in ("rng", "rngs", "key"):
        value = kwargs.get(name)
        if isinstance(value, jax.Array):
            return value
    return None


def _key_data(key: jax.Array) -> jax.Array:
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return key


def _dropped_weights_of(attend: Callable[..., Any]) -> Callable[..., Any]:
    """The weights function of dropmask's attention (or a ``functools.partial`` of it).

    Its weights after dropout are its output for the values ``v = I`` over the keys:
    ``out[..., q, h, j]`` is query ``q``'s weight on key ``j`` (0 where dropped, the
    kept ones scaled by ``1/keep``), read off the very function the model calls, on
    whichever path it takes.
    """

    def weights(query: Any, key: Any, *, deterministic: bool = False, **kw: Any) -> jax.Array:
        # deterministic=False by default, as Flax's weights functions: a dropout_rng
        # alone turns dropout on.
        kv_len, kv_heads = key.shape[-3], key.shape[-2]
        eye = jnp.eye(kv_len, dtype=jnp.result_type(query))[:, None, :]
        identity = jnp.broadcast_to(eye, (*key.shape[:-3], kv_len, kv_heads, kv_len))
        out = attend(query, key, identity, deterministic=deterministic, **kw)
        return jnp.moveaxis(out, -2, -3)  # [..., heads, q, kv]

    return weights


def _attention_weights(attention_fn: Any) -> tuple[Callable[..., Any], Any] | None:
    """``(weights function, the arguments it takes)`` of a known attention function.

    Flax's attention functions (or a bare ``functools.partial`` of one, which
    ``swap_dropout(impl="flax", attention=True)`` gives) apply dropout in their weights
    function; dropmask's :func:`~dropmask.dot_product_attention` (or a
    ``functools.partial`` of it, e.g. with ``algorithm=``) is read through
    :func:`_dropped_weights_of`.
    """
    flax_weights = {
        nn.dot_product_attention: nn.dot_product_attention_weights,
        nnx_attention.dot_product_attention: nnx_attention.dot_product_attention_weights,
    }
    base = attention_fn.func if isinstance(attention_fn, functools.partial) else attention_fn
    bare = base is attention_fn or not (attention_fn.args or attention_fn.keywords)
    for fn, weights in flax_weights.items():
        if bare and base is fn:
            return weights, inspect.signature(weights).parameters
    if base is _dropmask_attention:
        return _dropped_weights_of(attention_fn), inspect.signature(base).parameters
    return None


# Arguments of the attention call that the audit sets itself when recomputing weights.
_OWN_ARGS = ("dropout_rng", "dropout_rate", "deterministic", "module")


@contextlib.contextmanager
def watch_attention(module: Any) -> Iterator[list[tuple[jax.Array, jax.Array]]]:
    """Collects ``(dropped, valid)`` attention-weight patterns of ``module``'s call.

    Applies to Flax's ``MultiHeadDotProductAttention`` (Linen) and ``MultiHeadAttention``
    (NNX) with a rate above zero and Flax's default attention function or dropmask's
    ``dot_product_attention``. For the call's duration the module's ``attention_fn`` is
    a wrapper that runs the original and recomputes the weights with and without the
    same dropout key: the weights function is the one the original applies, so the
    pattern is the mask it used. Other modules yield an empty list.
    """
    seen: list[tuple[jax.Array, jax.Array]] = []
    original = vars(module).get("attention_fn")
    known = None if original is None else _attention_weights(original)
    if original is None or known is None or not _configured_rate(module):
        yield seen
        return
    attend: Callable[..., Any] = original
    weights, accepted = known

    @functools.wraps(attend)
    def observed(query: Any, key: Any, value: Any, **kw: Any) -> Any:
        out = attend(query, key, value, **kw)
        common = {k: v for k, v in kw.items() if k in accepted and k not in _OWN_ARGS}
        stop = jax.lax.stop_gradient
        full = weights(stop(query), stop(key), deterministic=True, **common)
        valid = full != 0
        rng = kw.get("dropout_rng")
        if rng is None or kw.get("deterministic", False):
            seen.append((jnp.zeros_like(valid), valid))
        else:
            rate_ = kw.get("dropout_rate", 0.0)
            kept = weights(stop(query), stop(key), dropout_rng=rng, dropout_rate=rate_, **common)
            seen.append(((kept == 0) & valid, valid))
        return out

    vars(module)["attention_fn"] = observed
    try:
        yield seen
    finally:
        vars(module)["attention_fn"] = original


class Recorder:
    """Collects site observations from the model's calls, tagged with a phase label."""

    def __init__(self) -> None:
        self.phase = ""
        self.sites: dict[str, SiteInfo] = {}
        self.drew: dict[tuple[str, str], bool] = {}
        self.observations: list[Observation] = []
        self._calls: dict[str, int] = {}

    def begin(self, phase: str) -> None:
        """Starts a phase: later observations carry ``phase``; call numbering restarts."""
        self.phase = phase
        self._calls = {}

    def observe(
        self,
        module: Any,
        path: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        out: Any,
        drew: bool,
        attention: Sequence[tuple[jax.Array, jax.Array]] = (),
    ) -> None:
        """Records one call of ``module`` (a site) that mapped ``args`` to ``out``.

        ``attention`` holds the call's attention-weight patterns from
        :func:`watch_attention`; with them the site is an ``'attention'`` site whose
        mask is over the weights ``[batch..., heads, q, kv]``.
        """
        if attention:
            self._observe_attention(module, path, attention, drew)
            return
        kind = classify(module, drew)
        if kind is None:
            return
        site = self._site_name(path)
        x = _first_array(args, kwargs)
        same = isinstance(out, jax.Array) and x is not None and jnp.shape(x) == out.shape
        if not same and kind == "custom":
            kind = "other"
        same = same and kind != "other"
        shape = tuple(jnp.shape(x)) if x is not None else ()
        bdims = _broadcast_dims(module, len(shape))
        decision_shape = _decision_shape(module, kind, shape, bdims)
        info = SiteInfo(
            site,
            kind,
            type(module).__name__,
            _configured_rate(module),
            shape,
            bdims,
            decision_shape,
            drew,
            _batched(x),
        )
        self.sites.setdefault(site, info)
        self.drew[(self.phase, site)] = self.drew.get((self.phase, site), False) or drew
        # One callback per call carries everything: callbacks of a compiled program
        # may run in any order, so a site's pieces must not arrive separately.
        key = _explicit_key(kwargs)
        data = None if key is None else jax.lax.stop_gradient(_key_data(key))
        if same:
            dropped, valid = _pattern(module, kind, jnp.asarray(x), out)
            jax.debug.callback(functools.partial(self._add, site), dropped, valid, data)
        else:
            jax.debug.callback(functools.partial(self._add, site, None, None), data)

    def _site_name(self, path: str) -> str:
        """``path``, or ``path#n`` for the n-th further call of one module in a phase."""
        count = self._calls.get(path, 0)
        self._calls[path] = count + 1
        return path if count == 0 else f"{path}#{count}"

    def _observe_attention(
        self,
        module: Any,
        path: str,
        patterns: Sequence[tuple[jax.Array, jax.Array]],
        drew: bool,
    ) -> None:
        site = self._site_name(path)
        shape = tuple(patterns[0][0].shape)
        # Flax's broadcast dropout draws one [q, kv] mask for every batch and head index.
        shared = tuple(range(len(shape) - 2)) if getattr(module, "broadcast_dropout", False) else ()
        info = SiteInfo(
            site,
            "attention",
            type(module).__name__,
            _configured_rate(module),
            shape,
            shared,
            _decision_shape(module, "attention", shape, shared),
            drew,
        )
        self.sites.setdefault(site, info)
        self.drew[(self.phase, site)] = self.drew.get((self.phase, site), False) or drew
        for dropped, valid in patterns:
            jax.debug.callback(functools.partial(self._add, site), dropped, valid, None)

    def _add(self, site: str, dropped: Any, valid: Any, key: Any) -> None:
        self.observations.append(
            Observation(
                self.phase,
                site,
                None if dropped is None else np.asarray(dropped),
                None if valid is None else np.asarray(valid),
                None if key is None else np.asarray(key),
            )
        )

    def compact(self) -> None:
        """Forgets sites no execution reported and renumbers the rest per module path.

        A transform may trace a module's call and discard the trace (``nn.scan`` traces
        its body once for shapes before the scan that runs): such a call never reports
        from the executed program, and the call that does should not read as a repeat.
        """
        seen = {o.site for o in self.observations}
        kept = [name for name in self.sites if name in seen]
        counts: dict[str, int] = {}
        rename = {}
        for name in kept:
            base = name.split("#")[0]
            n = counts.get(base, 0)
            counts[base] = n + 1
            rename[name] = base if n == 0 else f"{base}#{n}"
        self.sites = {rename[n]: dataclasses.replace(self.sites[n], path=rename[n]) for n in kept}
        self.drew = {(ph, rename[n]): v for (ph, n), v in self.drew.items() if n in rename}
        for obs in self.observations:
            obs.site = rename.get(obs.site, obs.site)

    def by_phase(self, phase: str) -> dict[str, list[Observation]]:
        """Observations of one phase grouped by site, in call order."""
        out: dict[str, list[Observation]] = {}
        for obs in self.observations:
            if obs.phase == phase:
                out.setdefault(obs.site, []).append(obs)
        return out


def _broadcast_dims(module: Any, ndim: int) -> tuple[int, ...]:
    dims = getattr(module, "broadcast_dims", ()) or ()
    try:
        return tuple(sorted({int(d) % ndim for d in dims})) if ndim else ()
    except (TypeError, ValueError):
        return ()


def _decision_shape(
    module: Any, kind: str, shape: tuple[int, ...], bdims: tuple[int, ...]
) -> tuple[int, ...]:
    """Shape of the independent keep/drop draws behind a site's mask."""
    if kind == "drop_path" and shape:
        axis = int(getattr(module, "batch_axis", 0)) % len(shape)
        return (shape[axis],)
    return tuple(1 if i in bdims else n for i, n in enumerate(shape))


def _pattern(module: Any, kind: str, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(dropped, valid)``: bool arrays shaped like ``x``, outside autodiff."""
    x, y = jax.lax.stop_gradient(x), jax.lax.stop_gradient(y)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        unk = getattr(module, "unk_id", getattr(module, "unk_idx", None))
        valid = jnp.ones(x.shape, bool) if unk is None else x != unk
        return (y != x) & valid, valid
    xf, yf = x.astype(jnp.float32), y.astype(jnp.float32)
    if kind == "gaussian":
        # No element is dropped; the noise factor's side of 1 is the random pattern.
        valid = xf != 0
        return ((yf - xf) * xf > 0) & valid, valid
    if kind == "alpha":
        rate = _configured_rate(module) or 0.0
        keep = 1.0 - rate
        a = (keep * (1.0 + rate * _ALPHA_PRIME**2)) ** -0.5 if keep > 0 else 1.0
        fill = a * _ALPHA_PRIME + (-a * _ALPHA_PRIME * rate)
        valid = jnp.abs(xf - _ALPHA_PRIME) > 0.05
        near_fill = jnp.abs(yf - fill) <= 1e-2 * (1 + abs(fill))
        return near_fill & (yf != xf) & valid, valid
    valid = xf != 0
    return (yf == 0) & valid, valid
