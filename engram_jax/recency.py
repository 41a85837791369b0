"""Recency re-ranking (Tide): a base leg's candidates re-scored with a write-order prior."""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax import ranking


def tide_scores(base: Array, positions: Array, *, weight: ArrayLike, depth: int,
                where: Array | None = None) -> Array:
  r"""Tide: the base leg's top-``depth`` candidates plus a linear recency bonus.

  Definition:
    .. math::
      s_i = b_i + w \, \frac{p_i}{N_{real} - 1} \quad (i \in \text{top-}depth(b)),
      \qquad s_i = -\infty \text{ otherwise}

  where :math:`b` is the base leg's scores (cosine or BM25), :math:`p_i` the item's position in write
  order (0 = oldest) and :math:`N_{real}` the number of real items, so the bonus runs from 0 (oldest)
  to :math:`w` (newest). With :math:`N_{real} = 1` the single item (position 0) gets bonus 0
  (the denominator is taken as 1); with :math:`N_{real} = 0` everything is ``-inf``.

  Equal k: only the base's top-``depth`` candidates (shared tie rule: the later item wins ties at
  the cut) are re-scored, so Tide never returns an item the base would not have returned at that
  depth. Ties in the Tide score are left to the shared rule of whoever ranks them (the more recently
  written item first). Base scores of ``-inf`` (items the base does not rank) stay ``-inf``.

  Args:
    base: ``[..., N]`` base leg scores; leading axes are batch.
    positions: ``[N]`` or ``[..., N]`` write-order positions, ``0..N_real-1`` for real items.
    weight: recency weight :math:`w`; traced (fit on a training split).
    depth: static number of base candidates re-scored (``depth >= N`` means all).
    where: ``[N]`` or ``[..., N]`` True for real items.

  Returns:
    ``[..., N]`` scores; ``-inf`` outside the base's top-``depth`` and for masked items.
  """
  base = jnp.asarray(base)
  n = base.shape[-1]
  real = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
  real = jnp.broadcast_to(real, base.shape)
  d = min(depth, n)
  if d < 1:
    raise ValueError(f'depth must be >= 1, got {depth}')
  idx, vals = ranking.top_k(base, k=d, where=real)
  hit = (idx[..., :, None] == jnp.arange(n)) & jnp.isfinite(vals)[..., :, None]  # [..., d, N]
  cand = jnp.any(hit, axis=-2)
  n_real = jnp.sum(real, axis=-1, keepdims=True)
  denom = jnp.maximum(n_real - 1, 1).astype(base.dtype)
  pos = jnp.asarray(positions, base.dtype)
  s = base + jnp.asarray(weight, base.dtype) * pos / denom
  return jnp.where(cand, s, -jnp.inf)
