"""Rank fusion."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import ranking, relax, validation
from engram_jax.ops.greedy import SoftSelection


def check_fusion(where: str, weights: ArrayLike, depths: Sequence[int], k0: ArrayLike) -> None:
  """The fusion's knobs at a public function's boundary, as a pipeline checks them (concrete values only:
  :func:`engram_jax.core.validation.check_value`): finite weights >= 0, integer depths >= 1, a finite ``k0 > 0``."""
  validation.check_value(weights, 'weights', where=where, check='>=0', doc='leg weights')
  validation.check_value(k0, 'k0', where=where, check='>0', doc='RRF rank offset')
  for i, d in enumerate(depths):
    validation.check_value(d, f'depths[{i}]', where=where, check='int>=1', doc='leg depth')


def rrf_fuse(
  leg_scores: Array, *, weights: ArrayLike, depths: Sequence[int], where: Array | None = None, k0: ArrayLike = 60.0
) -> Array:
  r"""Weighted reciprocal rank fusion with a depth per leg.

  Definition:
    .. math:: s_i = \sum_l w_l \, \frac{[r_{l,i} \le D_l]}{k_0 + r_{l,i}}

  where :math:`r_{l,i}` is item i's 1-based rank in leg l under the shared tie rule
  (:mod:`engram_jax.core.ranking`). Items a leg does not rank (score ``-inf``, e.g. a greedy leg's
  unpicked items) contribute nothing from that leg.

  Args:
    leg_scores: ``[L, ..., N]`` per-leg scores.
    weights: ``[L]`` leg weights; traced.
    depths: L static ints, each leg's depth (its top-D enters the fusion).
    where: ``[..., N]`` True for real items; masked items score ``-inf``.
    k0: the RRF constant (60).

  Returns:
    ``[..., N]`` fused scores (0 for real items no leg ranked within its depth).

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import rrf_fuse
    >>> legs = jnp.array([[0.9, 0.1, 0.5], [1.0, 3.0, 2.0]])  # [L=2 legs, N=3 items]
    >>> [round(s * 61 * 62, 1) for s in rrf_fuse(legs, weights=jnp.array([1.0, 1.0]), depths=[3, 1], k0=60.0).tolist()]  # x 61*62; leg 2 counts its top-1 only
    [62.0, 122.0, 61.0]
  """
  validation.check_scores('rrf_fuse', leg_scores=leg_scores)
  check_fusion('rrf_fuse', weights, depths, k0)
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


# ---- soft twin (for fitting only; rrf_fuse is what is scored) ----------------------------------------


def scatter_add(values: Array, idx: Array, shape: tuple[int, ...]) -> Array:
  """``[..., N]`` zeros plus ``values [..., C]`` at the distinct indices ``idx [..., C]`` of each list."""
  n = shape[-1]
  flat_i, flat_v = idx.reshape(-1, idx.shape[-1]), values.reshape(-1, idx.shape[-1])
  rows = jnp.arange(flat_i.shape[0])[:, None]
  return jnp.zeros((flat_i.shape[0], n), values.dtype).at[rows, flat_i].add(flat_v, unique_indices=True).reshape(shape)


def soft_rrf_fuse(
  leg_scores: Sequence[Array | SoftSelection] | Array,
  *,
  weights: ArrayLike,
  depths: Sequence[int],
  where: Array | None = None,
  k0: ArrayLike = 60.0,
  temperature: ArrayLike | None | Sequence[ArrayLike | None] = 1.0,
  depth_temperature: ArrayLike = 0.5,
  candidates: int | None = None,
) -> Array:
  r"""Relaxed twin of :func:`rrf_fuse`: soft ranks and a soft depth cutoff; differentiable in the
  weights, ``k0`` and (for soft legs) the leg scores.

  Definition (:math:`\tilde r` = :func:`engram_jax.core.relax.soft_ranks`, :math:`c` = :func:`engram_jax.core.relax.soft_cutoff`):
    .. math:: s_i = \sum_l w_l \, \frac{c_{D_l}(\tilde r_{l,i})}{k_0 + \tilde r_{l,i}}

  A leg given as a :class:`engram_jax.ops.greedy.SoftSelection` (relaxed greedy picks ``probs [..., K, N]``)
  contributes the expectation over its picks, :math:`w_l \sum_t p_{t,i} [t \le D_l] / (k_0 + t)`.
  A leg whose temperature is ``None`` is ranked hard (its top-D under the shared tie rule, as in :func:`rrf_fuse`): use
  it for legs with nothing to fit, which are then exactly the hard leg. As every temperature tends to 0 on
  scores without ties, the result tends to :func:`rrf_fuse`.

  Args:
    leg_scores: ``[L, ..., N]`` scores, or a length-L sequence of ``[..., N]`` scores / ``SoftSelection``.
    weights: ``[L]``; traced.
    depths: L static ints.
    where: ``[..., N]`` True for real items.
    k0: traced.
    temperature: soft-rank temperature (score units) for every leg, or one per leg (``None`` = hard);
      each a scalar or ``[...]`` per list; traced (the ``None`` pattern is static).
    depth_temperature: soft depth cutoff temperature, in rank units; traced.
    candidates: static; if set, a soft leg is soft-ranked among its hard top-``candidates`` items only
      (``O(C^2)`` instead of ``O(N^2)``): the rest are taken to rank after all of them and contribute 0.
      Exact as the temperatures tend to 0 when ``candidates >= depth``; use some more than the depth so
      that the items just past the cut still pull on the soft ranks.

  Returns:
    ``[..., N]`` fused scores (``-inf`` for masked items).

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import rrf_fuse, soft_rrf_fuse
    >>> legs = jnp.array([[0.9, 0.1, 0.5], [1.0, 3.0, 2.0]])
    >>> hard = rrf_fuse(legs, weights=jnp.array([1.0, 2.0]), depths=[3, 3])
    >>> soft = soft_rrf_fuse(legs, weights=jnp.array([1.0, 2.0]), depths=[3, 3], temperature=1e-3, depth_temperature=1e-3)
    >>> bool(jnp.allclose(soft, hard, atol=1e-5))  # cold, the twin is the hard fusion
    True
  """
  check_fusion('soft_rrf_fuse', weights, depths, k0)
  legs = list(leg_scores)
  n_legs = len(legs)
  if len(depths) != n_legs:
    raise ValueError(f'Shape mismatch: {n_legs} legs but {len(depths)} depths')
  temps = list(temperature) if isinstance(temperature, (list, tuple)) else [temperature] * n_legs
  if len(temps) != n_legs:
    raise ValueError(f'Shape mismatch: {n_legs} legs but {len(temps)} temperatures')
  first = legs[0].probs[..., 0, :] if isinstance(legs[0], SoftSelection) else jnp.asarray(legs[0])
  dtype = jnp.result_type(first.dtype, jnp.asarray(weights).dtype, float)
  shape = first.shape
  n = shape[-1]
  real = jnp.ones(shape, bool) if where is None else jnp.broadcast_to(jnp.asarray(where, bool), shape)
  weights = jnp.broadcast_to(jnp.asarray(weights, dtype), (n_legs,))
  k0 = jnp.asarray(k0, dtype)
  fused = jnp.zeros(shape, dtype)
  for l, (leg, t) in enumerate(zip(legs, temps)):
    d = int(depths[l])
    if isinstance(leg, SoftSelection):
      picks = jnp.arange(1, leg.probs.shape[-2] + 1, dtype=dtype)
      g = jnp.where(picks <= d, 1.0 / (k0 + picks), 0.0)
      fused = fused + weights[l] * jnp.einsum('...kn,k->...n', leg.probs.astype(dtype), g)
      continue
    s = jnp.asarray(leg, dtype)
    valid = real & jnp.isfinite(s)
    if t is None:  # only the top-D enter, as in rrf_fuse (a top-k, not a full sort)
      at, vals = ranking.top_k(s, k=min(d, n), where=valid)
      contrib = jnp.where(jnp.isfinite(vals), weights[l] / (k0 + jnp.arange(1, at.shape[-1] + 1, dtype=dtype)), 0.0)
      fused = fused + scatter_add(contrib, at, shape)
    elif candidates is None:
      r = relax.soft_ranks(s, where=valid, temperature=t)
      c = relax.soft_cutoff(r, k=d, temperature=depth_temperature)
      fused = fused + jnp.where(valid, weights[l] * c / (k0 + r), 0.0)
    else:
      at, _ = ranking.top_k(s, k=min(candidates, n), where=valid)
      v_at = jnp.take_along_axis(valid, at, axis=-1)
      r = relax.soft_ranks(jnp.take_along_axis(s, at, axis=-1), where=v_at, temperature=t)
      c = relax.soft_cutoff(r, k=d, temperature=depth_temperature)
      contrib = jnp.where(v_at, weights[l] * c / (k0 + r), 0.0)
      fused = fused + scatter_add(contrib, at, shape)
  return jnp.where(real, fused, -jnp.inf)
