"""Shared machinery of the greedy pickers (:mod:`engram_jax.ops.mmr`, :mod:`engram_jax.ops.cfs`) and of the
per-query operators (:mod:`engram_jax.ops.cfsr`, :mod:`engram_jax.ops.tcfsr`).

Greedy operators run K steps of ``lax.scan``, each picking the argmax of an objective over the not-yet-picked
real candidates. Ties inside the argmax follow the shared rule of :mod:`engram_jax.core.ranking`: among equal objective
values the later item (larger index along the list axis, i.e. the more recently written one) wins. The first pick
is the most relevant candidate (cosine to the query). Embeddings are unit-norm, so cosine is the inner product.

Batching: ``query`` may carry leading batch axes ``[..., D]``; ``docs`` is ``[N, D]`` (shared by all queries) or
``[..., N, D]`` (one list per batch entry); ``where`` and ``gram`` likewise. Batch axes broadcast and are mapped
with ``jax.vmap`` (or ``lax.map`` in chunks).

The soft machinery (:func:`soft_greedy`) relaxes each argmax to a softmax for fitting only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from engram_jax.core import ranking

# The largest episode (padded N) whose N x N Gram ``docs @ docs.T`` the legs compute once and gather pool blocks
# from (:func:`episode_gram`); above it each query computes its own blocks from its pooled rows, so that memory
# stays O(N D + Q P^2) instead of O(N^2) (16k items: 1 GB). The Gram costs N^2 D once, the blocks Q P^2 D; on CPU
# (CFS-R, P = 150, 64-256 queries) the blocks are as fast at N = 1,024 and 2x faster at 2,048. LoCoMo (N <= 690
# items) and LongMemEval_S (<= 616 turns) stay at or below it, so their results are those of the Gram path.
GRAM_ITEMS = 1024


class Selection(NamedTuple):
  """The picks of a greedy operator, in pick order.

  Attributes:
    indices: ``[..., K]`` int32 item indices; -1 where fewer than K real candidates were left.
    scores: ``[..., K]`` the objective value at each pick; ``-inf`` where the index is -1.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import mmr_select
    >>> sel = mmr_select(jnp.array([1.0, 0.0]), jnp.eye(2), k=3)  # k > N pads with -1
    >>> print(sel.indices)
    [ 0  1 -1]
  """

  indices: Array
  scores: Array


class SoftSelection(NamedTuple):
  """Relaxed greedy picks.

  Attributes:
    probs: ``[..., K, N]`` pick distributions: row t is the softmax-relaxed one-hot of pick t (sums to 1,
      or to 0 where no real candidate was left).
    scores: ``[..., K]`` the expected objective value at each pick.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import soft_mmr_select
    >>> soft = soft_mmr_select(jnp.array([1.0, 0.0]), jnp.eye(2), k=2, temperature=1.0)
    >>> soft.probs.shape, bool(jnp.allclose(soft.probs.sum(-1), 1.0))  # one distribution over items per pick
    ((2, 2), True)
  """

  probs: Array
  scores: Array


def map_queries(
  fn: Callable[..., object],
  query: Array,
  docs: Array,
  where: Array | None,
  gram: Array | None,
  *,
  batch_size: int | None = None,
  per_query: Sequence[Array] = (),
):
  """Applies ``fn(q [D], docs [N, D], where [N], gram [N, N] | None, *per_query values)`` over broadcast batch
  axes.

  Arguments without batch axes are shared (``in_axes=None``) rather than broadcast, so a shared
  ``docs [N, D]`` is never copied per query. With ``batch_size`` the flattened batch is processed
  that many entries at a time (``lax.map``), otherwise all at once (``vmap``). ``per_query``: arrays of the
  query's batch shape ``[...]`` (one value per query, e.g. a question-conditioned knob), mapped with the queries
  and passed to ``fn`` as scalars after ``gram``. Returns ``fn``'s outputs with the batch shape prepended.
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
  batch = jnp.broadcast_shapes(*[x.shape[: x.ndim - core] for x, core in parts])
  size = 1
  for s in batch:
    size *= s

  args, axes = [], []
  for i, (x, core) in enumerate(parts):
    if x.ndim == core and i > 0:  # shared across the batch (the query is always mapped)
      args.append(x)
      axes.append(None)
    else:
      x = jnp.broadcast_to(x, batch + x.shape[x.ndim - core :])
      args.append(x.reshape((size,) + x.shape[len(batch) :]))
      axes.append(0)
  if gram is None:
    args.append(None)
    axes.append(None)
  for x in per_query:
    x = jnp.asarray(x)
    if x.shape != query.shape[:-1]:
      raise ValueError(f"Shape mismatch: a per-query value {x.shape} vs the queries' batch {query.shape[:-1]}")
    args.append(jnp.broadcast_to(x, batch).reshape((size,)))
    axes.append(0)
  if batch_size is None or size <= 1:
    out = jax.vmap(fn, in_axes=tuple(axes))(*args)
  else:
    mapped = [a for a, ax in zip(args, axes) if ax == 0]

    def fn_mapped(xs):
      it = iter(xs)
      return fn(*[next(it) if ax == 0 else a for a, ax in zip(args, axes)])

    out = jax.lax.map(fn_mapped, mapped, batch_size=min(batch_size, size))
  return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


def episode_gram(docs: Array, *, max_items: int = GRAM_ITEMS) -> Array | None:
  """``docs @ docs.T`` (``[..., N, N]``) when ``N <= max_items`` (static), else None.

  The legs of the pool operators (CFS, MMR, CFS-R) pass it as ``gram=``: with it, each query gathers its pool's
  P x P block (cheap when many queries share a small episode); without it, each query computes the block from its
  P pooled rows (``c @ c.T``), with nothing N x N in memory. Both give the same picks up to float rounding.
  """
  docs = jnp.asarray(docs)
  if docs.shape[-2] > max_items:
    return None
  return docs @ jnp.swapaxes(docs, -1, -2)


def candidate_pool(rel: Array, where: Array, pool: int | None) -> tuple[Array, Array]:
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


def argmax_later(crit: Array, eligible: Array, orig: Array) -> tuple[Array, Array]:
  """Position of the max of ``crit`` over ``eligible``; ties go to the larger original index.

  Returns ``(pos, any_eligible)``; ``pos`` is meaningless when nothing is eligible.
  """
  c = jnp.where(eligible, crit, -jnp.inf)
  best = jnp.max(c)
  hit = eligible & (c == best)
  pos = jnp.argmax(jnp.where(hit, orig, -1))
  return pos, jnp.any(eligible)


def greedy(
  rel: Array,
  valid: Array,
  orig: Array,
  sims: Callable[[Array], Array],
  *,
  k: int,
  init: Array,
  objective: Callable[[Array, Array, Array], Array],
  update: Callable[[Array, Array, Array], Array],
) -> Selection:
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
    pos, ok = argmax_later(crit, eligible, orig)
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


def pool_inputs(q, docs, where, gram, pool):
  """Relevance, pool, and pool-level similarity accessors for one query."""
  rel_all = docs @ q
  idx, valid = candidate_pool(rel_all, where, pool)
  rel = rel_all[idx]
  if gram is not None:
    sq = jnp.diagonal(gram)[idx]
    sims = lambda pos: gram[idx[pos], idx]
  else:
    c = docs if pool is None or pool >= docs.shape[0] else docs[idx]  # the whole list: no [N, D] copy
    sq = jnp.sum(c * c, axis=-1)
    sims = lambda pos: c @ c[pos]
  return rel, valid, idx, sq, sims


def selection_scores(selection: Selection, *, n: int) -> Array:
  r"""Turns greedy picks into leg scores, so that a greedy operator can be an RRF leg.

  Definition:
    .. math:: s_i = K - j \text{ if item } i \text{ is pick } j \text{ (0-based)}, \quad -\infty \text{ otherwise}

  Args:
    selection: a :class:`Selection` with ``indices [..., K]`` (-1 entries are ignored).
    n: list length N; static.

  Returns:
    ``[..., N]`` scores: the first pick scores K, the last 1, unpicked items ``-inf``
    (which :func:`engram_jax.ops.rrf.rrf_fuse` reads as "not ranked by this leg"). An item picked twice keeps
    its first (larger) score. Scattered, so memory is ``[..., N]`` (no ``[..., K, N]`` comparison).
  """
  idx = jnp.asarray(selection.indices)
  k = idx.shape[-1]
  batch = idx.shape[:-1]
  flat = idx.reshape(-1, k)
  flat = jnp.where(flat < 0, n, flat)  # -1 (no pick) -> out of range, dropped by the scatter
  vals = jnp.broadcast_to((k - jnp.arange(k)).astype(jnp.result_type(float)), flat.shape)
  rows = jnp.arange(flat.shape[0])[:, None]
  out = jnp.full((flat.shape[0], n), -jnp.inf, vals.dtype).at[rows, flat].max(vals, mode='drop')
  return out.reshape(batch + (n,))


def soft_greedy(
  rel: Array,
  valid: Array,
  *,
  k: int,
  temperature: Array,
  init: Array,
  objective: Callable[[Array, Array], Array],
  update: Callable[[Array, Array, Array], Array],
) -> tuple[Array, Array]:
  r"""Softmax-relaxed greedy loop over a pool of P candidates (the relaxed twin of :func:`greedy`).

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
    pos, ok = argmax_later(crit, eligible, orig)
    hard = hard | (ok & (orig == pos))
    score = jnp.where(ok, jnp.sum(jnp.where(eligible, p * obj, 0.0)), -jnp.inf)
    state = jnp.where(ok, update(state, p, t), state)
    return (hard, mass + p, state), (p, score)

  carry = (jnp.zeros((p_n,), bool), jnp.zeros_like(rel), init)
  _, (probs, scores) = jax.lax.scan(step, carry, jnp.arange(k))
  return probs, scores


def soft_pool_inputs(q, docs, where, gram, pool):
  rel_all = docs @ q
  idx, valid = candidate_pool(rel_all, where, pool)
  if gram is not None:
    g = gram[idx[:, None], idx[None, :]]
  else:
    c = docs[idx]
    g = c @ c.T
  return rel_all[idx], g, valid, idx


def scatter_probs(probs: Array, idx: Array, n: int) -> Array:
  return jnp.zeros(probs.shape[:-1] + (n,), probs.dtype).at[..., idx].add(probs, unique_indices=True)


def map_pool_batch(
  one: Callable[..., SoftSelection], rel: Array, gram: Array, where: Array, temperature: Array
) -> SoftSelection:
  """Apply ``one(rel [P], gram [P, P], where [P], temperature [])`` over the leading batch axes of ``rel``."""
  batch, p = rel.shape[:-1], rel.shape[-1]
  g = jnp.broadcast_to(jnp.asarray(gram, rel.dtype), batch + (p, p))
  flat = lambda x: x.reshape((-1,) + x.shape[len(batch) :]) if batch else x[None]
  out = jax.vmap(one)(flat(rel), flat(g), flat(where), temperature.reshape(-1))
  return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


def scatter_pool_selection(sel: SoftSelection, idx: Array, n: int) -> SoftSelection:
  """Relaxed picks over pools ``probs [B, K, P]`` moved to item indices ``idx [B, P]``: ``probs [B, K, n]``."""
  k = sel.probs.shape[-2]
  probs = jax.vmap(lambda pr, i: jnp.zeros((k, n), pr.dtype).at[:, i].set(pr, unique_indices=True))(sel.probs, idx)
  return SoftSelection(probs, sel.scores)
