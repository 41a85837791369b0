"""BM25: equal to rank_bm25 (and the NumPy reference); jit / eager / vmap and all-masked lists; gradients in k1 and
b; its registry declaration (the soft twin on term statistics)."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

import ops_testing
import strategies
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
  q, d = _tf(query, docs, pad_rows=3, pad_cols=5)
  where = np.arange(len(docs) + 3) < len(docs)
  got = bm25.bm25_scores(q, d, where=where, k1=k1, b=b, epsilon=eps)
  np.testing.assert_allclose(np.asarray(got)[:len(docs)], expected, rtol=1e-9, atol=1e-12)
  assert np.all(np.isneginf(np.asarray(got)[len(docs):]))


def test_bm25_on_real_sized_corpus_and_repeated_query_terms():
  rng = np.random.default_rng(0)
  words = [f'w{i}' for i in range(300)]
  docs = [list(rng.choice(words, size=rng.integers(1, 30), p=np.arange(300, 0, -1) / 45150)) for _ in range(200)]
  query = ['w0', 'w0', 'w5', 'w299', 'nope']
  q, d = _tf(query, docs)
  np.testing.assert_allclose(bm25.bm25_scores(q, d), BM25Okapi(docs).get_scores(query), rtol=1e-9)


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


def test_jit_eager_vmap_and_all_masked():
  c = ops_testing.jit_case()
  ops_testing.check_jit_eager_vmap_and_all_masked(lambda x, w: bm25.bm25_scores(x, c['dtf'], where=w), c['qtf'],
                                                  n=c['n'], qn=c['qn'])


def test_declaration():
  ops_testing.check_declaration('bm25')
