"""MMR (Maximal Marginal Relevance, Carbonell & Goldstein 1998): greedy relevance minus redundancy.

Hard: :func:`mmr_select` (argmax steps; what is scored). Soft twin: :func:`soft_mmr_select_gram`, softmax-relaxed
steps on the precomputed cosine pool (fitting ``lam``). The leg turns picks into RRF leg scores
(:func:`engram_jax.ops.greedy.selection_scores`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import relax, validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops import pools
from engram_jax.ops.greedy import (
  Selection,
  SoftSelection,
  episode_gram,
  greedy,
  map_pool_batch,
  map_queries,
  pool_inputs,
  scatter_pool_selection,
  scatter_probs,
  selection_scores,
  soft_greedy,
  soft_pool_inputs,
)
from engram_jax.ops.registry import Knob, Operator, SoftTwin, check_knobs, knob_defaults, register

# The declaration of MMR's knobs: the one place their defaults are written (signatures below read _D).
KNOBS = (
  Knob('k', 10, static=True, check='int>=1', doc='number of picks'),
  Knob('lam', 0.5, transform='logit', check='[0,1]', doc='MMR relevance/diversity trade-off'),
  Knob('pool', None, static=True, check='int>=1', doc='cosine prefilter (None = all items)'),
)
_D = knob_defaults(KNOBS)


def mmr_select(
  query: Array,
  docs: Array,
  *,
  k: int,
  lam: ArrayLike = _D['lam'],
  where: Array | None = None,
  pool: int | None = None,
  gram: Array | None = None,
) -> Selection:
  r"""Maximal Marginal Relevance (Carbonell & Goldstein 1998), greedy.

  Definition:
    .. math::
      c_t = \arg\max_{c \notin S_{t-1}} \lambda \cos(q, c)
            - (1 - \lambda) \max_{s \in S_{t-1}} \cos(c, s)

    with :math:`c_1 = \arg\max_c \cos(q, c)` (the penalty is 0 while :math:`S` is empty).

  Args:
    query: ``[..., D]`` unit-norm queries; leading axes are batch.
    docs: ``[N, D]`` or ``[..., N, D]`` unit-norm candidates.
    k: number of picks; static. ``k > N`` pads with -1.
    lam: relevance / diversity trade-off in [0, 1]; traced.
    where: ``[N]`` or ``[..., N]`` True for real candidates; masked ones are never picked.
    pool: optional static prefilter: only the cosine top-``pool`` real candidates are considered
      (``pool >= N`` means all).
    gram: optional ``[N, N]`` (or ``[..., N, N]``) precomputed ``docs @ docs.T``; item-item
      similarities are then gathered instead of recomputed.

  Returns:
    :class:`Selection` with ``indices [..., K]`` (ties go to the later item) and ``scores [..., K]``
    (the MMR objective at each pick; the first is :math:`\lambda \cos(q, c_1)`).

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import mmr_select
    >>> docs = jnp.array([[1.0, 0.0], [0.995, 0.0998], [0.0, 1.0]])  # item 1 nearly repeats item 0
    >>> sel = mmr_select(jnp.array([0.8, 0.6]), docs, k=2, lam=0.5)
    >>> print(sel.indices)  # item 1 first (most relevant); item 0, a near-copy of it, loses to item 2
    [1 2]
  """
  validation.check_embeddings('mmr_select', query, docs)
  check_knobs('mmr', 'mmr_select', k=k, lam=lam, pool=pool)

  def one(q, d, wh, g):
    rel, valid, idx, _, sims = pool_inputs(q, d, wh, g, pool)
    lam_ = jnp.asarray(lam, rel.dtype)
    objective = lambda state, count: lam_ * rel - (1 - lam_) * jnp.where(count > 0, state, 0.0)
    update = lambda state, s, count: jnp.where(count > 0, jnp.maximum(state, s), s)
    return greedy(rel, valid, idx, sims, k=k, init=jnp.zeros_like(rel), objective=objective, update=update)

  return map_queries(one, query, docs, where, gram)


def soft_mmr_select_gram(
  rel: Array,
  gram: Array,
  *,
  k: int,
  lam: ArrayLike = _D['lam'],
  temperature: ArrayLike = 0.01,
  where: Array | None = None,
) -> SoftSelection:
  r"""Relaxed MMR from relevance ``rel [..., P]`` and item similarities ``gram [..., P, P]``.

  The relaxed penalty after picks :math:`p_1..p_t` is :math:`\max_{u \le t} G p_u` (elementwise), the
  hard :math:`\max_{s \in S} \cos(c, s)` when every :math:`p_u` is one-hot. See :func:`soft_greedy`.
  Differentiable in ``rel``, ``gram``, ``lam`` and ``temperature`` (objective units; scalar or ``[...]``).
  """
  rel = jnp.asarray(rel)
  where = jnp.ones(rel.shape, bool) if where is None else jnp.broadcast_to(jnp.asarray(where, bool), rel.shape)
  batch = rel.shape[:-1]
  temperature = jnp.broadcast_to(jnp.asarray(temperature, rel.dtype), batch)

  def one(r, g, wh, t):
    lam_ = jnp.asarray(lam, r.dtype)
    r = jnp.where(wh, r, 0.0)  # padded slots may hold -inf; lam * -inf would poison d/d lam with 0 * inf = NaN
    objective = lambda state, count: lam_ * r - (1 - lam_) * jnp.where(count > 0, state, 0.0)
    update = lambda state, pk, count: jnp.where(count > 0, jnp.maximum(state, g @ pk), g @ pk)
    probs, scores = soft_greedy(r, wh, k=k, temperature=t, init=jnp.zeros_like(r), objective=objective, update=update)
    return SoftSelection(probs, scores)

  return map_pool_batch(one, rel, gram, where, temperature)


def soft_mmr_select(
  query: Array,
  docs: Array,
  *,
  k: int,
  lam: ArrayLike = _D['lam'],
  temperature: ArrayLike = 0.01,
  where: Array | None = None,
  pool: int | None = None,
  gram: Array | None = None,
  batch_size: int | None = None,
) -> SoftSelection:
  r"""Relaxed twin of :func:`mmr_select` (softmax-relaxed greedy steps, see :func:`soft_mmr_select_gram`).

  Args: as :func:`mmr_select`, plus ``temperature`` (objective units, scalar; traced) and ``batch_size``.

  Returns:
    :class:`SoftSelection` with ``probs [..., K, N]``. As ``temperature -> 0`` (no ties), ``probs`` tends to
    the one-hot of the hard picks and ``scores`` to the hard scores.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import mmr_select, soft_mmr_select
    >>> docs = jnp.array([[1.0, 0.0], [0.995, 0.0998], [0.0, 1.0]])
    >>> soft = soft_mmr_select(jnp.array([0.8, 0.6]), docs, k=2, lam=0.5, temperature=1e-3)
    >>> print(soft.probs.argmax(-1), mmr_select(jnp.array([0.8, 0.6]), docs, k=2, lam=0.5).indices)  # cold: the hard picks
    [1 2] [1 2]
  """
  validation.check_embeddings('soft_mmr_select', query, docs)
  check_knobs('mmr', 'soft_mmr_select', k=k, lam=lam, pool=pool)
  validation.check_value(temperature, 'temperature', where='soft_mmr_select', check='>0')

  def one(q, d, wh, g):
    rel, gp, valid, idx = soft_pool_inputs(q, d, wh, g, pool)
    sel = soft_mmr_select_gram(rel, gp, k=k, lam=lam, temperature=temperature, where=valid)
    return SoftSelection(scatter_probs(sel.probs, idx, d.shape[0]), sel.scores)

  return map_queries(one, query, docs, where, gram, batch_size=batch_size)


def mmr_leg(
  ep: EpisodeArrays, key: Array, *, k: int = _D['k'], lam: float = _D['lam'], pool: int | None = _D['pool']
) -> Array:
  """MMR picks as leg scores ``[Q, N]`` (picked items ranked in pick order, others ``-inf``); item similarities
  from the episode Gram up to :data:`engram_jax.ops.greedy.GRAM_ITEMS` items, from the pooled rows above it."""
  del key
  sel = mmr_select(ep.queries, ep.docs, k=k, lam=lam, where=ep.where, pool=pool, gram=episode_gram(ep.docs))
  return selection_scores(sel, n=ep.docs.shape[0])


def _soft(rows, values, ctx) -> SoftSelection:
  """Softmax-relaxed MMR on the precomputed cosine pool (temperature: ``greedy`` x the pool's gap scale x the
  stop-gradient lambda, so that it is in objective units)."""
  idx, valid, b, g = rows['pool_idx'], rows['pool_valid'], rows['pool_cos'], rows['pool_gram']
  k = int(values['k'])
  temp = ctx.temperatures.greedy * relax.gap_scale(b, k=k, where=valid) * jax.lax.stop_gradient(values['lam'])
  sel = soft_mmr_select_gram(b, g, k=k, lam=values['lam'], temperature=temp, where=valid)
  return scatter_pool_selection(sel, idx, ctx.where.shape[-1])


MMR = register(
  Operator(
    name='mmr',
    leg=mmr_leg,
    doc='Maximal Marginal Relevance picks',
    knobs=KNOBS,
    soft=SoftTwin(rows=pools.greedy_pool_rows, scores=_soft, selection=True),
  )
)
