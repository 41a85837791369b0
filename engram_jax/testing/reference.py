"""Plain NumPy references for every operator and the core metrics, transcribed from their definitions (float64,
loops), independent of the JAX code on purpose.

One query at a time, Python loops over picks / iterations, the literal formulas (e.g. the CFS-R gradient as
``2 C (C^T a - z) + 2 lambda a``, the CFS distance as ``||c - s||^2``). Used by the tests (JAX == reference on
random inputs) and by ``experiments/bench/operators.py`` (speed ratios). Shared tie rule: among equal values the
later item (larger index) wins. Test support only: nothing in the library's run path imports this module.
"""

from __future__ import annotations

import math

import numpy as np

from engram_jax.ops import bm25 as _bm25_op
from engram_jax.ops import cfs as _cfs_op
from engram_jax.ops import cfsr as _cfsr_op
from engram_jax.ops import controls as _controls_op
from engram_jax.ops import mmr as _mmr_op
from engram_jax.ops.registry import knob_defaults

# Default knob values come from the operators' declarations (the one place they are written); the computations below
# share nothing else with the JAX code.
_BM25, _MMR, _CFS = knob_defaults(_bm25_op.KNOBS), knob_defaults(_mmr_op.KNOBS), knob_defaults(_cfs_op.KNOBS)
_CFSR, _MEM0 = knob_defaults(_cfsr_op.KNOBS), knob_defaults(_controls_op.MEM0_KNOBS)


def order_with_ties(scores, where=None):
  """Indices sorted by score descending; equal scores: larger index first; masked items excluded."""
  n = len(scores)
  idx = [i for i in range(n) if where is None or where[i]]
  return sorted(idx, key=lambda i: (-scores[i], -i))


def cosine(query, docs):
  return np.array([sum(q * d for q, d in zip(query, doc)) for doc in docs])


def bm25(query_tokens, docs_tokens, k1=_BM25['k1'], b=_BM25['b'], epsilon=_BM25['epsilon']):
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


# Lucene's SmallFloat (org.apache.lucene.util.SmallFloat, Lucene 8 and later), transcribed in Python ints: the
# one-byte length norm BM25Similarity stores per document and reads back through byte4ToInt.
def _long_to_int4(i: int) -> int:
  num_bits = i.bit_length()
  if num_bits < 4:  # subnormal value
    return i
  shift = num_bits - 4
  encoded = (i >> shift) & 0x07  # the 4 most significant bits, the implicit leading one cleared
  return encoded | ((shift + 1) << 3)  # the shift, plus one (0 is reserved for subnormal values)


def _int4_to_long(i: int) -> int:
  bits, shift = i & 0x07, (i >> 3) - 1
  return bits if shift == -1 else (bits | 0x08) << shift


LUCENE_NUM_FREE_VALUES = 255 - _long_to_int4(2**31 - 1)  # 24


def lucene_int_to_byte4(i: int) -> int:
  """``SmallFloat.intToByte4`` (as an unsigned byte): exact below 24, then 4 significant bits of ``i - 24``."""
  if i < 0:
    raise ValueError(f'Only supports positive values, got {i}')
  return i if i < LUCENE_NUM_FREE_VALUES else LUCENE_NUM_FREE_VALUES + _long_to_int4(i - LUCENE_NUM_FREE_VALUES)


def lucene_byte4_to_int(b: int) -> int:
  """``SmallFloat.byte4ToInt`` of an unsigned byte."""
  return b if b < LUCENE_NUM_FREE_VALUES else LUCENE_NUM_FREE_VALUES + _int4_to_long(b - LUCENE_NUM_FREE_VALUES)


def bm25_forms_ref(
  query_tf,
  doc_tf,
  *,
  form,
  k1=_BM25['k1'],
  b=_BM25['b'],
  epsilon=_BM25['epsilon'],
  delta=_BM25['delta'],
  where=None,
):
  """``[Q, N]`` BM25 scores of each form from dense counts (``query_tf [Q, V]``, ``doc_tf [N, V]``), with loops.

  Statistics over the real documents (``where``); masked documents score ``-inf``. A term a document lacks adds 0.

  * ``'okapi'``: rank_bm25's BM25Okapi (negative idf -> ``epsilon`` x the mean idf of the corpus vocabulary);
  * ``'lucene'``: Lucene's BM25Similarity: ``idf = log(1 + (n - df + 0.5) / (df + 0.5))``, ``tf / (tf + k1 (1 - b
    + b L / avgdl))``, ``L`` the document length through SmallFloat's one byte, ``n`` and ``avgdl`` over the
    documents holding at least one term (docCount);
  * ``'lucene_exact'``: the same with exact lengths and every document counted (bm25s ``method='lucene'``);
  * ``'bm25+'``: ``log((n + 1) / df)``, ``tf (k1 + 1) / (tf + k1 (...)) + delta``;
  * ``'bm25l'``: ``log((n + 1) / (df + 0.5))``, ``c = tf / (1 - b + b |d| / avgdl)``,
    ``(k1 + 1)(c + delta) / (k1 + c + delta)``.
  """
  q = np.asarray(query_tf, np.float64)
  d = np.asarray(doc_tf, np.float64)
  n_docs, n_vocab = d.shape
  docs = [i for i in range(n_docs) if where is None or bool(where[i])]
  dl = {i: float(sum(d[i])) for i in docs}
  counted = [i for i in docs if dl[i] > 0] if form == 'lucene' else docs
  n = len(counted)
  total = sum(dl[i] for i in counted)
  avgdl = total / n if n and total > 0 else 1.0
  length = {i: float(lucene_byte4_to_int(lucene_int_to_byte4(int(dl[i])))) if form == 'lucene' else dl[i] for i in docs}
  df = {t: sum(1 for i in docs if d[i, t] > 0) for t in range(n_vocab)}
  idf = {}
  for t, f in df.items():
    if f == 0:
      continue
    if form == 'okapi':
      idf[t] = math.log(n - f + 0.5) - math.log(f + 0.5)
    elif form in ('lucene', 'lucene_exact'):
      idf[t] = math.log(1.0 + (n - f + 0.5) / (f + 0.5))
    elif form == 'bm25+':
      idf[t] = math.log((n + 1.0) / f)
    elif form == 'bm25l':
      idf[t] = math.log((n + 1.0) / (f + 0.5))
    else:
      raise ValueError(f'unknown form {form!r}')
  if form == 'okapi':
    mean_idf = sum(idf.values()) / len(idf) if idf else 0.0
    idf = {t: (epsilon * mean_idf if v < 0 else v) for t, v in idf.items()}

  def weight(tf, ratio):
    norm = 1.0 - b + b * ratio
    if form == 'bm25l':
      c = tf / norm
      return (k1 + 1.0) * (c + delta) / (k1 + c + delta)
    w = tf / (tf + k1 * norm)
    if form in ('okapi', 'bm25+'):
      w *= k1 + 1.0
    return w + delta if form == 'bm25+' else w

  out = np.full((q.shape[0], n_docs), -np.inf)
  for j in range(q.shape[0]):
    for i in docs:
      s = 0.0
      for t in range(n_vocab):
        if q[j, t] > 0 and d[i, t] > 0 and t in idf:
          s += q[j, t] * idf[t] * weight(d[i, t], length[i] / avgdl)
      out[j, i] = s
  return out


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


def _real(n, where):
  return [i for i in range(n) if where is None or bool(where[i])]


def order_later_wins(scores, items):
  """``items`` sorted by score descending, ties to the larger index."""
  return sorted(items, key=lambda i: (-scores[i], -i))


def argmax_later_wins(values, items):
  """The item of ``items`` with the largest value; ties to the larger index. ``None`` if empty."""
  best = None
  for i in items:
    if best is None or values[i] > values[best] or (values[i] == values[best] and i > best):
      best = i
  return best


# ----------------------------------------------------------------------------------------------
# Similarity, fusion (for the benchmark).


def cosine_scores_ref(query, docs, where=None):
  """``[N]`` cosine of one unit-norm query with unit-norm docs; masked items ``-inf``."""
  query = np.asarray(query, np.float64)
  docs = np.asarray(docs, np.float64)
  out = np.full(docs.shape[0], -np.inf)
  for i in _real(docs.shape[0], where):
    out[i] = float(docs[i] @ query)
  return out


def rrf_fuse_ref(leg_scores, weights, depths, where=None, k0=60.0):
  """Weighted RRF of ``L`` legs ``[L, N]`` for one query; ``-inf`` leg scores are unranked."""
  leg_scores = np.asarray(leg_scores, np.float64)
  n = leg_scores.shape[-1]
  real = _real(n, where)
  out = np.full(n, -np.inf)
  out[real] = 0.0
  for l, depth in enumerate(depths):
    ranked = [i for i in real if np.isfinite(leg_scores[l, i])]
    for r, i in enumerate(order_later_wins(leg_scores[l], ranked), start=1):
      if r <= depth:
        out[i] += weights[l] / (k0 + r)
  return out


# ----------------------------------------------------------------------------------------------
# Diversity.


def _pool_ref(rel, real, pool):
  if pool is None or pool >= len(rel):
    return list(real)
  return order_later_wins(rel, real)[:pool]


def mmr_select_ref(query, docs, *, k, lam=_MMR['lam'], where=None, pool=None):
  """MMR picks ``(indices [K], scores [K])``; -1 / -inf past the real candidates."""
  docs = np.asarray(docs, np.float64)
  query = np.asarray(query, np.float64)
  n = docs.shape[0]
  rel = docs @ query
  cand = _pool_ref(rel, _real(n, where), pool)
  selected, scores = [], []
  pen = {c: 0.0 for c in cand}  # max over the selected set of cos(c, s); 0 while it is empty
  for _ in range(k):
    left = [i for i in cand if i not in selected]
    if not left:
      scores.append(-np.inf)
      continue
    obj = {c: lam * rel[c] - (1.0 - lam) * pen[c] for c in left}
    pick = argmax_later_wins(rel if not selected else obj, left)
    for c in left:
      sim = float(docs[c] @ docs[pick])
      pen[c] = sim if not selected else max(pen[c], sim)
    selected.append(pick)
    scores.append(obj[pick])
  idx = selected + [-1] * (k - len(selected))
  return np.array(idx, np.int64), np.array(scores, np.float64)


def cfs_select_ref(
  query, docs, *, k, beta=_CFS['beta'], sigma=_CFS['sigma'], where=None, floor=_CFS['floor'], pool=None
):
  """CFS picks ``(indices [K], scores [K])``; -1 / -inf past the real candidates."""
  docs = np.asarray(docs, np.float64)
  query = np.asarray(query, np.float64)
  n = docs.shape[0]
  rel = docs @ query
  cand = _pool_ref(rel, _real(n, where), pool)
  selected, scores = [], []
  field = {c: 0.0 for c in cand}  # sum over the selected set of exp(-||c - s||^2 / 2 sigma^2)
  for _ in range(k):
    left = [i for i in cand if i not in selected]
    if not left:
      scores.append(-np.inf)
      continue
    obj = {c: math.log(max(rel[c], floor)) - beta * field[c] for c in left}
    pick = argmax_later_wins(rel if not selected else obj, left)
    for c in left:
      field[c] += math.exp(-float(np.sum((docs[c] - docs[pick]) ** 2)) / (2.0 * sigma**2))
    selected.append(pick)
    scores.append(obj[pick])
  idx = selected + [-1] * (k - len(selected))
  return np.array(idx, np.int64), np.array(scores, np.float64)


def selection_scores_ref(indices, n):
  """``[N]``: K - j for pick j, ``-inf`` for unpicked items."""
  k = len(indices)
  out = np.full(n, -np.inf)
  for j, i in enumerate(indices):
    if i >= 0:
      out[i] = k - j
  return out


# ----------------------------------------------------------------------------------------------
# Reconstruction.


def _minmax_ref(x):
  lo, hi = min(x), max(x)
  if hi > lo:
    return [(v - lo) / (hi - lo) for v in x]
  return [0.0 for _ in x]


def nnls_ridge_ref(c, z, *, lam, iterations, power_iterations=20):
  """The CFS-R solve in float64 loops: ``min_{a >= 0} ||z - C^T a||^2 + sum_i lam_i a_i^2`` for pool rows ``c [P, D]``
  and target ``z [D]``; ``lam`` a scalar or one per row ``[P]``.

  a_0 = 0, a <- max(0, a - grad / L), grad = 2 C (C^T a - z) + 2 lam * a, L = 2 (lmax + max lam), lmax = Rayleigh
  quotient after ``power_iterations`` power iterations on C C^T from the normalised all-ones vector.
  """
  c = np.asarray(c, np.float64)
  z = np.asarray(z, np.float64)
  lam = np.asarray(lam, np.float64)
  gram = c @ c.T
  v = np.ones(len(c)) / math.sqrt(len(c))
  for _ in range(power_iterations):
    v = gram @ v
    norm = float(np.linalg.norm(v))
    if norm > 0:
      v = v / norm
  lmax = float(v @ gram @ v)
  lip = 2.0 * (lmax + float(np.max(lam)))
  a = np.zeros(len(c))
  for _ in range(iterations):
    grad = 2.0 * c @ (c.T @ a - z) + 2.0 * lam * a
    a = np.maximum(a - grad / lip, 0.0)
  return a


def cfsr_scores_ref(
  query,
  docs,
  *,
  where=None,
  pool=_CFSR['pool'],
  iterations=_CFSR['iterations'],
  lam=_CFSR['lam'],
  w=_CFSR['w'],
  power_iterations=20,
):
  """CFS-R scores ``[N]`` for one query (``-inf`` outside the pool).

  Solver: a_0 = 0, a <- max(0, a - grad / L), grad = 2 C (C^T a - z) + 2 lam a,
  L = 2 (lmax + lam), lmax = Rayleigh quotient after ``power_iterations`` power iterations on C C^T
  from the normalised all-ones vector.
  """
  docs = np.asarray(docs, np.float64)
  z = np.asarray(query, np.float64)
  n = docs.shape[0]
  cos = docs @ z
  members = order_later_wins(cos, _real(n, where))[:pool]
  out = np.full(n, -np.inf)
  if not members:
    return out
  c = docs[members]  # [P, D]
  a = nnls_ridge_ref(c, z, lam=lam, iterations=iterations, power_iterations=power_iterations)
  mm_a = _minmax_ref(list(a))
  mm_c = _minmax_ref([cos[i] for i in members])
  for j, i in enumerate(members):
    out[i] = w * mm_a[j] + (1.0 - w) * mm_c[j]
  return out


# ----------------------------------------------------------------------------------------------
# Recency.


def tide_scores_ref(base, positions, *, weight, depth, where=None):
  """Tide scores ``[N]`` for one query: base top-``depth`` + weight * position / (N_real - 1)."""
  base = np.asarray(base, np.float64)
  n = base.shape[0]
  real = _real(n, where)
  ranked = [i for i in real if np.isfinite(base[i])]
  top = order_later_wins(base, ranked)[:depth]
  denom = len(real) - 1 if len(real) > 1 else 1
  out = np.full(n, -np.inf)
  for i in top:
    out[i] = base[i] + weight * positions[i] / denom
  return out


# ----------------------------------------------------------------------------------------------
# Controls.


def mem0_bm25_params_ref(num_terms):
  """mem0/utils/scoring.py get_bm25_params, by query term count."""
  if num_terms <= 3:
    return 5.0, 0.7
  if num_terms <= 6:
    return 7.0, 0.6
  if num_terms <= 9:
    return 9.0, 0.5
  if num_terms <= 15:
    return 10.0, 0.5
  return 12.0, 0.5


def additive_fuse_ref(semantic, bm25, n_query_terms, *, where=None, threshold=_MEM0['threshold'], pool=_MEM0['pool']):
  """mem0 additive scoring for one query, in mem0's own dict-based shape (no entity, no recency)."""
  semantic = np.asarray(semantic, np.float64)
  bm25 = np.asarray(bm25, np.float64)
  n = semantic.shape[0]
  real = _real(n, where)
  semantic_results = order_later_wins(semantic, real)[:pool]
  keyword_results = order_later_wins(bm25, real)[:pool]
  mid, steep = mem0_bm25_params_ref(n_query_terms)
  bm25_scores = {}
  for i in keyword_results:
    if bm25[i] > 0:
      bm25_scores[i] = 1.0 / (1.0 + math.exp(-steep * (bm25[i] - mid)))
  max_possible = 1.0 + (1.0 if bm25_scores else 0.0)
  out = np.full(n, -np.inf)
  for i in semantic_results:
    if semantic[i] < threshold:
      continue
    out[i] = min((semantic[i] + bm25_scores.get(i, 0.0)) / max_possible, 1.0)
  return out


# ----------------------------------------------------------------------------------------------
# Test data (plain NumPy).


def unit_vectors(rng, n, d):
  """``[n, d]`` float64 rows uniform on the unit sphere."""
  x = rng.normal(size=(n, d))
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def pad(x, n_pad, d_pad=None):
  """Zero-pads rows to ``n_pad`` (and columns to ``d_pad``); zero columns keep inner products."""
  x = np.asarray(x)
  d_pad = x.shape[1] if d_pad is None else d_pad
  out = np.zeros((n_pad, d_pad), x.dtype)
  out[: x.shape[0], : x.shape[1]] = x
  return out


def revision_signal_ref(q, docs, where, *, pool, theta, delta):
  """The time-aware CFS-R revision detector by its definition, with loops: ``(r_q, top pool cosine)`` for one
  query ``q [D]`` over ``docs [N, D]`` (real rows ``where``; write time = position / (N_real - 1))."""
  where = np.asarray(where, bool)
  keep = sorted(np.flatnonzero(where), key=lambda i: (-(docs[i] @ q), -i))[:pool]  # later item wins ties
  top = max(docs[i] @ q for i in keep)
  n_real = int(where.sum())
  t = np.where(where, np.arange(len(where)) / max(n_real - 1, 1), 0.0)
  rho = {i: max(0.0, 1 - (top - docs[i] @ q) / delta) for i in keep}
  best = 0.0
  for i in keep:
    for j in keep:
      if i != j and docs[i] @ docs[j] >= theta:
        best = max(best, rho[i] * rho[j] * abs(t[i] - t[j]))
  return best, top
