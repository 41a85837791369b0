"""CFS (Conditional Field Subtraction): greedy picks under a summed Gaussian coverage field.

Hard: :func:`cfs_select` (argmax steps; what is scored). Soft twin: :func:`soft_cfs_select_gram`, each argmax
relaxed to a softmax over the precomputed cosine pool (fitting ``beta`` and ``sigma`` only). The leg turns picks into
RRF leg scores (:func:`engram_jax.ops.greedy.selection_scores`), so CFS is used inside an RRF fusion.
"""

from __future__ import annotations

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

# The declaration of CFS's knobs: the one place their defaults are written (signatures below read _D).
KNOBS = (
  Knob('k', 10, static=True, check='int>=1', doc='number of picks'),
  Knob('beta', 0.20, transform='log', check='>0', doc='field strength'),
  Knob('sigma', 0.40, transform='log', check='>0', doc='a Gaussian width'),
  Knob('floor', 1e-6, static=True, check='>0', doc='cosine floor under the log'),
  Knob('pool', None, static=True, check='int>=1', doc='cosine prefilter (None = all items)'),
)
_D = knob_defaults(KNOBS)


def cfs_select(
  query: Array,
  docs: Array,
  *,
  k: int,
  beta: ArrayLike = _D['beta'],
  sigma: ArrayLike = _D['sigma'],
  where: Array | None = None,
  floor: float = _D['floor'],
  pool: int | None = None,
  gram: Array | None = None,
) -> Selection:
  r"""Conditional Field Subtraction: greedy picks under a summed Gaussian coverage field.

  Definition:
    .. math::
      c_t = \arg\max_{c \notin S_{t-1}} \log \max(\cos(q, c), \epsilon)
            - \beta \sum_{s \in S_{t-1}} \exp(-\|c - s\|^2 / 2\sigma^2)

    with :math:`c_1 = \arg\max_c \cos(q, c)` (the field is 0 while :math:`S` is empty).

  The floor :math:`\epsilon` exists because cosine can be <= 0, where the log is undefined: every
  candidate with cosine <= ``floor`` gets the same log-relevance :math:`\log \epsilon`
  (-13.8 for the default 1e-6), far below any positive-cosine candidate, so such candidates are
  only picked once the positive ones are exhausted or heavily covered. The first pick uses the raw
  cosine, so it is the most relevant candidate even when every cosine is below the floor.
  :math:`\|c - s\|^2` is computed as :math:`\|c\|^2 + \|s\|^2 - 2\langle c, s\rangle` (clipped at 0).

  Args:
    query: ``[..., D]`` unit-norm query; leading axes are batch.
    docs: ``[N, D]`` or ``[..., N, D]`` unit-norm candidates.
    k: number of picks; static (sets a shape). ``k > N`` pads with -1.
    beta, sigma: penalty strength and bandwidth (defaults: the knobs); traced, so they can be fit.
    where: ``[N]`` or ``[..., N]`` True for real candidates; padded ones are never picked.
    floor: epsilon under the log, since cosine can be <= 0.
    pool: optional static cosine top-``pool`` prefilter (``pool >= N`` means all).
    gram: optional ``[N, N]`` precomputed ``docs @ docs.T``.

  Returns:
    :class:`Selection`: ``indices [..., K]`` (ties go to the later item) and ``scores [..., K]``
    (the CFS objective at each pick).

  Not differentiable (argmax); ``soft_cfs_select`` (to come) is its relaxed twin.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import cfs_select
    >>> docs = jnp.array([[1.0, 0.0], [0.995, 0.0998], [0.6, 0.8]])
    >>> print(cfs_select(jnp.array([0.8, 0.6]), docs, k=3, beta=2.0, sigma=0.4).indices)
    [2 0 1]
  """
  validation.check_embeddings('cfs_select', query, docs)
  check_knobs('cfs', 'cfs_select', k=k, beta=beta, sigma=sigma, floor=floor, pool=pool)

  def one(q, d, wh, g):
    rel, valid, idx, sq, sims = pool_inputs(q, d, wh, g, pool)
    beta_ = jnp.asarray(beta, rel.dtype)
    sigma_ = jnp.asarray(sigma, rel.dtype)
    logf = jnp.log(jnp.maximum(rel, jnp.asarray(floor, rel.dtype)))
    objective = lambda field, count: logf - beta_ * field

    def sims_and_norm(pos):  # <c, s_new> for every pool item c, and ||s_new||^2
      return sims(pos), sq[pos]

    def update(field, s_and_norm, count):
      del count
      s, pick_sq = s_and_norm
      d2 = jnp.maximum(sq + pick_sq - 2.0 * s, 0.0)
      return field + jnp.exp(-d2 / (2.0 * sigma_**2))

    return greedy(rel, valid, idx, sims_and_norm, k=k, init=jnp.zeros_like(rel), objective=objective, update=update)

  return map_queries(one, query, docs, where, gram)


def soft_cfs_select_gram(
  rel: Array,
  gram: Array,
  *,
  k: int,
  beta: ArrayLike = _D['beta'],
  sigma: ArrayLike = _D['sigma'],
  temperature: ArrayLike = 0.1,
  where: Array | None = None,
  floor: float = _D['floor'],
) -> SoftSelection:
  r"""Relaxed CFS from relevance ``rel [..., P]`` and item inner products ``gram [..., P, P]``.

  The relaxed field after picks :math:`p_1..p_t` is :math:`\sum_{u \le t} K p_u` with
  :math:`K_{cj} = \exp(-\|c - j\|^2 / 2\sigma^2)`, the hard field when every :math:`p_u` is one-hot.
  See :func:`soft_greedy`. Differentiable in ``rel``, ``gram``, ``beta``, ``sigma`` and ``temperature``
  (objective units, i.e. log-relevance; scalar or ``[...]``).
  """
  rel = jnp.asarray(rel)
  where = jnp.ones(rel.shape, bool) if where is None else jnp.broadcast_to(jnp.asarray(where, bool), rel.shape)
  batch = rel.shape[:-1]
  temperature = jnp.broadcast_to(jnp.asarray(temperature, rel.dtype), batch)

  def one(r, g, wh, t):
    beta_ = jnp.asarray(beta, r.dtype)
    sigma_ = jnp.asarray(sigma, r.dtype)
    logf = jnp.log(jnp.maximum(r, jnp.asarray(floor, r.dtype)))
    sq = jnp.diagonal(g)
    kern = jnp.exp(-jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0) / (2.0 * sigma_**2))
    kern = jnp.where(wh[None, :], kern, 0.0)
    objective = lambda field, count: logf - beta_ * field
    update = lambda field, pk, count: field + kern @ pk
    probs, scores = soft_greedy(r, wh, k=k, temperature=t, init=jnp.zeros_like(r), objective=objective, update=update)
    return SoftSelection(probs, scores)

  return map_pool_batch(one, rel, gram, where, temperature)


def soft_cfs_select(
  query: Array,
  docs: Array,
  *,
  k: int,
  beta: ArrayLike = _D['beta'],
  sigma: ArrayLike = _D['sigma'],
  temperature: ArrayLike = 0.1,
  where: Array | None = None,
  floor: float = _D['floor'],
  pool: int | None = None,
  gram: Array | None = None,
  batch_size: int | None = None,
) -> SoftSelection:
  r"""Relaxed twin of :func:`cfs_select` (softmax-relaxed greedy steps, see :func:`soft_cfs_select_gram`).

  Args: as :func:`cfs_select`, plus ``temperature`` (in log-relevance units, scalar; traced) and
    ``batch_size``.

  Returns:
    :class:`SoftSelection` with ``probs [..., K, N]``; tends to the hard picks as ``temperature -> 0``.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import cfs_select, soft_cfs_select
    >>> docs = jnp.array([[1.0, 0.0], [0.995, 0.0998], [0.6, 0.8]])
    >>> soft = soft_cfs_select(jnp.array([0.8, 0.6]), docs, k=3, beta=2.0, sigma=0.4, temperature=1e-3)
    >>> bool((soft.probs.argmax(-1) == cfs_select(jnp.array([0.8, 0.6]), docs, k=3, beta=2.0, sigma=0.4).indices).all())
    True
  """
  validation.check_embeddings('soft_cfs_select', query, docs)
  check_knobs('cfs', 'soft_cfs_select', k=k, beta=beta, sigma=sigma, floor=floor, pool=pool)
  validation.check_value(temperature, 'temperature', where='soft_cfs_select', check='>0')

  def one(q, d, wh, g):
    rel, gp, valid, idx = soft_pool_inputs(q, d, wh, g, pool)
    sel = soft_cfs_select_gram(rel, gp, k=k, beta=beta, sigma=sigma, temperature=temperature, where=valid, floor=floor)
    return SoftSelection(scatter_probs(sel.probs, idx, d.shape[0]), sel.scores)

  return map_queries(one, query, docs, where, gram, batch_size=batch_size)


def cfs_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  k: int = _D['k'],
  beta: float = _D['beta'],
  sigma: float = _D['sigma'],
  floor: float = _D['floor'],
  pool: int | None = _D['pool'],
) -> Array:
  """CFS picks as leg scores ``[Q, N]``; item similarities from the episode Gram up to
  :data:`engram_jax.ops.greedy.GRAM_ITEMS` items, from the pooled rows above it (never N x N)."""
  del key
  sel = cfs_select(
    ep.queries, ep.docs, k=k, beta=beta, sigma=sigma, where=ep.where, floor=floor, pool=pool, gram=episode_gram(ep.docs)
  )
  return selection_scores(sel, n=ep.docs.shape[0])


def _soft(rows, values, ctx) -> SoftSelection:
  """Softmax-relaxed CFS on the precomputed cosine pool (temperature: ``greedy`` x the gap scale of the pool's
  log-relevance)."""
  idx, valid, b, g = rows['pool_idx'], rows['pool_valid'], rows['pool_cos'], rows['pool_gram']
  k = int(values['k'])
  floor = float(values['floor'])
  rel = jnp.log(jnp.maximum(b, floor))
  temp = ctx.temperatures.greedy * relax.gap_scale(rel, k=k, where=valid)
  sel = soft_cfs_select_gram(
    b, g, k=k, beta=values['beta'], sigma=values['sigma'], temperature=temp, where=valid, floor=floor
  )
  return scatter_pool_selection(sel, idx, ctx.where.shape[-1])


CFS = register(
  Operator(
    name='cfs',
    leg=cfs_leg,
    doc='Conditional Field Subtraction picks',
    knobs=KNOBS,
    soft=SoftTwin(rows=pools.greedy_pool_rows, scores=_soft, selection=True),
  )
)
