"""Control legs: a noisy second cosine vote (cos2) and mem0-style additive fusion.

These are the baselines a new operator has to beat: ``perturbed_cosine`` separates "a third RRF vote
that is correlated with cosine" from a genuinely new signal, and ``additive_fuse`` reproduces mem0's
published additive scoring of semantic and keyword evidence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax import ranking
from engram_jax.similarity import cosine_scores

# mem0/utils/scoring.py get_bm25_params: (upper bound on query terms, midpoint, steepness).
MEM0_BM25_PARAMS = ((3, 5.0, 0.7), (6, 7.0, 0.6), (9, 9.0, 0.5), (15, 10.0, 0.5), (None, 12.0, 0.5))


def perturbed_cosine(query: Array, docs: Array, *, key: Array, eps: ArrayLike, where: Array | None = None) -> Array:
  r"""cos2: cosine plus Gaussian noise, a cosine-correlated control vote.

  Definition:
    .. math:: s_i = \langle q, d_i \rangle + \varepsilon\, \xi_i, \quad \xi_i \sim \mathcal N(0, 1) \text{ i.i.d.}

  Args:
    query: ``[..., D]`` unit-norm queries; leading axes are batch.
    docs: ``[N, D]`` unit-norm items.
    key: PRNG key; the noise has the shape of the scores ``[..., N]``. Stochastic: run on 5 seeds.
    eps: noise scale (0.30, 0.50, 1.00 in the CFS ablation); traced.
    where: ``[N]`` True for real items; masked items score ``-inf``.

  Returns:
    ``[..., N]`` scores.
  """
  s = cosine_scores(query, docs, where=where)
  noise = jax.random.normal(key, s.shape, s.dtype)
  return s + jnp.asarray(eps, s.dtype) * noise


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


def additive_fuse(semantic: Array, bm25: Array, n_query_terms: Array, *, where: Array | None = None,
                  threshold: ArrayLike = 0.1, pool: int = 60) -> Array:
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
    bm25: ``[..., N]`` raw BM25 scores (:func:`engram_jax.lexical.bm25_scores`).
    n_query_terms: ``[...]`` number of query terms (selects the sigmoid midpoint / steepness).
    where: ``[N]`` or ``[..., N]`` True for real items.
    threshold: semantic gate; traced.
    pool: static over-fetch size of both the semantic and the keyword search.

  Returns:
    ``[..., N]`` fused scores in ``(-inf, 1]``; ``-inf`` for non-candidates and masked items.
  """
  semantic = jnp.asarray(semantic)
  bm25 = jnp.asarray(bm25, semantic.dtype)
  n = semantic.shape[-1]
  shape = jnp.broadcast_shapes(semantic.shape, bm25.shape)
  real = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
  real = jnp.broadcast_to(real, shape)
  semantic = jnp.broadcast_to(semantic, shape)
  bm25 = jnp.broadcast_to(bm25, shape)
  p = min(pool, n)

  def in_top(scores):
    idx, vals = ranking.top_k(scores, k=p, where=real)
    hit = (idx[..., :, None] == jnp.arange(n)) & jnp.isfinite(vals)[..., :, None]
    return jnp.any(hit, axis=-2)

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
