"""Control legs: a noisy second cosine vote (cos2) and mem0-style additive fusion.

These are the baselines a new operator has to beat: ``perturbed_cosine`` separates "a third RRF vote
that is correlated with cosine" from a genuinely new signal, and ``additive_fuse`` reproduces mem0's
published additive scoring of semantic and keyword evidence.

Neither is fitted (no soft twin): they are fixed controls. Registered as operators ``cos2`` and ``mem0``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import ranking, validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops.bm25 import bm25_leg
from engram_jax.ops.cosine import cosine_scores
from engram_jax.ops.registry import Knob, Operator, check_knobs, knob_defaults, register

# mem0/utils/scoring.py get_bm25_params: (upper bound on query terms, midpoint, steepness).
MEM0_BM25_PARAMS = ((3, 5.0, 0.7), (6, 7.0, 0.6), (9, 9.0, 0.5), (15, 10.0, 0.5), (None, 12.0, 0.5))

# The declarations of the controls' knobs: the one place their defaults are written (signatures below read them).
COS2_KNOBS = (
  Knob('eps', 0.30, check='>=0', doc='noise scale'),
  Knob('seed', 0, check='int>=0', doc='noise draw (traced: seeds share one compiled program)'),
)
MEM0_KNOBS = (
  Knob('threshold', 0.1, check='[0,1]', doc='semantic gate'),
  Knob('pool', 60, static=True, check='int>=1', doc='over-fetch of both searches'),
)
_COS2, _MEM0 = knob_defaults(COS2_KNOBS), knob_defaults(MEM0_KNOBS)


def perturbed_cosine(query: Array, docs: Array, *, key: Array, eps: ArrayLike, where: Array | None = None) -> Array:
  r"""cos2: cosine plus Gaussian noise, a cosine-correlated control vote.

  Definition:
    .. math:: s_i = \langle q, d_i \rangle + \varepsilon\, \xi_i, \quad \xi_i \sim \mathcal N(0, 1) \text{ i.i.d.}

  Args:
    query: ``[..., D]`` unit-norm queries; leading axes are batch.
    docs: ``[N, D]`` unit-norm items.
    key: PRNG key. The noise of (query row ``r`` of the flattened batch, item ``i``) is
      ``normal(fold_in(fold_in(key, r), i))``: it does not depend on how far the lists are padded, so an episode
      gives the same draw alone or stacked with larger ones. Stochastic: run on 5 seeds.
    eps: noise scale (0.30, 0.50, 1.00 in the CFS ablation); traced.
    where: ``[N]`` True for real items; masked items score ``-inf``.

  Returns:
    ``[..., N]`` scores.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from engram_jax import cosine_scores, perturbed_cosine
    >>> docs = jnp.eye(3)
    >>> q = jnp.array([0.6, 0.8, 0.0])
    >>> s = perturbed_cosine(q, docs, key=jax.random.key(0), eps=0.0)
    >>> bool(jnp.allclose(s, cosine_scores(q, docs)))  # eps = 0 is cosine
    True
  """
  validation.check_embeddings('perturbed_cosine', query, docs)
  check_knobs('cos2', 'perturbed_cosine', eps=eps)
  s = cosine_scores(query, docs, where=where)
  return s + jnp.asarray(eps, s.dtype) * item_noise(key, s.shape, s.dtype)


def item_noise(key: Array, shape: tuple[int, ...], dtype) -> Array:
  """Standard normal noise ``[..., N]`` whose entry (flattened row ``r``, column ``i``) is drawn from
  ``fold_in(fold_in(key, r), i)``: independent of the padded sizes."""
  rows = math.prod(shape[:-1])
  one = lambda k, i: jax.random.normal(jax.random.fold_in(k, i), (), dtype)
  row_keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(rows))
  noise = jax.vmap(lambda k: jax.vmap(lambda i: one(k, i))(jnp.arange(shape[-1])))(row_keys)
  return noise.reshape(shape)


def mem0_bm25_params(n_query_terms: Array) -> tuple[Array, Array]:
  """mem0's query-length-adaptive sigmoid parameters ``(midpoint, steepness)``.

  From ``mem0/utils/scoring.py: get_bm25_params``: up to 3 terms (5.0, 0.7), up to 6 (7.0, 0.6),
  up to 9 (9.0, 0.5), up to 15 (10.0, 0.5), more (12.0, 0.5). mem0 counts the whitespace terms of the
  lemmatised query (1 for an empty query).

  Args:
    n_query_terms: ``[...]`` integer term counts.

  Returns:
    ``(midpoint [...], steepness [...])`` as float arrays.
  """
  n = jnp.asarray(n_query_terms)
  mid = jnp.full(n.shape, MEM0_BM25_PARAMS[-1][1])
  steep = jnp.full(n.shape, MEM0_BM25_PARAMS[-1][2])
  for bound, m, s in reversed(MEM0_BM25_PARAMS[:-1]):
    mid = jnp.where(n <= bound, m, mid)
    steep = jnp.where(n <= bound, s, steep)
  return mid, steep


def additive_fuse(
  semantic: Array,
  bm25: Array,
  n_query_terms: Array,
  *,
  where: Array | None = None,
  threshold: ArrayLike = _MEM0['threshold'],
  pool: int = _MEM0['pool'],
) -> Array:
  r"""mem0-style additive fusion of semantic and sigmoid-normalised BM25 scores.

  Transcribes the semantics of mem0's hybrid search (``mem0/utils/scoring.py``: ``normalize_bm25``,
  ``get_bm25_params``, ``score_and_rank``; driven by ``mem0/memory/core/search.py:
  search_vector_store``, github.com/mem0ai/mem0) with no entity boost and no recency signal:

  * candidates are the semantic top-``pool`` real items (mem0 over-fetches
    ``max(4 * limit, 60)``) whose semantic score is ``>= threshold`` (mem0's default 0.1);
    every other item scores ``-inf``. BM25 alone never adds a candidate.
  * BM25 evidence: the keyword top-``pool`` items with a raw score ``> 0`` get
    :math:`\sigma(k\,(\mathrm{bm25} - m))` with :math:`(m, k)` from the query length
    (:func:`mem0_bm25_params`); every other item gets 0.
  * the semantic score is used as the vector store returns it (cosine for unit-norm embeddings).
  * the sum is divided by the number of active signals (mem0's ``max_possible``): 2 when any real
    item has a positive BM25 score for this query, else 1, and capped at 1.

  Definition:
    .. math::
      s_i = \min\!\left(1, \frac{\mathrm{sem}_i + [i \in \text{kw-pool}, \mathrm{bm25}_i > 0]\,
      \sigma(k(\mathrm{bm25}_i - m))}{1 + [\exists j: \mathrm{bm25}_j > 0]}\right)

  Args:
    semantic: ``[..., N]`` semantic scores (cosine).
    bm25: ``[..., N]`` raw BM25 scores (:func:`engram_jax.ops.bm25.bm25_scores`).
    n_query_terms: ``[...]`` number of query terms (selects the sigmoid midpoint / steepness).
    where: ``[N]`` or ``[..., N]`` True for real items.
    threshold: semantic gate; traced.
    pool: static over-fetch size of both the semantic and the keyword search.

  Returns:
    ``[..., N]`` fused scores in ``(-inf, 1]``; ``-inf`` for non-candidates and masked items.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import additive_fuse
    >>> semantic = jnp.array([0.9, 0.5, 0.05])  # item 2 is below the semantic gate (0.1)
    >>> bm25 = jnp.array([0.0, 3.0, 5.0])
    >>> [round(s, 3) for s in additive_fuse(semantic, bm25, jnp.array(2), pool=3).tolist()]
    [0.45, 0.349, -inf]
  """
  validation.check_scores('additive_fuse', semantic=semantic, bm25=bm25)
  check_knobs('mem0', 'additive_fuse', threshold=threshold, pool=pool)
  semantic = jnp.asarray(semantic)
  bm25 = jnp.asarray(bm25, semantic.dtype)
  n = semantic.shape[-1]
  shape = jnp.broadcast_shapes(semantic.shape, bm25.shape)
  real = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
  real = jnp.broadcast_to(real, shape)
  semantic = jnp.broadcast_to(semantic, shape)
  bm25 = jnp.broadcast_to(bm25, shape)
  p = min(pool, n)

  def in_top(scores):  # membership in the top-p, scattered (nothing [..., p, N])
    idx, vals = ranking.top_k(scores, k=p, where=real)
    flat_idx, ok = idx.reshape(-1, p), jnp.isfinite(vals).reshape(-1, p)
    rows = jnp.arange(flat_idx.shape[0])[:, None]
    return jnp.zeros((flat_idx.shape[0], n), bool).at[rows, flat_idx].max(ok).reshape(shape)

  sem_cand = in_top(semantic) & (semantic >= threshold)
  bm25_pos = real & (bm25 > 0)
  kw = in_top(bm25) & bm25_pos
  mid, steep = mem0_bm25_params(n_query_terms)
  mid = jnp.asarray(mid, semantic.dtype)[..., None]
  steep = jnp.asarray(steep, semantic.dtype)[..., None]
  bm25_norm = jnp.where(kw, jax.nn.sigmoid(steep * (bm25 - mid)), 0.0)
  active = 1.0 + jnp.any(bm25_pos, axis=-1, keepdims=True).astype(semantic.dtype)
  fused = jnp.minimum((semantic + bm25_norm) / active, 1.0)
  return jnp.where(sem_cand, fused, -jnp.inf)


def cos2_leg(ep: EpisodeArrays, key: Array, *, eps: float = _COS2['eps'], seed: int = _COS2['seed']) -> Array:
  """Perturbed cosine ("cos2"): cosine plus ``eps`` Gaussian noise; ``seed`` selects the noise draw."""
  return perturbed_cosine(ep.queries, ep.docs, key=jax.random.fold_in(key, seed), eps=eps, where=ep.where)


def mem0_leg(
  ep: EpisodeArrays, key: Array, *, threshold: float = _MEM0['threshold'], pool: int = _MEM0['pool']
) -> Array:
  """mem0-style additive fusion of cosine and sigmoid-normalised BM25 (one score, use with fusion none).

  mem0 may return fewer than k candidates (semantic gate, pool); for equal k the remaining real items
  follow every candidate in cosine order (a backfill that mem0 itself does not do).
  """
  cos = cosine_scores(ep.queries, ep.docs, where=ep.where)
  fused = additive_fuse(
    cos, bm25_leg(ep, key), jnp.maximum(ep.query_len, 1), where=ep.where, threshold=threshold, pool=pool
  )
  backfill = -10.0 + cos  # below any fused score (>= -1 for candidates, since cosine >= -1)
  return jnp.where(jnp.isneginf(fused) & ep.where, backfill, fused)


COS2 = register(Operator(name='cos2', leg=cos2_leg, doc='control: cosine + eps Gaussian noise', knobs=COS2_KNOBS))
MEM0 = register(
  Operator(name='mem0', leg=mem0_leg, doc='control: mem0-style additive fusion of cosine and BM25', knobs=MEM0_KNOBS)
)
