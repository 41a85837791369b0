r"""Relaxed ranking primitives for fitting: soft ranks, a soft top-k cutoff and approx-NDCG.

Fit soft, report hard: these functions exist only to give gradients to the knobs of a pipeline; every
reported number comes from the hard operators (:mod:`engram_jax.core.ranking`, :mod:`engram_jax.metrics.labels`).

Soft ranks are rax's pairwise-sigmoid ranks (``rax.utils.approx_ranks``, Qin et al. 2010); the soft
cutoff and approx-NDCG follow ``rax.approx_t12n(rax.ndcg_metric)``. Two things differ from rax, both for
the shapes met here (lists of ~700 items, few gold items, ``-inf`` for items a leg does not rank):

* items whose score is ``-inf`` (or masked by ``where``) are left out of every comparison, and their
  rank is ``n_real + 1`` (after every real item, as in :func:`engram_jax.core.ranking.ranks`);
* ranks can be computed for a subset of items (``at``), which is ``O(M N)`` instead of ``O(N^2)``:
  approx-NDCG only needs the ranks of the gold items.

Temperatures are in the units of the scores (ranks) and may be arrays (one per list), so that a caller
can scale them per list; they are traced (changing one never recompiles).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import rax
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import ranking


def _valid(scores: Array, where: Array | None) -> Array:
  """Real items: ``where`` and a finite score."""
  valid = jnp.isfinite(scores)
  return valid if where is None else valid & jnp.broadcast_to(jnp.asarray(where, bool), scores.shape)


def _per_list(x: ArrayLike, ndim: int) -> Array:
  """A scalar or ``[...]`` (one per list) value, shaped to broadcast against ``[..., N]`` lists."""
  x = jnp.asarray(x)
  return x if x.ndim == 0 else x.reshape(x.shape + (1,) * (ndim - x.ndim))


def soft_ranks(
  scores: Array, *, where: Array | None = None, temperature: ArrayLike = 1.0, at: Array | None = None
) -> Array:
  r"""Pairwise-sigmoid approximate ranks (1-based); differentiable in ``scores`` and ``temperature``.

  Definition:
    .. math:: \tilde r_i = 1 + \sum_{j \ne i,\, j \text{ real}} \sigma\!\left(\frac{s_j - s_i}{T}\right)

  which tends to the hard rank as :math:`T \to 0` when scores have no ties (a tie counts 1/2 either way,
  where :func:`engram_jax.core.ranking.ranks` puts the later item first).

  Args:
    scores: ``[..., N]`` scores, larger is better; ``-inf`` = not ranked.
    where: ``[..., N]`` True for real items.
    temperature: :math:`T > 0`, a scalar or ``[...]`` (one per list); traced.
    at: optional ``[..., M]`` int item indices: return only their ranks (against every real item),
      at cost ``O(M N)``; ``None`` ranks every item with ``rax.utils.approx_ranks`` (``O(N^2)``).

  Returns:
    ``[..., N]`` (or ``[..., M]``) float ranks; items that are masked or ``-inf`` get ``n_real + 1``.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import soft_ranks
    >>> [round(r, 3) for r in soft_ranks(jnp.array([0.2, 0.9, 0.5]), temperature=1e-3).tolist()]
    [3.0, 1.0, 2.0]
  """
  scores = jnp.asarray(scores)
  valid = _valid(scores, where)
  s = jnp.where(valid, scores, 0.0)  # no inf in differences (nor in their gradients)
  t = _per_list(temperature, s.ndim)
  n_real = jnp.sum(valid, axis=-1, keepdims=True).astype(s.dtype)
  if at is None:
    tp = t if t.ndim == 0 else t[..., None]
    r = rax.utils.approx_ranks(s, where=valid, step_fn=lambda d: jax.nn.sigmoid(d / tp))
    return jnp.where(valid, r, n_real + 1.0)
  at = jnp.asarray(at)
  s_at = jnp.take_along_axis(s, at, axis=-1)  # [..., M]
  v_at = jnp.take_along_axis(valid, at, axis=-1)
  tp = t if t.ndim == 0 else t[..., None]
  pair = jax.nn.sigmoid((s[..., None, :] - s_at[..., :, None]) / tp)  # [..., M, N]
  other = valid[..., None, :] & (jnp.arange(s.shape[-1]) != at[..., :, None])
  r = 1.0 + jnp.sum(jnp.where(other, pair, 0.0), axis=-1)
  return jnp.where(v_at, r, n_real + 1.0)


def soft_cutoff(ranks: Array, *, k: ArrayLike, temperature: ArrayLike = 0.5) -> Array:
  r"""Soft indicator of ``rank <= k``: :math:`\sigma((k + \tfrac12 - r) / T)` (T in rank units; traced).

  The step sits half-way between rank k and k + 1, so that with integer ranks rank k is kept with
  probability :math:`\sigma(1/2T)` and rank k + 1 with :math:`1 - \sigma(1/2T)`.
  """
  ranks = jnp.asarray(ranks)
  return jax.nn.sigmoid((jnp.asarray(k, ranks.dtype) + 0.5 - ranks) / _per_list(temperature, ranks.ndim))


def soft_top_k(
  scores: Array,
  *,
  k: int,
  where: Array | None = None,
  temperature: ArrayLike = 1.0,
  cutoff_temperature: ArrayLike = 0.5,
) -> Array:
  """Soft top-``k`` membership ``[..., N]`` in [0, 1]: :func:`soft_cutoff` of :func:`soft_ranks`; 0 for
  masked / ``-inf`` items. Tends to the hard top-k indicator as both temperatures tend to 0 (no ties)."""
  valid = _valid(jnp.asarray(scores), where)
  r = soft_ranks(scores, where=where, temperature=temperature)
  return jnp.where(valid, soft_cutoff(r, k=k, temperature=cutoff_temperature), 0.0)


def _ideal_dcg(n_gold: Array, k: int | None, n: int, dtype) -> Array:
  cut = n if k is None else min(k, n)
  disc = 1.0 / jnp.log2(jnp.arange(2, cut + 2, dtype=dtype))
  return jnp.sum(jnp.where(jnp.arange(cut) < n_gold[..., None], disc, 0.0), axis=-1)


def approx_ndcg(
  scores: Array,
  labels: Array,
  *,
  k: int | None = 10,
  where: Array | None = None,
  temperature: ArrayLike = 1.0,
  cutoff_temperature: ArrayLike | None = None,
  max_gold: int | None = None,
) -> Array:
  r"""Approximate NDCG@k with binary gains (Qin et al. 2010; rax ``approx_t12n(ndcg_metric)``).

  Definition (:math:`\tilde r` = :func:`soft_ranks`, :math:`c` = :func:`soft_cutoff`):
    .. math::
      \widetilde{\mathrm{NDCG}}@k = \frac{1}{\mathrm{IDCG}@k}
        \sum_{i:\, y_i = 1} \frac{c_k(\tilde r_i)}{\log_2(1 + \tilde r_i)}

  where IDCG@k is the hard ideal over ``min(|gold|, k)`` gold items, as :func:`engram_jax.metrics.labels.ndcg_at_k`.
  With ``k=None`` there is no cutoff and the value equals rax's ``-approx_t12n(ndcg_metric)`` exactly.

  Args:
    scores: ``[..., N]`` scores; ``-inf`` = not ranked (a gold item there gains 0).
    labels: ``[..., N]`` binary relevance (bool or 0/1).
    k: cutoff (static), or None.
    where: ``[..., N]`` True for real items.
    temperature: soft-rank temperature, in score units; scalar or ``[...]``; traced.
    cutoff_temperature: soft-cutoff temperature in rank units; defaults to ``temperature`` (as rax).
    max_gold: static; if set, soft ranks are computed only for the first ``max_gold`` gold items of each
      list (``O(G N)`` instead of ``O(N^2)``): set it to at least the largest number of gold items.

  Returns:
    ``[...]`` per-list values in [0, 1]; 0 for a list with no (real) gold item or no real item.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import approx_ndcg
    >>> scores, labels = jnp.array([0.9, 0.5, 0.2]), jnp.array([False, True, False])
    >>> round(float(approx_ndcg(scores, labels, k=2, temperature=1e-3)), 4)  # hard NDCG@2: 1 / log2(3)
    0.6309
  """
  scores = jnp.asarray(scores)
  n = scores.shape[-1]
  real = jnp.ones(scores.shape, bool) if where is None else jnp.broadcast_to(jnp.asarray(where, bool), scores.shape)
  gold = (jnp.asarray(labels) > 0) & real
  valid = _valid(scores, real)
  ct = temperature if cutoff_temperature is None else cutoff_temperature
  if max_gold is None:
    r = soft_ranks(scores, where=real, temperature=temperature)
    gain = gold & valid
  else:
    at, _ = ranking.top_k(gold.astype(scores.dtype), k=min(max_gold, n))
    r = soft_ranks(scores, where=real, temperature=temperature, at=at)
    gain = jnp.take_along_axis(gold & valid, at, axis=-1)
  cut = jnp.ones_like(r) if k is None else soft_cutoff(r, k=k, temperature=ct)
  dcg = jnp.sum(jnp.where(gain, cut / jnp.log2(1.0 + r), 0.0), axis=-1)
  idcg = _ideal_dcg(jnp.sum(gold, axis=-1), k, n, scores.dtype)
  return jnp.where(idcg > 0, dcg / jnp.where(idcg > 0, idcg, 1.0), 0.0)


def gap_scale(scores: Array, *, k: int, where: Array | None = None, floor: float = 1e-8) -> Array:
  r"""Mean gap between consecutive scores in a list's top ``k + 1``: :math:`(s_{(1)} - s_{(k+1)}) / k`.

  A per-list unit for temperatures (so ``temperature = tau * gap_scale`` is scale-free), with its
  gradient stopped. Lists with fewer than ``k + 1`` finite scores use the lowest finite one; the result
  is at least ``floor`` (an all-masked or constant list gets ``floor``).

  Returns:
    ``[...]`` positive scales.
  """
  scores = jax.lax.stop_gradient(jnp.asarray(scores))
  valid = _valid(scores, where)
  m = min(k + 1, scores.shape[-1])
  _, vals = ranking.top_k(jnp.where(valid, scores, -jnp.inf), k=m)
  finite = jnp.isfinite(vals)
  top = jnp.where(finite[..., 0], vals[..., 0], 0.0)
  low = jnp.min(jnp.where(finite, vals, jnp.inf), axis=-1)
  low = jnp.where(jnp.isfinite(low), low, top)
  count = jnp.maximum(jnp.sum(finite, axis=-1) - 1, 1)
  return jnp.maximum((top - low) / count, floor)
