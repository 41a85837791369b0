"""BM25's forms (the ``form`` knob): the dense and sparse scorers equal a loop reference of every form on random
count matrices (empty and masked items, long items, repeated and absent query terms); ``'okapi'`` is still
rank_bm25's BM25Okapi; ``'lucene_exact'`` is bm25s's ``method='lucene'``; ``'bm25+'`` and ``'bm25l'`` are bm25s's less
the ``tf = 0`` value bm25s adds for each absent query term; ``lucene_length`` is Lucene's SmallFloat byte for byte;
the soft twin of the Lucene form with the English analyzer reproduces the hard leg cold on a fit's batched rows,
and has finite, non-zero gradients in ``k1`` and ``b``."""

from __future__ import annotations

import functools

import bm25s
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import strategies
from hypothesis import assume, given
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from engram_jax import fit
from engram_jax.core import batch
from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import pipeline
from engram_jax.fit import twins
from engram_jax.ops import bm25
from engram_jax.testing import reference as ref

N_PAD, V, Q = 16, 10, 3  # fixed shapes: the hypothesis examples share a few compilations


@st.composite
def count_matrices(draw):
  """``(query_tf [Q, V], doc_tf [N_PAD, V], where [N_PAD])`` float64 counts: sparse rows, some empty, some long
  (beyond Lucene's exact lengths, 39 terms), query terms repeated or absent from every item, scattered masks
  (all-masked included)."""
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  density = draw(st.sampled_from([0.15, 0.4, 0.8]))
  doc_tf = rng.integers(1, 4, size=(N_PAD, V)) * (rng.random((N_PAD, V)) < density)
  doc_tf = doc_tf * rng.choice([0, 1, 1, 1, 7, 25], size=(N_PAD, 1))  # empty rows and long rows
  query_tf = rng.integers(0, 3, size=(Q, V)) * (rng.random((Q, V)) < 0.5)
  where = draw(st.sampled_from(['all', 'prefix', 'scatter', 'none']))
  mask = {
    'all': np.ones(N_PAD, bool),
    'prefix': np.arange(N_PAD) < rng.integers(1, N_PAD + 1),
    'scatter': rng.random(N_PAD) < 0.6,
    'none': np.zeros(N_PAD, bool),
  }[where]
  return query_tf.astype(np.float64), doc_tf.astype(np.float64), mask


def _tokens(tf):
  """Token lists ``'t<column>'`` repeated by count (so build_lexicon with the column vocabulary rebuilds ``tf``)."""
  return [[f't{j}' for j in range(tf.shape[1]) for _ in range(int(tf[i, j]))] for i in range(tf.shape[0])]


COLUMNS = {f't{j}': j for j in range(V)}


def _fixed_width(lex, l_width, t_width, v_width):
  """``lex`` with its term rows padded to ``l_width`` and ``t_width`` entries (column 0, count 0: they add 0) and
  its vocabulary to ``v_width`` columns, so that the examples share one shape (build_lexicon buckets these sizes to
  powers of two)."""
  pad = lambda x, w: np.pad(np.asarray(x), [(0, 0), (0, w - x.shape[1])])
  return bm25.Lexicon(
    doc_terms=pad(lex.doc_terms, l_width),
    doc_counts=pad(lex.doc_counts, l_width),
    query_terms=pad(lex.query_terms, t_width),
    query_counts=pad(lex.query_counts, t_width),
    vocab_where=np.arange(v_width) < np.asarray(lex.vocab_where).sum(),
  )


@pytest.mark.parametrize('form', bm25.FORMS)
@given(
  data=count_matrices(),
  k1=st.floats(0.1, 3.0),
  b=st.floats(0.0, 1.0),
  delta=st.floats(0.0, 2.0),
  epsilon=st.floats(0.0, 1.0),
)
def test_dense_and_sparse_equal_the_reference(form, data, k1, b, delta, epsilon):
  query_tf, doc_tf, where = data
  expected = ref.bm25_forms_ref(query_tf, doc_tf, form=form, k1=k1, b=b, delta=delta, epsilon=epsilon, where=where)
  knobs = {'k1': k1, 'b': b, 'delta': delta, 'epsilon': epsilon, 'form': form}
  dense = np.asarray(bm25.bm25_scores(query_tf, doc_tf, where=where, **knobs))
  np.testing.assert_array_equal(np.isneginf(dense), ~where[None, :].repeat(Q, 0))
  np.testing.assert_allclose(dense, expected, rtol=1e-9, atol=1e-12)
  lex = bm25.build_lexicon(_tokens(doc_tf), _tokens(query_tf), n_rows=N_PAD, q_rows=Q, v_multiple=16, vocab=COLUMNS)
  lex = _fixed_width(lex, 16, 16, 16)
  sparse = np.asarray(bm25.bm25_sparse_scores(lex, where=where, batch_size=None, **knobs))
  np.testing.assert_array_equal(np.isneginf(sparse), ~where[None, :].repeat(Q, 0))
  np.testing.assert_allclose(sparse, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('form', bm25.FORMS)
def test_sparse_chunks_of_questions_equal_one_chunk(form):
  """Questions scored a chunk at a time (lax.map, padded to whole chunks) equal all at once, in every form."""
  rng = np.random.default_rng(3)
  docs = [list(rng.choice(strategies.WORDS, size=rng.integers(0, 60))) for _ in range(9)]
  queries = [list(rng.choice(strategies.WORDS + ['unseen'], size=rng.integers(0, 5))) for _ in range(5)]
  lex = bm25.build_lexicon(docs, queries, n_rows=12, q_rows=5)
  where = np.arange(12) < 9
  one = np.asarray(bm25.bm25_sparse_scores(lex, where=where, form=form, k1=1.1, b=0.6, batch_size=None))
  two = np.asarray(bm25.bm25_sparse_scores(lex, where=where, form=form, k1=1.1, b=0.6, batch_size=2))
  np.testing.assert_allclose(two, one, rtol=1e-6)
  expected = ref.bm25_forms_ref(*lex.dense(), form=form, k1=1.1, b=0.6, where=where)
  np.testing.assert_allclose(one, expected, rtol=1e-5, atol=1e-5)


def test_okapi_is_still_rank_bm25():
  rng = np.random.default_rng(0)
  docs = [list(rng.choice(strategies.WORDS, size=rng.integers(0, 20))) for _ in range(30)]
  queries = [['cat', 'cat', 'paris', 'unseen'], ['the', 'a'], ['x', 'budget', 'kitchen']]
  lex = bm25.build_lexicon(docs, queries, n_rows=32, q_rows=3)
  where = np.arange(32) < 30
  default = np.asarray(bm25.bm25_sparse_scores(lex, where=where, k1=1.3, b=0.6, epsilon=0.3))
  okapi = np.asarray(bm25.bm25_sparse_scores(lex, where=where, k1=1.3, b=0.6, epsilon=0.3, form='okapi'))
  np.testing.assert_array_equal(default, okapi)
  qtf, dtf = lex.dense()
  dense = np.asarray(
    bm25.bm25_scores(qtf.astype(np.float64), dtf.astype(np.float64), where=where, k1=1.3, b=0.6, epsilon=0.3)
  )
  reference = ref.bm25_forms_ref(qtf, dtf, form='okapi', k1=1.3, b=0.6, epsilon=0.3, where=where)
  model = BM25Okapi(docs, k1=1.3, b=0.6, epsilon=0.3)
  assert sum(v == 0.3 * model.average_idf for v in model.idf.values()) >= 2  # negative idfs, floored
  for i, q in enumerate(queries):
    expected = model.get_scores(q)
    np.testing.assert_allclose(okapi[i, :30], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dense[i, :30], expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(reference[i, :30], expected, rtol=1e-9, atol=1e-12)


def _bm25s(method, docs, k1, b, delta):
  """bm25s indexed on token ids (vocabulary in first-seen order, no stop words, no stemming), float64."""
  vocab = bm25.build_vocab(docs)
  retriever = bm25s.BM25(method=method, k1=k1, b=b, delta=delta, dtype='float64')
  retriever.index(([[vocab[t] for t in d] for d in docs], dict(vocab)), show_progress=False)
  return retriever, vocab


def _bm25s_case(corpus, k1, b, delta, method, form):
  """(ours dense, ours sparse, bm25s scores, bm25s's tf = 0 value summed over each item's absent query tokens)."""
  query, docs = corpus
  retriever, vocab = _bm25s(method, docs, k1, b, delta)
  ids = [vocab[t] for t in query if t in vocab]  # bm25s drops out-of-vocabulary tokens too
  if ids:
    theirs = retriever.get_scores(ids)
  else:  # bm25s cannot score a query without tokens (it reads query[0]); nothing matches
    theirs = np.zeros(len(docs))
  # padded to one shape (32 items, 16 columns: strategies.corpora draws at most 25 items over 12 words), so the
  # examples share their compilations
  where = np.arange(32) < len(docs)
  dtf = bm25.term_counts(docs, vocab, n_rows=32, n_cols=16).astype(np.float64)
  qtf = bm25.term_counts([query], vocab, n_cols=16).astype(np.float64)
  absent = np.zeros(len(docs))
  if retriever.nonoccurrence_array is not None:
    absent = np.array([sum(retriever.nonoccurrence_array[t] for t in ids if dtf[i, t] == 0) for i in range(len(docs))])
  knobs = {'k1': k1, 'b': b, 'delta': delta, 'form': form}
  dense = np.asarray(bm25.bm25_scores(qtf, dtf, where=where, **knobs))[0, : len(docs)]
  lex = _fixed_width(bm25.build_lexicon(docs, [query], n_rows=32, q_rows=1, v_multiple=16), 16, 8, 16)
  sparse = np.asarray(bm25.bm25_sparse_scores(lex, where=where, **knobs))[0, : len(docs)]
  return dense, sparse, theirs, absent


@given(strategies.corpora(), st.floats(0.1, 3.0), st.floats(0.0, 1.0))
def test_lucene_exact_equals_bm25s_lucene(corpus, k1, b):
  assume(any(corpus[1]))  # bm25s divides by the mean item length
  dense, sparse, theirs, absent = _bm25s_case(corpus, k1, b, 0.5, 'lucene', 'lucene_exact')
  assert not absent.any()  # bm25s's lucene adds nothing for absent terms
  np.testing.assert_allclose(dense, theirs, rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(sparse, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('form', ['bm25+', 'bm25l'])
@given(strategies.corpora(), st.floats(0.1, 3.0), st.floats(0.0, 1.0), st.floats(0.05, 2.0))
def test_bm25plus_and_bm25l_equal_bm25s_less_the_absent_terms(form, corpus, k1, b, delta):
  query, docs = corpus
  assume(any(docs))
  dense, sparse, theirs, absent = _bm25s_case(corpus, k1, b, delta, form, form)
  np.testing.assert_allclose(dense, theirs - absent, rtol=1e-9, atol=1e-9)
  np.testing.assert_allclose(sparse, theirs - absent, rtol=1e-5, atol=1e-5)
  # what bm25s adds per absent query token t: idf_t x the form's tf = 0 value
  retriever, vocab = _bm25s(form, docs, k1, b, delta)
  n = len(docs)
  for t, col in vocab.items():
    df = sum(t in d for d in docs)
    if form == 'bm25+':
      added = np.log((n + 1) / df) * delta
    else:
      added = np.log((n + 1) / (df + 0.5)) * (k1 + 1) * delta / (k1 + delta)
    np.testing.assert_allclose(retriever.nonoccurrence_array[col], added, rtol=1e-9)


def test_bm25plus_absent_terms_matter_only_through_bm25s():
  """A hand case: the item without the query's term scores 0 here, but ``idf x delta`` in bm25s."""
  docs = [['cat', 'dog'], ['dog'], ['fish', 'fish']]
  dense, sparse, theirs, absent = _bm25s_case((['cat'], docs), 1.2, 0.75, 0.5, 'bm25+', 'bm25+')
  idf = np.log(4 / 1)
  np.testing.assert_allclose(dense[1:], 0.0)
  np.testing.assert_allclose(theirs[1:], idf * 0.5)
  np.testing.assert_allclose(absent, [0.0, idf * 0.5, idf * 0.5])
  norm = 1 - 0.75 + 0.75 * 2 / (5 / 3)
  np.testing.assert_allclose(dense[0], idf * (2.2 / (1 + 1.2 * norm) + 0.5), rtol=1e-9)


def test_lucene_length_is_smallfloat_byte4():
  """``lucene_length`` is ``SmallFloat.byte4ToInt(SmallFloat.intToByte4(dl))`` for every length 0..100000, in JAX
  and in NumPy (the soft twin's statistics)."""
  dl = np.arange(100_001)
  expected = np.array([ref.lucene_byte4_to_int(ref.lucene_int_to_byte4(int(i))) for i in dl])
  assert ref.LUCENE_NUM_FREE_VALUES == 24
  assert max(ref.lucene_int_to_byte4(int(i)) for i in dl) <= 255
  np.testing.assert_array_equal(np.asarray(bm25.lucene_length(jnp.asarray(dl))), expected)
  np.testing.assert_array_equal(np.asarray(bm25.lucene_length(dl.astype(np.float64), xp=np)), expected)
  np.testing.assert_array_equal(expected[:40], np.arange(40))  # exact up to 39 terms
  assert list(expected[40:48]) == [40, 40, 42, 42, 44, 44, 46, 46]
  assert expected[1000] == 984 and expected[100_000] == 98_328  # as Lucene 9's SmallFloat prints them


# ---- the soft twin of the Lucene form, English analyzer -------------------------------------------------------

ENGLISH = (
  "running runs ran dogs dog Caroline's park parks cooking cooked cook U.S. 3.5 don't well-known paint painting "
  'painted Melanie trip trips camping beach books reading guitar played playing connection connected the a in of '
  'and is to it was'
).split()


@functools.cache
def _english_episodes(seed=0, sizes=(35, 47, 60), n_questions=(3, 4, 3)):
  """Episodes with English texts: most items short, some long (beyond Lucene's exact lengths), some holding only
  stop words (no term: outside Lucene's docCount), one empty; questions share words with their gold item."""
  rng = np.random.default_rng(seed)
  episodes, arrays = [], []
  for e, (n, nq) in enumerate(zip(sizes, n_questions)):
    lengths = rng.choice([0, 3, 6, 12, 20, 45, 90, 150], size=n, p=[0.04, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.06])
    texts = [' '.join(rng.choice(ENGLISH, size=m)) for m in lengths]
    texts[1] = 'the a in of and'  # stop words only
    items = tuple(Item(id=f'{e}:{i}', text=t, parent=f'{e}:s{i // 5}', position=i) for i, t in enumerate(texts))
    gold = rng.choice(np.flatnonzero(lengths >= 3), size=nq, replace=False)
    questions = tuple(
      Question(
        id=f'{e}/q{j}',
        text=' '.join(list(rng.choice(texts[g].split(), size=2)) + list(rng.choice(ENGLISH, size=2))),
        gold=(items[g].id,),
        gold_parents=(items[g].parent,),
        category=0,
      )
      for j, g in enumerate(gold.tolist())
    )
    ep = Episode(id=f'e{e}', items=items, questions=questions)
    docs, queries = ref.unit_vectors(rng, n, 8), ref.unit_vectors(rng, nq, 8)
    episodes.append(ep)
    arrays.append(
      batch.episode_arrays(ep, docs, queries, n_multiple=64, q_multiple=4, v_multiple=64, tokenizers=['english'])
    )
  return episodes, arrays


LUCENE_LEG = {'op': 'bm25', 'tokenizer': 'english', 'form': 'lucene', 'k1': 0.9, 'b': 0.4}


def test_lucene_twin_cold_equals_the_hard_leg_on_batched_rows():
  episodes, arrays = _english_episodes()
  # the case exercises what the Lucene form changes: lengths beyond 39 terms and items outside docCount
  lengths = [len(bm25.ANALYZERS['english'](it.text)) for ep in episodes for it in ep.items]
  assert any(np.asarray(bm25.lucene_length(np.asarray(lengths), xp=np)) != lengths)
  assert any(m == 0 for m in lengths)
  pipe = pipeline.make_pipeline(legs={'bm25': LUCENE_LEG}, fusion='rrf', name='bm25_lucene')
  problem, _, every = fit.make_problem(pipe, ['legs.bm25.k1', 'legs.bm25.b'])
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=0)
  n_questions = [len(ep.questions) for ep in episodes]
  n_pad = rows.where.shape[-1]
  where = np.asarray(rows.where)
  for vals in (every, twins.moved_values(problem, 0, every), {**every, 'legs.bm25.k1': 2.0, 'legs.bm25.b': 1.0}):
    (gap,) = twins.cold_twin_gaps(problem, rows, arrays, n_questions, vals, seed=0)
    assert gap.ok, gap.message()
    hard = twins.hard_rows(
      problem, 0, arrays, n_questions, range(len(arrays)), twins.leg_options(problem, 0, vals), n_pad=n_pad, seed=0
    )
    soft = twins.soft_rows(problem, 0, vals, rows)
    np.testing.assert_array_equal(np.isneginf(hard), ~where)
    np.testing.assert_allclose(np.where(where, soft, 0.0), np.where(where, hard, 0.0), rtol=1e-5, atol=1e-6)
    assert (hard[where] > 0).any()
  # and the hard leg is the reference's Lucene form on each episode's English counts
  for ep, arr in zip(episodes, arrays):
    lex = arr.lexicons['english']
    got = np.asarray(bm25.bm25_leg(arr, None, k1=0.9, b=0.4, tokenizer='english', form='lucene'))
    expected = ref.bm25_forms_ref(*lex.dense(), form='lucene', k1=0.9, b=0.4, where=np.asarray(arr.where))
    np.testing.assert_allclose(got[: len(ep.questions)], expected[: len(ep.questions)], rtol=1e-5, atol=1e-6)


def test_lucene_twin_differs_from_the_exact_length_twin():
  """The twin's statistics follow the form: with exact lengths (``lucene_exact``) the rows differ on these
  episodes (so the cold-equality test above would catch a twin that ignored Lucene's lengths or docCount)."""
  episodes, arrays = _english_episodes()
  (ep, arr) = episodes[2], arrays[2]
  tf_l, w_l, dlr_l = bm25.term_stats(arr, len(ep.questions), 0.25, tokenizer='english', form='lucene')
  tf_e, w_e, dlr_e = bm25.term_stats(arr, len(ep.questions), 0.25, tokenizer='english', form='lucene_exact')
  np.testing.assert_array_equal(tf_l, tf_e)
  assert not np.allclose(dlr_l, dlr_e) and not np.allclose(w_l, w_e)


def test_lucene_gradients_in_k1_and_b_are_finite_and_nonzero():
  episodes, arrays = _english_episodes()
  lex, where = arrays[2].lexicons['english'], np.asarray(arrays[2].where)
  qtf, dtf = (x.astype(np.float64) for x in lex.dense())
  u = np.random.default_rng(1).normal(size=(qtf.shape[0], dtf.shape[0]))

  def hard(k1, b):
    s = bm25.bm25_scores(qtf, dtf, where=where, k1=k1, b=b, form='lucene')
    return jnp.sum(jnp.where(where, s, 0.0) * u)

  value = jax.jit(hard)
  g = jax.jit(jax.grad(hard, argnums=(0, 1)))(0.9, 0.4)
  assert all(np.isfinite(x) and x != 0.0 for x in g), g
  for i, (k1, b) in enumerate([(0.9 + 1e-6, 0.4), (0.9, 0.4 + 1e-6)]):  # and they are the slopes
    np.testing.assert_allclose((value(k1, b) - value(0.9, 0.4)) / 1e-6, g[i], rtol=1e-4)

  rows = bm25.term_rows(
    arrays[2], len(episodes[2].questions), 64, {'epsilon': 0.25, 'tokenizer': 'english', 'form': 'lucene'}, None
  )
  rows = {k: jnp.asarray(v, jnp.float32) for k, v in rows.items()}

  def twin(k1, b):
    s = bm25.term_scores(rows, {'k1': k1, 'b': b, 'form': 'lucene'})
    return jnp.sum(s * jnp.asarray(u[: s.shape[0]], jnp.float32))

  g = jax.jit(jax.grad(twin, argnums=(0, 1)))(jnp.float32(0.9), jnp.float32(0.4))
  assert all(np.isfinite(x) and x != 0.0 for x in g), g
