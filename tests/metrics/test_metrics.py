"""Metrics: hand-derived values and a cross-check against ir_measures (pytrec_eval backend)."""

import math

import ir_measures
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engram_jax.metrics import labels as metrics
from engram_jax.testing import reference as ref


def test_hand_computed_ndcg_and_recall():
  topk = np.array([[3, 0, 1]])
  labels = np.zeros((1, 5), bool)
  labels[0, [0, 4]] = True
  assert math.isclose(
    float(metrics.ndcg_at_k(topk, labels, k=3)[0]), (1 / math.log2(3)) / (1 + 1 / math.log2(3)), rel_tol=1e-6
  )
  assert float(metrics.recall_at_k(topk, labels, k=3)[0]) == 0.5
  assert float(metrics.hit_at_k(topk, labels, k=3)[0]) == 1.0
  assert float(metrics.recall_all_at_k(topk, labels, k=3)[0]) == 0.0
  assert math.isclose(float(metrics.mrr_at_k(topk, labels, k=3)[0]), 0.5)


def test_no_gold_is_zero_not_nan_and_recall_all_is_not_vacuous():
  topk = np.array([[0, 1]])
  labels = np.zeros((1, 3), bool)
  for f in metrics.METRICS.values():
    assert float(f(topk, labels, k=2)[0]) == 0.0


def test_empty_slots_count_as_misses():
  labels = np.array([[True, False, False]])
  assert float(metrics.recall_at_k(np.array([[-1, -1]]), labels, k=2)[0]) == 0.0


@given(st.integers(1, 30), st.integers(1, 12), st.data())
def test_against_ir_measures_and_reference(n, k, data):
  rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
  q = 4
  labels = rng.random((q, n)) < 0.25
  labels[:, 0] |= ~labels.any(axis=1)  # at least one gold per question
  kk = min(k, n)
  topk = np.stack([rng.permutation(n)[:kk] for _ in range(q)])
  qrels = [ir_measures.Qrel(str(i), str(d), 1) for i in range(q) for d in np.flatnonzero(labels[i])]
  run = [ir_measures.ScoredDoc(str(i), str(d), float(kk - r)) for i in range(q) for r, d in enumerate(topk[i])]
  nd = ir_measures.nDCG @ k
  rc = ir_measures.R @ k
  expected = {(m, r.query_id): r.value for r in ir_measures.iter_calc([nd, rc], qrels, run) for m in [r.measure]}
  got_nd = np.asarray(metrics.ndcg_at_k(topk, labels, k=k))
  got_rc = np.asarray(metrics.recall_at_k(topk, labels, k=k))
  for i in range(q):
    gold = set(np.flatnonzero(labels[i]).tolist())
    assert math.isclose(got_nd[i], expected[(nd, str(i))], abs_tol=1e-5)
    assert math.isclose(got_rc[i], expected[(rc, str(i))], abs_tol=1e-5)
    assert math.isclose(got_nd[i], ref.ndcg(topk[i].tolist(), gold, k), abs_tol=1e-5)
    assert math.isclose(got_rc[i], ref.recall(topk[i].tolist(), gold, k), abs_tol=1e-5)


@given(st.integers(1, 20), st.integers(1, 12), st.data())
def test_ndcg_any_matches_the_official_transcription(n, k, data):
  from engram_jax.metrics import official

  rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
  labels = rng.random((1, n)) < 0.3
  labels[0, rng.integers(n)] = True
  ranking = rng.permutation(n)
  ids = [f'answer_{i}' if labels[0, i] else f'x_{i}' for i in range(n)]
  gold = [ids[i] for i in np.flatnonzero(labels[0])]
  expected = official.ndcg_any(ranking.tolist(), gold, ids, k=k)
  got = float(metrics.ndcg_any_at_k(ranking[None, : min(k, n)], labels, k=k)[0])
  assert math.isclose(got, expected, abs_tol=1e-6)
