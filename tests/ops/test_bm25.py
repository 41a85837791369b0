"""BM25: equal to rank_bm25 (and the NumPy reference); jit / eager / vmap and all-masked lists; gradients in k1 and
b; its registry declaration (the soft twin on term statistics)."""

import jax
import jax.numpy as jnp
import numpy as np
import ops_testing
import pytest
import strategies
from hypothesis import assume, given
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from engram_jax.ops import bm25
from engram_jax.testing import reference as ref


def _tf(query, docs, pad_rows=0, pad_cols=0):
  vocab = bm25.build_vocab(docs)
  d = bm25.term_counts(docs, vocab, n_rows=len(docs) + pad_rows, n_cols=len(vocab) + pad_cols)
  q = bm25.term_counts([query], vocab, n_cols=len(vocab) + pad_cols)[0]
  return q.astype(np.float64), d.astype(np.float64)


@given(strategies.corpora(), st.floats(0.1, 3.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_bm25_equals_rank_bm25(corpus, k1, b, eps):
  query, docs = corpus
  assume(any(docs))  # rank_bm25 divides by the mean document length
  with np.errstate(invalid='ignore'):
    expected = BM25Okapi(docs, k1=k1, b=b, epsilon=eps).get_scores(query)
  # rank_bm25 yields 0/0 = NaN for an empty document when b == 1; we (and the reference) define it as 0.
  expected = np.nan_to_num(expected, nan=0.0)
  np.testing.assert_allclose(ref.bm25(query, docs, k1, b, eps), expected, rtol=1e-9, atol=1e-12)
  # padded to fixed buckets (rows 32, vocabulary a multiple of 64), so the examples share a few compiled shapes
  n_vocab = len(bm25.build_vocab(docs))
  pad_rows, pad_cols = 32 - len(docs), -(-(n_vocab + 5) // 64) * 64 - n_vocab
  q, d = _tf(query, docs, pad_rows=pad_rows, pad_cols=pad_cols)
  where = np.arange(len(docs) + pad_rows) < len(docs)
  got = bm25.bm25_scores(q, d, where=where, k1=k1, b=b, epsilon=eps)
  np.testing.assert_allclose(np.asarray(got)[: len(docs)], expected, rtol=1e-9, atol=1e-12)
  assert np.all(np.isneginf(np.asarray(got)[len(docs) :]))


@given(
  strategies.corpora(),
  st.floats(0.1, 3.0),
  st.floats(0.0, 1.0),
  st.floats(0.0, 1.0),
  st.integers(1, 4),
  st.sampled_from([None, 1, 2]),
)
@pytest.mark.slow
def test_sparse_bm25_equals_rank_bm25_and_dense(corpus, k1, b, eps, n_queries, batch_size):
  """The sparse form (what the leg runs) against rank_bm25, with padded items, questions and vocabulary, repeated
  query terms, out-of-vocabulary terms and question chunks of every size."""
  query, docs = corpus
  assume(any(docs))
  queries = [query[: len(query) - j] + query[:j] for j in range(n_queries)]  # varied repetition
  lex = bm25.build_lexicon(
    docs, queries, n_rows=len(docs) + 3, q_rows=n_queries + 2, l_multiple=4, t_multiple=2, v_multiple=8
  )
  where = np.arange(len(docs) + 3) < len(docs)
  got = np.asarray(bm25.bm25_sparse_scores(lex, where=where, k1=k1, b=b, epsilon=eps, batch_size=batch_size))
  qtf, dtf = lex.dense()
  dense = np.asarray(bm25.bm25_scores(qtf, dtf, where=where, k1=k1, b=b, epsilon=eps))
  for i, q in enumerate(queries):
    with np.errstate(invalid='ignore'):
      expected = np.nan_to_num(BM25Okapi(docs, k1=k1, b=b, epsilon=eps).get_scores(q), nan=0.0)
    np.testing.assert_allclose(got[i, : len(docs)], expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got, dense, rtol=1e-6, atol=1e-6)
  assert np.all(np.isneginf(got[:, len(docs) :]))


def test_lexicon_is_sparse_and_sorted():
  lex = bm25.build_lexicon([['b', 'a', 'b'], [], ['c']], [['b', 'zz', 'b', 'a']], n_rows=4, q_rows=2)
  np.testing.assert_array_equal(np.asarray(lex.doc_terms)[0, :2], [0, 1])  # vocabulary b=0, a=1, c=2
  np.testing.assert_array_equal(np.asarray(lex.doc_counts)[0, :2], [2, 1])
  np.testing.assert_array_equal(np.asarray(lex.query_terms)[0, :2], [0, 1])  # 'zz' is out of vocabulary
  np.testing.assert_array_equal(np.asarray(lex.query_counts)[0, :2], [2, 1])
  assert np.asarray(lex.vocab_where).sum() == 3 and np.asarray(lex.doc_counts)[1:].sum() == 1
  with pytest.raises(ValueError, match='Shape mismatch'):
    bm25.build_lexicon([['a']] * 3, [], n_rows=2, q_rows=1)


def test_bm25_on_real_sized_corpus_and_repeated_query_terms():
  rng = np.random.default_rng(0)
  words = [f'w{i}' for i in range(300)]
  docs = [list(rng.choice(words, size=rng.integers(1, 30), p=np.arange(300, 0, -1) / 45150)) for _ in range(200)]
  query = ['w0', 'w0', 'w5', 'w299', 'nope']
  q, d = _tf(query, docs)
  np.testing.assert_allclose(bm25.bm25_scores(q, d), BM25Okapi(docs).get_scores(query), rtol=1e-9)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_bm25_gradients_in_k1_b_are_finite():
  q, d = _tf(['cat', 'dog'], [['cat', 'the'], ['dog', 'dog', 'a'], ['x'], []])
  g = jax.grad(lambda k1, b: jnp.sum(bm25.bm25_scores(q, d, k1=k1, b=b)), argnums=(0, 1))(1.5, 0.75)
  assert all(np.isfinite(x) for x in g)


def test_check_grads_bm25():
  toks = [bm25.tokenize(t) for t in ['a cat ran', 'the dog', 'a blue cat cat', 'x y', '']]
  vocab = bm25.build_vocab(toks)
  dtf = bm25.term_counts(toks, vocab).astype(np.float64)
  qtf = bm25.term_counts([['cat', 'a'], ['dog', 'x']], vocab).astype(np.float64)
  ops_testing.grads_ok(lambda k1, bb: bm25.bm25_scores(qtf, dtf, k1=k1, b=bb), (1.2, 0.6), modes=['rev'])


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_jit_eager_vmap_and_all_masked():
  c = ops_testing.jit_case()
  ops_testing.check_jit_eager_vmap_and_all_masked(
    lambda x, w: bm25.bm25_scores(x, c['dtf'], where=w), c['qtf'], n=c['n'], qn=c['qn']
  )


@pytest.mark.slow
def test_declaration():
  ops_testing.check_declaration('bm25')
