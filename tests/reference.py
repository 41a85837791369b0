"""Plain loop-based NumPy references for the core operators and metrics (float64).

Transcribed from the definitions, independent of the JAX code under test.
"""

from __future__ import annotations

import math

import numpy as np


def order_with_ties(scores, where=None):
  """Indices sorted by score descending; equal scores: larger index first; masked items excluded."""
  n = len(scores)
  idx = [i for i in range(n) if where is None or where[i]]
  return sorted(idx, key=lambda i: (-scores[i], -i))


def cosine(query, docs):
  return np.array([sum(q * d for q, d in zip(query, doc)) for doc in docs])


def bm25(query_tokens, docs_tokens, k1=1.5, b=0.75, epsilon=0.25):
  """Okapi BM25 exactly as rank_bm25 0.2.2 describes it, written out with loops."""
  n = len(docs_tokens)
  avgdl = sum(len(d) for d in docs_tokens) / n
  df = {}
  for d in docs_tokens:
    for t in set(d):
      df[t] = df.get(t, 0) + 1
  idf = {t: math.log(n - f + 0.5) - math.log(f + 0.5) for t, f in df.items()}
  mean_idf = sum(idf.values()) / len(idf) if idf else 0.0
  idf = {t: (epsilon * mean_idf if v < 0 else v) for t, v in idf.items()}
  out = []
  for d in docs_tokens:
    s = 0.0
    for t in query_tokens:
      f = d.count(t)
      if t in idf and f:
        s += idf[t] * f * (k1 + 1) / (f + k1 * (1 - b + b * len(d) / avgdl))
    out.append(s)
  return np.array(out)


def rrf(leg_scores, weights, depths, k0=60.0, where=None):
  """Weighted RRF; a leg ranks only its finite, unmasked items, and only its top ``depth`` count."""
  n = len(leg_scores[0])
  fused = np.zeros(n)
  for scores, w, depth in zip(leg_scores, weights, depths):
    ok = [(where is None or where[i]) and np.isfinite(scores[i]) for i in range(n)]
    for r, i in enumerate(order_with_ties(scores, ok)[:depth], start=1):
      fused[i] += w / (k0 + r)
  if where is not None:
    fused = np.where(where, fused, -np.inf)
  return fused


def ndcg(ranked, gold, k):
  dcg = sum(1.0 / math.log2(i + 2) for i, d in enumerate(ranked[:k]) if d in gold)
  idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(gold), k)))
  return dcg / idcg if idcg else 0.0


def recall(ranked, gold, k):
  return len(set(ranked[:k]) & set(gold)) / len(gold) if gold else 0.0
