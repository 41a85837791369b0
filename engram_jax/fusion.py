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
  n_legs = leg_scores.shape[0]
  if len(depths) != n_legs:
    raise ValueError(f'Shape mismatch: {n_legs} legs but {len(depths)} depths')
  weights = jnp.broadcast_to(jnp.asarray(weights, leg_scores.dtype), (n_legs,))
  real = jnp.ones(leg_scores.shape[1:], bool) if where is None else jnp.broadcast_to(where, leg_scores.shape[1:])
  fused = jnp.zeros(leg_scores.shape[1:], leg_scores.dtype)
  for l in range(n_legs):
    ranked = real & jnp.isfinite(leg_scores[l])
    r = ranking.ranks(leg_scores[l], where=ranked)
    contrib = jnp.where(ranked & (r <= depths[l]), weights[l] / (k0 + r), 0.0)
    fused = fused + contrib
  return jnp.where(real, fused, -jnp.inf)
