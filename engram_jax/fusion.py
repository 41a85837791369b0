"""Rank fusion."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax import ranking


def rrf_fuse(leg_scores: Array, *, weights: ArrayLike, depths: Sequence[int], where: Array | None = None,
             k0: ArrayLike = 60.0) -> Array:
  r"""Weighted reciprocal rank fusion with a depth per leg.

  Definition:
    .. math:: s_i = \sum_l w_l \, \frac{[r_{l,i} \le D_l]}{k_0 + r_{l,i}}

  where :math:`r_{l,i}` is item i's 1-based rank in leg l under the shared tie rule
  (:mod:`engram_jax.ranking`). Items a leg does not rank (score ``-inf``, e.g. a greedy leg's
  unpicked items) contribute nothing from that leg.

  Args:
    leg_scores: ``[L, ..., N]`` per-leg scores.
    weights: ``[L]`` leg weights; traced.
    depths: L static ints, each leg's depth (its top-D enters the fusion).
    where: ``[..., N]`` True for real items; masked items score ``-inf``.
    k0: the RRF constant (60).

  Returns:
    ``[..., N]`` fused scores (0 for real items no leg ranked within its depth).
  """
  leg_scores = jnp.asarray(leg_scores)
  n_legs, n = leg_scores.shape[0], leg_scores.shape[-1]
  if len(depths) != n_legs:
    raise ValueError(f'Shape mismatch: {n_legs} legs but {len(depths)} depths')
  weights = jnp.broadcast_to(jnp.asarray(weights, leg_scores.dtype), (n_legs,))
  batch = leg_scores.shape[1:-1]
  real = jnp.ones(leg_scores.shape[1:], bool) if where is None else jnp.broadcast_to(where, leg_scores.shape[1:])
  real2 = real.reshape(-1, n)
  rows = jnp.arange(real2.shape[0])[:, None]
  fused = jnp.zeros(real2.shape, leg_scores.dtype)
  for l in range(n_legs):
    # Only the top-D of a leg contributes, so a top-k (same tie rule as ranking.ranks) replaces a full sort.
    d = min(int(depths[l]), n)
    s = leg_scores[l].reshape(-1, n)
    idx, vals = ranking.top_k(s, k=d, where=real2 & jnp.isfinite(s))
    contrib = jnp.where(jnp.isfinite(vals), weights[l] / (k0 + jnp.arange(1, d + 1, dtype=leg_scores.dtype)), 0.0)
    fused = fused.at[rows, idx].add(contrib)
  fused = fused.reshape(batch + (n,))
  return jnp.where(real, fused, -jnp.inf)
