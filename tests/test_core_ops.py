"""Core operators (ranking, cosine, BM25, RRF) against the NumPy references and rank_bm25."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from engram_jax import fusion, lexical, ranking, similarity
import reference
import strategies


def _tf(query, docs, pad_rows=0, pad_cols=0):
  vocab = lexical.build_vocab(docs)
  d = lexical.term_counts(docs, vocab, n_rows=len(docs) + pad_rows, n_cols=len(vocab) + pad_cols)
  q = lexical.term_counts([query], vocab, n_cols=len(vocab) + pad_cols)[0]
  return q.astype(np.float64), d.astype(np.float64)


def test_top_k_tie_rule_prefers_later_item():
  idx, vals = ranking.top_k(jnp.array([1.0, 2.0, 2.0, 0.5]), k=3)
  np.testing.assert_array_equal(idx, [2, 1, 0])
  np.testing.assert_array_equal(ranking.ranks(jnp.array([0.0, 0.0, 0.0])), [3, 2, 1])


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=30), st.data())
def test_ranks_and_top_k_match_reference(scores, data):
  where = np.array(data.draw(strategies.masks(len(scores))))
  s = np.array(scores)
  order = reference.order_with_ties(s, where)
  r = np.asarray(ranking.ranks(jnp.asarray(s), where=jnp.asarray(where)))
  np.testing.assert_array_equal([r[i] for i in order], np.arange(1, len(order) + 1))
  assert np.all(r[~where] > len(order))
  k = len(scores)
  idx, vals = ranking.top_k(jnp.asarray(s), k=k, where=jnp.asarray(where))
  np.testing.assert_array_equal(np.asarray(idx)[:len(order)], order)
  assert np.all(np.isneginf(np.asarray(vals)[len(order):]))


@given(strategies.unit_vectors())
def test_cosine_matches_reference(qd):
  q, docs = qd
  np.testing.assert_allclose(similarity.cosine_scores(q, docs), reference.cosine(q, docs), atol=1e-12)


@given(strategies.corpora(), st.floats(0.1, 3.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_bm25_equals_rank_bm25(corpus, k1, b, eps):
  query, docs = corpus
  assume(any(docs))  # rank_bm25 divides by the mean document length
  with np.errstate(invalid='ignore'):
    expected = BM25Okapi(docs, k1=k1, b=b, epsilon=eps).get_scores(query)
  # rank_bm25 yields 0/0 = NaN for an empty document when b == 1; we (and the reference) define it as 0.
  expected = np.nan_to_num(expected, nan=0.0)
  np.testing.assert_allclose(reference.bm25(query, docs, k1, b, eps), expected, rtol=1e-9, atol=1e-12)
  q, d = _tf(query, docs, pad_rows=3, pad_cols=5)
  where = np.arange(len(docs) + 3) < len(docs)
  got = lexical.bm25_scores(q, d, where=where, k1=k1, b=b, epsilon=eps)
  np.testing.assert_allclose(np.asarray(got)[:len(docs)], expected, rtol=1e-9, atol=1e-12)
  assert np.all(np.isneginf(np.asarray(got)[len(docs):]))


def test_bm25_on_real_sized_corpus_and_repeated_query_terms():
  rng = np.random.default_rng(0)
  words = [f'w{i}' for i in range(300)]
  docs = [list(rng.choice(words, size=rng.integers(1, 30), p=np.arange(300, 0, -1) / 45150)) for _ in range(200)]
  query = ['w0', 'w0', 'w5', 'w299', 'nope']
  q, d = _tf(query, docs)
  np.testing.assert_allclose(lexical.bm25_scores(q, d), BM25Okapi(docs).get_scores(query), rtol=1e-9)


def test_bm25_gradients_in_k1_b_are_finite():
  q, d = _tf(['cat', 'dog'], [['cat', 'the'], ['dog', 'dog', 'a'], ['x'], []])
  g = jax.grad(lambda k1, b: jnp.sum(lexical.bm25_scores(q, d, k1=k1, b=b)), argnums=(0, 1))(1.5, 0.75)
  assert all(np.isfinite(x) for x in g)


@given(st.integers(1, 4), st.integers(1, 25), st.data())
def test_rrf_matches_reference(n_legs, n, data):
  rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
  legs = rng.integers(0, 4, size=(n_legs, n)).astype(float)  # many ties on purpose
  legs[rng.random((n_legs, n)) < 0.2] = -np.inf                # items a leg does not rank
  weights = rng.uniform(0.1, 3.0, n_legs)
  depths = [int(x) for x in rng.integers(1, n + 2, n_legs)]
  where = rng.random(n) < 0.8
  got = fusion.rrf_fuse(legs, weights=weights, depths=depths, where=where)
  np.testing.assert_allclose(got, reference.rrf(legs, weights, depths, where=where), rtol=1e-12)


@pytest.mark.parametrize('op', ['cosine', 'bm25', 'rrf'])
def test_jit_eager_vmap_and_all_masked(op):
  rng = np.random.default_rng(1)
  n, d, qn = 12, 6, 5
  docs = rng.normal(size=(n, d))
  docs /= np.linalg.norm(docs, axis=1, keepdims=True)
  queries = rng.normal(size=(qn, d))
  qtf = rng.integers(0, 2, size=(qn, 9)).astype(float)
  dtf = rng.integers(0, 3, size=(n, 9)).astype(float)
  legs = rng.normal(size=(2, qn, n))
  fns = {
      'cosine': (lambda x, w: similarity.cosine_scores(x, docs, where=w), queries),
      'bm25': (lambda x, w: lexical.bm25_scores(x, dtf, where=w), qtf),
      'rrf': (lambda x, w: fusion.rrf_fuse(x, weights=jnp.array([1.0, 2.0]), depths=(3, 5), where=w), legs),
  }
  f, x = fns[op]
  where = jnp.arange(n) < 9
  eager = f(x, where)
  np.testing.assert_allclose(jax.jit(f)(x, where), eager, rtol=1e-6)
  if op != 'rrf':
    looped = np.stack([f(x[i], where) for i in range(qn)])
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(x, where), looped, rtol=1e-6)
  none = f(x, jnp.zeros(n, bool))
  assert not np.any(np.isnan(np.asarray(none)))
  assert np.all(np.isneginf(np.asarray(none)))


def test_rrf_rejects_depth_count_mismatch():
  with pytest.raises(ValueError, match='Shape mismatch'):
    fusion.rrf_fuse(np.zeros((2, 4)), weights=[1.0, 1.0], depths=[3])
