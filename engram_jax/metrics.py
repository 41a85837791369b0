"""Hard retrieval metrics over top-k index lists (binary relevance).

Every function takes ``topk [..., K]`` item indices (``-1`` = empty slot) and ``labels [..., N]``
(True for gold items) and returns ``[...]`` per-question values; a question with no gold scores 0.
They are written with ``jnp`` and work on NumPy inputs too.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


def _gains(topk: Array, labels: Array, k: int) -> Array:
  topk = jnp.asarray(topk)[..., :k]
  labels = jnp.asarray(labels)
  g = jnp.take_along_axis(labels, jnp.maximum(topk, 0), axis=-1)
  return jnp.where(topk >= 0, g, False).astype(jnp.float32)


def ndcg_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  r"""NDCG@k with binary gain and a log2 discount; the ideal list holds ``min(|gold|, k)`` gold items.

  Definition:
    .. math:: \mathrm{DCG@k} = \sum_{i=1}^{k} \frac{g_i}{\log_2(i+1)}, \qquad
              \mathrm{NDCG@k} = \mathrm{DCG@k} / \mathrm{IDCG@k}
  """
  g = _gains(topk, labels, k)
  disc = 1.0 / jnp.log2(jnp.arange(2, g.shape[-1] + 2, dtype=jnp.float32))
  dcg = jnp.sum(g * disc, axis=-1)
  n_gold = jnp.sum(jnp.asarray(labels), axis=-1)
  ideal_disc = 1.0 / jnp.log2(jnp.arange(2, k + 2, dtype=jnp.float32))
  idcg = jnp.sum(jnp.where(jnp.arange(k) < n_gold[..., None], ideal_disc, 0.0), axis=-1)
  return jnp.where(idcg > 0, dcg / jnp.where(idcg > 0, idcg, 1.0), 0.0)


def recall_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """Fraction of the gold items found in the top ``k``."""
  hits = jnp.sum(_gains(topk, labels, k), axis=-1)
  n_gold = jnp.sum(jnp.asarray(labels), axis=-1)
  return jnp.where(n_gold > 0, hits / jnp.maximum(n_gold, 1), 0.0)


def hit_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """1 if any gold item is in the top ``k`` (recall_any)."""
  return (jnp.sum(_gains(topk, labels, k), axis=-1) > 0).astype(jnp.float32)


def recall_all_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """1 if every gold item is in the top ``k``; 0 when there is no gold (never a vacuous hit)."""
  hits = jnp.sum(_gains(topk, labels, k), axis=-1)
  n_gold = jnp.sum(jnp.asarray(labels), axis=-1)
  return ((n_gold > 0) & (hits == n_gold)).astype(jnp.float32)


def ndcg_any_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  r"""LongMemEval's ``ndcg_any`` (``src/retrieval/eval_utils.py``): its DCG does not discount rank 2.

  Definition (0-based position i):
    .. math:: \mathrm{DCG} = g_0 + \sum_{i \ge 1} g_i / \log_2(i + 1)

  and the ideal DCG is the same sum over ``min(|gold|, k)`` gold items first. Cross-checked against
  :func:`engram_jax.official.ndcg_any` in the tests.
  """
  g = _gains(topk, labels, k)
  pos = jnp.arange(g.shape[-1], dtype=jnp.float32)
  disc = jnp.where(pos == 0, 1.0, 1.0 / jnp.log2(jnp.maximum(pos, 1.0) + 1.0))
  dcg = jnp.sum(g * disc, axis=-1)
  n_gold = jnp.sum(jnp.asarray(labels), axis=-1)
  ipos = jnp.arange(k, dtype=jnp.float32)
  idisc = jnp.where(ipos == 0, 1.0, 1.0 / jnp.log2(jnp.maximum(ipos, 1.0) + 1.0))
  idcg = jnp.sum(jnp.where(jnp.arange(k) < n_gold[..., None], idisc, 0.0), axis=-1)
  return jnp.where(idcg > 0, dcg / jnp.where(idcg > 0, idcg, 1.0), 0.0)


def mrr_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """Reciprocal rank of the first gold item within the top ``k`` (0 if none)."""
  g = _gains(topk, labels, k)
  rr = g / jnp.arange(1, g.shape[-1] + 1, dtype=jnp.float32)
  return jnp.max(rr, axis=-1, initial=0.0)


METRICS = {'ndcg': ndcg_at_k, 'recall': recall_at_k, 'hit': hit_at_k, 'recall_all': recall_all_at_k,
           'mrr': mrr_at_k, 'recall_any': hit_at_k, 'ndcg_any': ndcg_any_at_k}


def parse_metric(name: str, extra: tuple[str, ...] = ()) -> tuple[str, int]:
  """``'ndcg@10'`` -> ``('ndcg', 10)``; ``extra`` names further accepted bases; ValueError on unknown names."""
  base, _, k = name.partition('@')
  if (base not in METRICS and base not in extra) or not k.isdigit():
    raise ValueError(f'Unknown metric {name!r}; expected one of {sorted(METRICS) + sorted(extra)} followed by @k')
  return base, int(k)
