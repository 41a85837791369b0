"""Greedy diversity selection: MMR and Conditional Field Subtraction (CFS).

Both operators are greedy: K steps of ``lax.scan``, each picking the argmax of an objective over the
not-yet-picked real candidates. Ties inside the argmax follow the shared rule of
:mod:`engram_jax.ranking`: among equal objective values the later item (larger index along the
list axis, i.e. the more recently written one) wins. The first pick of both operators is the most
relevant candidate (cosine to the query).

Embeddings are assumed unit-norm, so cosine is the inner product (as in
:func:`engram_jax.similarity.cosine_scores`).

Batching: ``query`` may carry leading batch axes ``[..., D]``; ``docs`` is ``[N, D]`` (shared by all
queries) or ``[..., N, D]`` (one list per batch entry); ``where`` and ``gram`` likewise. Batch axes
broadcast and are mapped with ``jax.vmap``.

Not differentiable (argmax); the relaxed twins ``soft_mmr_select`` / ``soft_cfs_select`` (below) are for
fitting only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax import ranking


class Selection(NamedTuple):
  """The picks of a greedy operator, in pick order.

  Attributes:
    indices: ``[..., K]`` int32 item indices; -1 where fewer than K real candidates were left.
    scores: ``[..., K]`` the objective value at each pick; ``-inf`` where the index is -1.
  """

  indices: Array
  scores: Array


# ----------------------------------------------------------------------------------------------
# Batching helper shared by the per-query operators (also used by engram_jax.reconstruction).


def _map_queries(fn: Callable[..., object], query: Array, docs: Array, where: Array | None,
                 gram: Array | None, *, batch_size: int | None = None):
  """Applies ``fn(q [D], docs [N, D], where [N], gram [N, N] | None)`` over broadcast batch axes.

  Arguments without batch axes are shared (``in_axes=None``) rather than broadcast, so a shared
  ``docs [N, D]`` is never copied per query. With ``batch_size`` the flattened batch is processed
  that many entries at a time (``lax.map``), otherwise all at once (``vmap``). Returns ``fn``'s
  outputs with the batch shape prepended.
  """
  query = jnp.asarray(query)
  docs = jnp.asarray(docs)
  if query.ndim < 1 or docs.ndim < 2:
    raise ValueError(f'Shape mismatch: query {query.shape} must be [..., D] and docs {docs.shape} [..., N, D]')
  n, d = docs.shape[-2:]
  if query.shape[-1] != d:
    raise ValueError(f'Shape mismatch: query dim {query.shape[-1]} != docs dim {d}')
  where = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
  if where.shape[-1] != n:
    raise ValueError(f'Shape mismatch: where {where.shape} vs N={n}')
  if gram is not None:
    gram = jnp.asarray(gram)
    if gram.shape[-2:] != (n, n):
      raise ValueError(f'Shape mismatch: gram {gram.shape} vs N={n}')

  parts = [(query, 1), (docs, 2), (where, 1)] + ([(gram, 2)] if gram is not None else [])
  batch = jnp.broadcast_shapes(*[x.shape[:x.ndim - core] for x, core in parts])
  size = 1
  for s in batch:
    size *= s

  args, axes = [], []
  for i, (x, core) in enumerate(parts):
    if x.ndim == core and i > 0:  # shared across the batch (the query is always mapped)
      args.append(x)
      axes.append(None)
    else:
      x = jnp.broadcast_to(x, batch + x.shape[x.ndim - core:])
      args.append(x.reshape((size,) + x.shape[len(batch):]))
      axes.append(0)
  if gram is None:
    args.append(None)
    axes.append(None)
  if batch_size is None or size <= 1:
    out = jax.vmap(fn, in_axes=tuple(axes))(*args)
  else:
    mapped = [a for a, ax in zip(args, axes) if ax == 0]

    def fn_mapped(xs):
      it = iter(xs)
      return fn(*[next(it) if ax == 0 else a for a, ax in zip(args, axes)])

    out = jax.lax.map(fn_mapped, mapped, batch_size=min(batch_size, size))
  return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


def _pool(rel: Array, where: Array, pool: int | None) -> tuple[Array, Array]:
  """Candidate pool: all items, or the cosine top-``pool`` under the shared tie rule.

  Returns ``(idx [P], valid [P])``; ``valid`` is False for pool slots filled by masked items
  (fewer real items than ``pool``). ``pool >= N`` is the whole list.
  """
  n = rel.shape[-1]
  if pool is None or pool >= n:
    return jnp.arange(n, dtype=jnp.int32), where
  if pool < 1:
    raise ValueError(f'pool must be >= 1, got {pool}')
  idx, _ = ranking.top_k(rel, k=pool, where=where)
  return idx, where[idx]


def _argmax_later(crit: Array, eligible: Array, orig: Array) -> tuple[Array, Array]:
  """Position of the max of ``crit`` over ``eligible``; ties go to the larger original index.

  Returns ``(pos, any_eligible)``; ``pos`` is meaningless when nothing is eligible.
  """
  c = jnp.where(eligible, crit, -jnp.inf)
  best = jnp.max(c)
  hit = eligible & (c == best)
  pos = jnp.argmax(jnp.where(hit, orig, -1))
  return pos, jnp.any(eligible)


def _greedy(rel: Array, valid: Array, orig: Array, sims: Callable[[Array], Array], *, k: int,
            init: Array, objective: Callable[[Array, Array, Array], Array],
            update: Callable[[Array, Array, Array], Array]) -> Selection:
  """Generic greedy loop over a pool of P candidates.

  Args:
    rel: ``[P]`` relevance (cosine to the query); the first pick maximises it.
    valid: ``[P]`` real candidates.
    orig: ``[P]`` original indices (ties and outputs).
    sims: ``pos -> info`` about pool item ``pos`` for the update (e.g. its inner products ``[P]``
      with every pool item).
    init: ``[P]`` initial penalty state.
    objective: ``(state, count) -> [P]`` objective given the penalty state and number of picks.
    update: ``(state, info, count) -> state`` after a pick (``count`` = picks before this one).
  """
  p = rel.shape[-1]

  def step(carry, t):
    picked, state, count = carry
    eligible = valid & ~picked
    obj = objective(state, count)
    crit = jnp.where(t == 0, rel, obj)
    pos, ok = _argmax_later(crit, eligible, orig)
    score = jnp.where(ok, obj[pos], -jnp.inf)
    index = jnp.where(ok, orig[pos], -1).astype(jnp.int32)
    new_state = update(state, sims(pos), count)
    state = jnp.where(ok, new_state, state)
    picked = picked | (ok & (jnp.arange(p) == pos))
    count = count + ok.astype(count.dtype)
    return (picked, state, count), (index, score)

  carry = (jnp.zeros((p,), bool), init, jnp.zeros((), jnp.int32))
  _, (indices, scores) = jax.lax.scan(step, carry, jnp.arange(k))
  return Selection(indices, scores)


def _pool_inputs(q, docs, where, gram, pool):
  """Relevance, pool, and pool-level similarity accessors for one query."""
  rel_all = docs @ q
  idx, valid = _pool(rel_all, where, pool)
  rel = rel_all[idx]
  if gram is not None:
    sq = jnp.diagonal(gram)[idx]
    sims = lambda pos: gram[idx[pos], idx]
  else:
    c = docs[idx]
    sq = jnp.sum(c * c, axis=-1)
    sims = lambda pos: c @ c[pos]
  return rel, valid, idx, sq, sims


# ----------------------------------------------------------------------------------------------
# Public operators.


def mmr_select(query: Array, docs: Array, *, k: int, lam: ArrayLike = 0.5, where: Array | None = None,
               pool: int | None = None, gram: Array | None = None) -> Selection:
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
  """
  def one(q, d, wh, g):
    rel, valid, idx, _, sims = _pool_inputs(q, d, wh, g, pool)
    lam_ = jnp.asarray(lam, rel.dtype)
    objective = lambda state, count: lam_ * rel - (1 - lam_) * jnp.where(count > 0, state, 0.0)
    update = lambda state, s, count: jnp.where(count > 0, jnp.maximum(state, s), s)
    return _greedy(rel, valid, idx, sims, k=k, init=jnp.zeros_like(rel), objective=objective,
                   update=update)

  return _map_queries(one, query, docs, where, gram)


def cfs_select(query: Array, docs: Array, *, k: int, beta: ArrayLike = 0.20, sigma: ArrayLike = 0.40,
               where: Array | None = None, floor: float = 1e-6, pool: int | None = None,
               gram: Array | None = None) -> Selection:
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
    beta, sigma: penalty strength and bandwidth (0.20, 0.40); traced, so they can be fit.
    where: ``[N]`` or ``[..., N]`` True for real candidates; padded ones are never picked.
    floor: epsilon under the log, since cosine can be <= 0.
    pool: optional static cosine top-``pool`` prefilter (``pool >= N`` means all).
    gram: optional ``[N, N]`` precomputed ``docs @ docs.T``.

  Returns:
    :class:`Selection`: ``indices [..., K]`` (ties go to the later item) and ``scores [..., K]``
    (the CFS objective at each pick).

  Not differentiable (argmax); ``soft_cfs_select`` (to come) is its relaxed twin.
  """
  def one(q, d, wh, g):
    rel, valid, idx, sq, sims = _pool_inputs(q, d, wh, g, pool)
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
      return field + jnp.exp(-d2 / (2.0 * sigma_ ** 2))

    return _greedy(rel, valid, idx, sims_and_norm, k=k, init=jnp.zeros_like(rel),
                   objective=objective, update=update)

  return _map_queries(one, query, docs, where, gram)


def selection_scores(selection: Selection, *, n: int) -> Array:
  r"""Turns greedy picks into leg scores, so that a greedy operator can be an RRF leg.

  Definition:
    .. math:: s_i = K - j \text{ if item } i \text{ is pick } j \text{ (0-based)}, \quad -\infty \text{ otherwise}

  Args:
    selection: a :class:`Selection` with ``indices [..., K]`` (-1 entries are ignored).
    n: list length N; static.

  Returns:
    ``[..., N]`` scores: the first pick scores K, the last 1, unpicked items ``-inf``
    (which :func:`engram_jax.fusion.rrf_fuse` reads as "not ranked by this leg").
  """
  idx = jnp.asarray(selection.indices)
  k = idx.shape[-1]
  vals = (k - jnp.arange(k)).astype(jnp.result_type(float))
  hit = idx[..., :, None] == jnp.arange(n)  # [..., K, N]; -1 matches nothing
  return jnp.max(jnp.where(hit, vals[:, None], -jnp.inf), axis=-2)


# ----------------------------------------------------------------------------------------------
# Soft twins (for fitting only; the hard operators above are what is scored).


class SoftSelection(NamedTuple):
  """Relaxed greedy picks.

  Attributes:
    probs: ``[..., K, N]`` pick distributions: row t is the softmax-relaxed one-hot of pick t (sums to 1,
      or to 0 where no real candidate was left).
    scores: ``[..., K]`` the expected objective value at each pick.
  """

  probs: Array
  scores: Array


def _soft_greedy(rel: Array, valid: Array, *, k: int, temperature: Array, init: Array,
                 objective: Callable[[Array, Array], Array],
                 update: Callable[[Array, Array, Array], Array]) -> tuple[Array, Array]:
  r"""Softmax-relaxed greedy loop over a pool of P candidates (the relaxed twin of :func:`_greedy`).

  Step t: :math:`p_t = \mathrm{softmax}(o_t / T + \log(1 - m_t))` over the eligible candidates, where
  :math:`o_t` is the objective under the relaxed state (relevance at t = 0), :math:`m_t = \sum_{u<t} p_u`
  the mass already picked (clipped at 1e-6 under the log), and eligible excludes the hard picks so far
  (the argmax of :math:`o_u`, shared tie rule), so that as :math:`T \to 0` every :math:`p_t` is the
  hard one-hot pick and the state the hard state. The state update takes the pick distribution:
  ``update(state, p, t)``.

  Returns:
    ``(probs [K, P], scores [K])``.
  """
  p_n = rel.shape[-1]
  orig = jnp.arange(p_n)

  def step(carry, t):
    hard, mass, state = carry
    eligible = valid & ~hard
    obj = objective(state, t)
    crit = jnp.where(t == 0, rel, obj)
    logits = crit / temperature + jnp.log(jnp.clip(1.0 - mass, 1e-6, 1.0))
    top = jnp.max(jnp.where(eligible, logits, -jnp.inf))
    top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
    # ineligible entries are set to the max before exp (not to 0: exp(0 - max) can overflow, and an inf
    # behind a where still poisons the gradient with inf * 0 = NaN)
    e = jnp.where(eligible, jnp.exp(jnp.where(eligible, logits, top) - top), 0.0)
    z = jnp.sum(e)
    p = e / jnp.where(z > 0, z, 1.0)
    pos, ok = _argmax_later(crit, eligible, orig)
    hard = hard | (ok & (orig == pos))
    score = jnp.where(ok, jnp.sum(jnp.where(eligible, p * obj, 0.0)), -jnp.inf)
    state = jnp.where(ok, update(state, p, t), state)
    return (hard, mass + p, state), (p, score)

  carry = (jnp.zeros((p_n,), bool), jnp.zeros_like(rel), init)
  _, (probs, scores) = jax.lax.scan(step, carry, jnp.arange(k))
  return probs, scores


def _soft_pool_inputs(q, docs, where, gram, pool):
  rel_all = docs @ q
  idx, valid = _pool(rel_all, where, pool)
  if gram is not None:
    g = gram[idx[:, None], idx[None, :]]
  else:
    c = docs[idx]
    g = c @ c.T
  return rel_all[idx], g, valid, idx


def _scatter_probs(probs: Array, idx: Array, n: int) -> Array:
  return jnp.zeros(probs.shape[:-1] + (n,), probs.dtype).at[..., idx].add(probs, unique_indices=True)


def _map_pool_batch(one: Callable[..., SoftSelection], rel: Array, gram: Array, where: Array,
                    temperature: Array) -> SoftSelection:
  """Apply ``one(rel [P], gram [P, P], where [P], temperature [])`` over the leading batch axes of ``rel``."""
  batch, p = rel.shape[:-1], rel.shape[-1]
  g = jnp.broadcast_to(jnp.asarray(gram, rel.dtype), batch + (p, p))
  flat = lambda x: x.reshape((-1,) + x.shape[len(batch):]) if batch else x[None]
  out = jax.vmap(one)(flat(rel), flat(g), flat(where), temperature.reshape(-1))
  return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


def soft_mmr_select_gram(rel: Array, gram: Array, *, k: int, lam: ArrayLike = 0.5,
                         temperature: ArrayLike = 0.01, where: Array | None = None) -> SoftSelection:
  r"""Relaxed MMR from relevance ``rel [..., P]`` and item similarities ``gram [..., P, P]``.

  The relaxed penalty after picks :math:`p_1..p_t` is :math:`\max_{u \le t} G p_u` (elementwise), the
  hard :math:`\max_{s \in S} \cos(c, s)` when every :math:`p_u` is one-hot. See :func:`_soft_greedy`.
  Differentiable in ``rel``, ``gram``, ``lam`` and ``temperature`` (objective units; scalar or ``[...]``).
  """
  rel = jnp.asarray(rel)
  where = jnp.ones(rel.shape, bool) if where is None else jnp.broadcast_to(jnp.asarray(where, bool), rel.shape)
  batch = rel.shape[:-1]
  p = rel.shape[-1]
  temperature = jnp.broadcast_to(jnp.asarray(temperature, rel.dtype), batch)

  def one(r, g, wh, t):
    lam_ = jnp.asarray(lam, r.dtype)
    objective = lambda state, count: lam_ * r - (1 - lam_) * jnp.where(count > 0, state, 0.0)
    update = lambda state, pk, count: jnp.where(count > 0, jnp.maximum(state, g @ pk), g @ pk)
    probs, scores = _soft_greedy(r, wh, k=k, temperature=t, init=jnp.zeros_like(r), objective=objective,
                                 update=update)
    return SoftSelection(probs, scores)

  return _map_pool_batch(one, rel, gram, where, temperature)


def soft_cfs_select_gram(rel: Array, gram: Array, *, k: int, beta: ArrayLike = 0.20, sigma: ArrayLike = 0.40,
                         temperature: ArrayLike = 0.1, where: Array | None = None,
                         floor: float = 1e-6) -> SoftSelection:
  r"""Relaxed CFS from relevance ``rel [..., P]`` and item inner products ``gram [..., P, P]``.

  The relaxed field after picks :math:`p_1..p_t` is :math:`\sum_{u \le t} K p_u` with
  :math:`K_{cj} = \exp(-\|c - j\|^2 / 2\sigma^2)`, the hard field when every :math:`p_u` is one-hot.
  See :func:`_soft_greedy`. Differentiable in ``rel``, ``gram``, ``beta``, ``sigma`` and ``temperature``
  (objective units, i.e. log-relevance; scalar or ``[...]``).
  """
  rel = jnp.asarray(rel)
  where = jnp.ones(rel.shape, bool) if where is None else jnp.broadcast_to(jnp.asarray(where, bool), rel.shape)
  batch = rel.shape[:-1]
  p = rel.shape[-1]
  temperature = jnp.broadcast_to(jnp.asarray(temperature, rel.dtype), batch)

  def one(r, g, wh, t):
    beta_ = jnp.asarray(beta, r.dtype)
    sigma_ = jnp.asarray(sigma, r.dtype)
    logf = jnp.log(jnp.maximum(r, jnp.asarray(floor, r.dtype)))
    sq = jnp.diagonal(g)
    kern = jnp.exp(-jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0) / (2.0 * sigma_ ** 2))
    kern = jnp.where(wh[None, :], kern, 0.0)
    objective = lambda field, count: logf - beta_ * field
    update = lambda field, pk, count: field + kern @ pk
    probs, scores = _soft_greedy(r, wh, k=k, temperature=t, init=jnp.zeros_like(r), objective=objective,
                                 update=update)
    return SoftSelection(probs, scores)

  return _map_pool_batch(one, rel, gram, where, temperature)


def soft_mmr_select(query: Array, docs: Array, *, k: int, lam: ArrayLike = 0.5, temperature: ArrayLike = 0.01,
                    where: Array | None = None, pool: int | None = None, gram: Array | None = None,
                    batch_size: int | None = None) -> SoftSelection:
  r"""Relaxed twin of :func:`mmr_select` (softmax-relaxed greedy steps, see :func:`soft_mmr_select_gram`).

  Args: as :func:`mmr_select`, plus ``temperature`` (objective units, scalar; traced) and ``batch_size``.

  Returns:
    :class:`SoftSelection` with ``probs [..., K, N]``. As ``temperature -> 0`` (no ties), ``probs`` tends to
    the one-hot of the hard picks and ``scores`` to the hard scores.
  """
  def one(q, d, wh, g):
    rel, gp, valid, idx = _soft_pool_inputs(q, d, wh, g, pool)
    sel = soft_mmr_select_gram(rel, gp, k=k, lam=lam, temperature=temperature, where=valid)
    return SoftSelection(_scatter_probs(sel.probs, idx, d.shape[0]), sel.scores)

  return _map_queries(one, query, docs, where, gram, batch_size=batch_size)


def soft_cfs_select(query: Array, docs: Array, *, k: int, beta: ArrayLike = 0.20, sigma: ArrayLike = 0.40,
                    temperature: ArrayLike = 0.1, where: Array | None = None, floor: float = 1e-6,
                    pool: int | None = None, gram: Array | None = None,
                    batch_size: int | None = None) -> SoftSelection:
  r"""Relaxed twin of :func:`cfs_select` (softmax-relaxed greedy steps, see :func:`soft_cfs_select_gram`).

  Args: as :func:`cfs_select`, plus ``temperature`` (in log-relevance units, scalar; traced) and
    ``batch_size``.

  Returns:
    :class:`SoftSelection` with ``probs [..., K, N]``; tends to the hard picks as ``temperature -> 0``.
  """
  def one(q, d, wh, g):
    rel, gp, valid, idx = _soft_pool_inputs(q, d, wh, g, pool)
    sel = soft_cfs_select_gram(rel, gp, k=k, beta=beta, sigma=sigma, temperature=temperature, where=valid,
                               floor=floor)
    return SoftSelection(_scatter_probs(sel.probs, idx, d.shape[0]), sel.scores)

  return _map_queries(one, query, docs, where, gram, batch_size=batch_size)
