"""Hard retrieval metrics over top-k index lists (binary relevance).

Every function takes ``topk [..., K]`` item indices (``-1`` = empty slot) and ``labels [..., N]``
(True for gold items) and returns ``[...]`` per-question values; a question with no gold scores 0.
The array backend follows the inputs: JAX arrays give ``jnp`` (float32, traceable), NumPy arrays give NumPy in
float64 (what the evaluation scores with: the official LongMemEval code computes in float64 too).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import Array


def _xp(*arrays):
  """NumPy (float64) when every input is a NumPy array, else ``jax.numpy``."""
  if all(isinstance(a, np.ndarray) for a in arrays):
    return np, np.float64
  return jnp, jnp.float32


def _gains(topk: Array, labels: Array, k: int) -> Array:
  xp, dtype = _xp(topk, labels)
  topk = xp.asarray(topk)[..., :k]
  labels = xp.asarray(labels)
  g = xp.take_along_axis(labels, xp.maximum(topk, 0), axis=-1)
  return xp.where(topk >= 0, g, False).astype(dtype)


def ndcg_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  r"""NDCG@k with binary gain and a log2 discount; the ideal list holds ``min(|gold|, k)`` gold items.

  Definition:
    .. math:: \mathrm{DCG@k} = \sum_{i=1}^{k} \frac{g_i}{\log_2(i+1)}, \qquad
              \mathrm{NDCG@k} = \mathrm{DCG@k} / \mathrm{IDCG@k}

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import ndcg_at_k
    >>> topk = jnp.array([[2, 0, -1]])  # retrieved item indices; -1 = empty slot
    >>> labels = jnp.array([[True, False, False]])  # item 0 is gold
    >>> round(float(ndcg_at_k(topk, labels, k=3)[0]), 4)  # 1 / log2(3)
    0.6309
  """
  xp, dtype = _xp(topk, labels)
  g = _gains(topk, labels, k)
  disc = 1.0 / xp.log2(xp.arange(2, g.shape[-1] + 2, dtype=dtype))
  dcg = xp.sum(g * disc, axis=-1)
  n_gold = xp.sum(xp.asarray(labels), axis=-1)
  ideal_disc = 1.0 / xp.log2(xp.arange(2, k + 2, dtype=dtype))
  idcg = xp.sum(xp.where(xp.arange(k) < n_gold[..., None], ideal_disc, 0.0), axis=-1)
  return xp.where(idcg > 0, dcg / xp.where(idcg > 0, idcg, 1.0), 0.0)


def recall_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """Fraction of the gold items found in the top ``k``.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import recall_at_k
    >>> topk = jnp.array([[2, 0, 1]])
    >>> labels = jnp.array([[True, True, False, False]])
    >>> print(recall_at_k(topk, labels, k=1), recall_at_k(topk, labels, k=2))
    [0.] [0.5]
  """
  xp, _ = _xp(topk, labels)
  hits = xp.sum(_gains(topk, labels, k), axis=-1)
  n_gold = xp.sum(xp.asarray(labels), axis=-1)
  return xp.where(n_gold > 0, hits / xp.maximum(n_gold, 1), 0.0)


def hit_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """1 if any gold item is in the top ``k`` (recall_any)."""
  xp, dtype = _xp(topk, labels)
  return (xp.sum(_gains(topk, labels, k), axis=-1) > 0).astype(dtype)


def recall_all_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """1 if every gold item is in the top ``k``; 0 when there is no gold (never a vacuous hit)."""
  xp, dtype = _xp(topk, labels)
  hits = xp.sum(_gains(topk, labels, k), axis=-1)
  n_gold = xp.sum(xp.asarray(labels), axis=-1)
  return ((n_gold > 0) & (hits == n_gold)).astype(dtype)


def ndcg_any_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  r"""LongMemEval's ``ndcg_any`` (``src/retrieval/eval_utils.py``): its DCG does not discount rank 2.

  Definition (0-based position i):
    .. math:: \mathrm{DCG} = g_0 + \sum_{i \ge 1} g_i / \log_2(i + 1)

  and the ideal DCG is the same sum over ``min(|gold|, k)`` gold items first. Cross-checked against
  :func:`engram_jax.metrics.official.ndcg_any` in the tests.
  """
  xp, dtype = _xp(topk, labels)
  g = _gains(topk, labels, k)
  pos = xp.arange(g.shape[-1], dtype=dtype)
  disc = xp.where(pos == 0, 1.0, 1.0 / xp.log2(xp.maximum(pos, 1.0) + 1.0))
  dcg = xp.sum(g * disc, axis=-1)
  n_gold = xp.sum(xp.asarray(labels), axis=-1)
  ipos = xp.arange(k, dtype=dtype)
  idisc = xp.where(ipos == 0, 1.0, 1.0 / xp.log2(xp.maximum(ipos, 1.0) + 1.0))
  idcg = xp.sum(xp.where(xp.arange(k) < n_gold[..., None], idisc, 0.0), axis=-1)
  return xp.where(idcg > 0, dcg / xp.where(idcg > 0, idcg, 1.0), 0.0)


def mrr_at_k(topk: Array, labels: Array, *, k: int) -> Array:
  """Reciprocal rank of the first gold item within the top ``k`` (0 if none)."""
  xp, dtype = _xp(topk, labels)
  g = _gains(topk, labels, k)
  rr = g / xp.arange(1, g.shape[-1] + 1, dtype=dtype)
  return xp.max(rr, axis=-1, initial=0.0)


METRICS = {
  'ndcg': ndcg_at_k,
  'recall': recall_at_k,
  'hit': hit_at_k,
  'recall_all': recall_all_at_k,
  'mrr': mrr_at_k,
  'recall_any': hit_at_k,
  'ndcg_any': ndcg_any_at_k,
}


def parse_metric(name: str, extra: tuple[str, ...] = ()) -> tuple[str, int]:
  """``'ndcg@10'`` -> ``('ndcg', 10)``; ``extra`` names further accepted bases; ValueError on unknown names."""
  base, _, k = name.partition('@')
  if (base not in METRICS and base not in extra) or not k.isdigit():
    raise ValueError(f'Unknown metric {name!r}; expected one of {sorted(METRICS) + sorted(extra)} followed by @k')
  return base, int(k)
