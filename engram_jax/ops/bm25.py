"""BM25 as a pure JAX function, in the forms the field runs (the ``form`` knob, :data:`FORMS`):

* ``'okapi'`` (the default, and every number published before the Lucene-grade leg): the exact semantics of
  ``rank_bm25.BM25Okapi`` (v0.2.2), below;
* ``'lucene'``: Lucene's ``BM25Similarity`` (Lucene 8 and later, as Anserini runs it):
  ``idf[t] = log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))`` and ``tf / (tf + k1 (1 - b + b |d| / avgdl))`` (no
  ``k1 + 1`` factor), where ``|d|`` is Lucene's one-byte length norm (:func:`lucene_length`: exact up to 39 terms,
  then its top four bits kept) and ``n``, ``avgdl`` count the items that hold at least one term (Lucene's
  ``docCount``); checked against Lucene itself per question (``experiments.lucene``);
* ``'lucene_exact'``: the same with exact lengths and every item counted: bm25s's ``method='lucene'``;
* ``'bm25+'`` (Lv and Zhai 2011): ``idf = log((n + 1) / df)``, ``tf (k1 + 1) / (tf + k1 (...)) + delta``;
* ``'bm25l'`` (Lv and Zhai 2011): ``idf = log((n + 1) / (df + 0.5))``, ``c = tf / (1 - b + b |d| / avgdl)``,
  ``(k1 + 1)(c + delta) / (k1 + c + delta)``.

In every form a term a document lacks adds 0 (the papers', Lucene's and Okapi's semantics). rank_bm25's BM25Plus
and BM25L and bm25s's ``'bm25+'`` and ``'bm25l'`` add each absent query term's ``tf = 0`` value too (for BM25+ that
adds the same ``idf x delta`` to every document, so ``delta`` cannot change their ranking); the tests check these
forms against bm25s with that term named and subtracted.

rank_bm25 computes, for a tokenised corpus of ``n`` documents,

* ``df[t]`` = number of documents containing ``t``; ``avgdl`` = mean document length in tokens;
* ``idf[t] = log(n - df[t] + 0.5) - log(df[t] + 0.5)``; every *negative* idf is replaced by
  ``epsilon * mean(idf over the corpus vocabulary)`` (an idf of exactly 0 stays 0);
* ``score(q, d) = sum over query tokens t (with repetition) of
  idf[t] * tf[t,d] (k1 + 1) / (tf[t,d] + k1 (1 - b + b |d| / avgdl))``; tokens absent from the corpus add 0.

One deliberate difference: for an empty document with ``b == 1`` rank_bm25 computes 0/0 and returns
NaN; here a term absent from a document always contributes 0.

Storage is sparse (:class:`Lexicon`): each item keeps its distinct terms (vocabulary columns, ascending) and their
counts ``[N, L]``, each question its distinct in-vocabulary terms and counts ``[Q, T]``; nothing ``[N, V]`` is
built, so an episode of 1e5 items costs ``N x L`` (``L`` = the most distinct terms of an item). The sum over query
tokens with repetition is then, per item, a sum over its own terms of the query's count of that term (gathered
from a ``[B, V]`` query-weight row per chunk of ``B`` questions) times the term's weight. :func:`bm25_scores` keeps
the dense form ``[Q, V] x [N, V]`` for small corpora and tests. rank_bm25 takes
pre-tokenised text, so the analyzer is part of the config (the ``tokenizer`` knob names one of
:data:`engram_jax.core.lexicon.ANALYZERS`):

* ``'words'`` (:func:`tokenize`, the default): lower-case ``\\w+`` runs;
* ``'flat'`` (:func:`flat_tokenize`): LongMemEval's official ``flat-bm25`` retriever
  (``run_retrieval.py``: ``BM25Okapi([doc.split(" ") for doc in corpus]).get_scores(query.split(" "))``):
  split on single spaces, case kept, punctuation kept, ``''`` tokens kept, an empty text is ``['']``;
* ``'english'``: Lucene's English analyzer (Anserini's default), with ``form='lucene', k1=0.9, b=0.4`` the
  ``bm25_lucene`` pipeline; ``'english_snowball'``, ``'english_nostem'``, ``'english_stop179'``, ``'words_porter'``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import validation
from engram_jax.core.batch import EpisodeArrays

# The tokenizers and the Lexicon live in engram_jax.core.lexicon (built by engram_jax.core.batch, which imports no operator);
# re-exported here, where BM25's users look for them.
from engram_jax.core.lexicon import (  # noqa: F401
  ANALYZERS,
  TOKENIZERS,
  Analyzer,
  Lexicon,
  build_lexicon,
  build_vocab,
  flat_tokenize,
  get_tokenizer,
  term_counts,
  tokenize,
)
from engram_jax.ops import pools
from engram_jax.ops.registry import Knob, Operator, SoftTwin, check_knobs, knob_defaults, register

FORMS = ('okapi', 'lucene', 'lucene_exact', 'bm25+', 'bm25l')

# The declaration of BM25's knobs: the one place their defaults are written (signatures below read _D).
KNOBS = (
  Knob('k1', 1.5, transform='log', check='>0', doc='BM25 term saturation'),
  Knob('b', 0.75, transform='logit', check='[0,1]', doc='BM25 length normalisation'),
  Knob('epsilon', 0.25, static=True, check='>=0', doc='BM25 idf floor factor (okapi form)'),
  Knob('tokenizer', 'words', static=True, check=tuple(ANALYZERS), doc='the analyzer (engram_jax.core.lexicon)'),
  Knob('form', 'okapi', static=True, check=FORMS, doc='BM25 form: idf and term weight'),
  Knob('delta', 0.5, check='>=0', doc='the bm25+ / bm25l lower bound'),
)
_D = knob_defaults(KNOBS)


def lucene_length(dl: ArrayLike, xp=jnp) -> Array:
  """Lucene's one-byte document length (``SmallFloat.byte4ToInt(intToByte4(dl))``), as its BM25 reads it: exact up
  to 39 terms; beyond, ``dl - 24`` keeps its four most significant bits. ``dl`` integer-valued ``[...]``."""
  i = xp.asarray(dl).astype(xp.int32) - 24
  shift = sum((i >= (1 << (s + 3))).astype(xp.int32) for s in range(1, 28))  # bit length of i minus 4, or 0
  return xp.where(i < 0, i + 24, ((i >> shift) << shift) + 24).astype(xp.float32)


def _idf(df: Array, n: Array, epsilon: ArrayLike, form: str = _D['form'], xp=jnp) -> Array:
  """The form's idf over vocabulary columns with ``df > 0`` (0 elsewhere). ``'okapi'``: rank_bm25's, negative idf
  floored at ``epsilon x`` the mean idf."""
  in_vocab = df > 0
  safe = xp.where(in_vocab, df, 1.0)
  if form == 'okapi':
    idf = xp.log(n - df + 0.5) - xp.log(df + 0.5)
    idf = xp.where(in_vocab, idf, 0.0)
    mean_idf = xp.sum(idf) / xp.maximum(xp.sum(in_vocab), 1)
    return xp.where(in_vocab & (idf < 0), epsilon * mean_idf, idf)
  if form in ('lucene', 'lucene_exact'):
    idf = xp.log(1.0 + (n - safe + 0.5) / (safe + 0.5))
  elif form == 'bm25+':
    idf = xp.log((n + 1.0) / safe)
  elif form == 'bm25l':
    idf = xp.log((n + 1.0) / (safe + 0.5))
  else:
    raise ValueError(f'bm25: unknown form {form!r}; known: {list(FORMS)}')
  return xp.where(in_vocab, idf, 0.0)


def _term_weight(tf: Array, ratio: Array, k1: ArrayLike, b: ArrayLike, form: str, delta: ArrayLike) -> Array:
  """The form's weight of a term ``tf`` times in an item of length ratio ``|d| / avgdl`` (broadcast); 0 where
  ``tf == 0``."""
  norm = 1.0 - b + b * ratio
  if form == 'bm25l':
    c = tf / norm
    w = (k1 + 1.0) * (c + delta) / (k1 + c + delta)
  else:
    w = tf / (tf + k1 * norm)
    if form in ('okapi', 'bm25+'):
      w = w * (k1 + 1.0)
    if form == 'bm25+':
      w = w + delta
  return jnp.where(tf > 0, w, 0.0)  # 0/0 guard for empty items


def _length_stats(tf: Array, real: Array, form: str) -> tuple[Array, Array, Array]:
  """``(n, dl [N], avgdl)`` of the form: Lucene counts only items that hold a term and reads its one-byte length."""
  dl = jnp.sum(tf, axis=-1)
  counted = real & (dl > 0) if form == 'lucene' else real
  n = jnp.sum(counted)
  avgdl = jnp.sum(dl) / jnp.maximum(n, 1)
  if form == 'lucene':
    dl = lucene_length(dl)
  return n, dl, jnp.where(avgdl > 0, avgdl, 1.0)


# Elements of a chunk's [N, L, B] gather in bm25_sparse_scores (64 MB of float32): B = 32 questions up to
# N x L = 2^19 (LoCoMo episodes: N x L <= 768 x 80), fewer beyond.
GATHER_BUDGET = 1 << 24


def bm25_sparse_scores(
  lex: Lexicon,
  *,
  where: Array | None = None,
  k1: ArrayLike = _D['k1'],
  b: ArrayLike = _D['b'],
  epsilon: ArrayLike = _D['epsilon'],
  form: str = _D['form'],
  delta: ArrayLike = _D['delta'],
  batch_size: int | None = 32,
) -> Array:
  r"""BM25 scores of the ``form`` from sparse term statistics; equal to :func:`bm25_scores` on the dense counts
  (tested), to ``rank_bm25.BM25Okapi`` (``'okapi'``) and to Lucene (``'lucene'``).

  Per item, the score is a sum over its own distinct terms :math:`t` of :math:`q_t\,\mathrm{idf}_t\,
  f_{t,d}(k_1+1)/(f_{t,d} + k_1(1-b+b|d|/\mathrm{avgdl}))` (``form='okapi'``; the other forms' idf and term
  weight: the module docstring), with :math:`q_t` gathered from the question's
  count table (``[V, batch_size]``, built ``batch_size`` questions at a time). Cost ``N x L x Q``; memory
  ``[N, L]`` weights and an ``[N, L, batch_size]`` gather per chunk; no ``[N, V]``.

  Args:
    lex: the episode's :class:`Lexicon` (``doc_* [N, L]``, ``query_* [Q, T]``, ``vocab_where [V]``).
    where: ``[N]`` True for real items; statistics use real items only and masked items score ``-inf``.
    k1, b, epsilon: BM25's parameters; traced (differentiable in ``k1`` and ``b``).
    form: static; one of :data:`FORMS`. delta: the bm25+ / bm25l lower bound (traced).
    batch_size: static; questions per chunk (``lax.map``), lowered so that a chunk's gather stays within
      :data:`GATHER_BUDGET` elements; ``None`` = all at once.

  Returns:
    ``[Q, N]`` scores.
  """
  terms = jnp.asarray(lex.doc_terms)
  n_items = terms.shape[0]
  real = jnp.ones(n_items, bool) if where is None else jnp.asarray(where, bool)
  tf = jnp.asarray(lex.doc_counts) * real[:, None]
  n, dl, avgdl = _length_stats(tf, real, form)
  v = lex.vocab_where.shape[-1]
  df = jnp.zeros(v, tf.dtype).at[terms].add((tf > 0).astype(tf.dtype))
  idf = _idf(df, n, epsilon, form)
  weight = _term_weight(tf, (dl / avgdl)[:, None], k1, b, form, delta) * idf[terms]  # [N, L]

  def chunk(args):
    q_terms, q_counts = args  # [B, T]
    cols = jnp.arange(q_terms.shape[0])[None, :]
    q_rows = (
      jnp.zeros((v, q_terms.shape[0]), weight.dtype).at[q_terms.T, cols].add(q_counts.T.astype(weight.dtype))
    )  # [V, B]: a question's count of each term, questions contiguous
    return jnp.einsum('nlb,nl->bn', q_rows[terms], weight)  # [B, N]

  q_terms, q_counts = jnp.asarray(lex.query_terms), jnp.asarray(lex.query_counts)
  n_q = q_terms.shape[0]
  if batch_size is not None:  # bound the [N, L, B] gather of a chunk (large episodes take fewer questions at once)
    batch_size = max(1, min(batch_size, GATHER_BUDGET // max(terms.size, 1)))
  if batch_size is None or n_q <= batch_size:
    s = chunk((q_terms, q_counts))
  else:  # pad Q to whole chunks (padding questions have no terms), one chunk per lax.map step
    n_chunks = -(-n_q // batch_size)
    pad = [(0, n_chunks * batch_size - n_q), (0, 0)]
    split = lambda x: jnp.pad(x, pad).reshape(n_chunks, batch_size, -1)
    s = jax.lax.map(chunk, (split(q_terms), split(q_counts))).reshape(n_chunks * batch_size, n_items)[:n_q]
  return jnp.where(real, s, -jnp.inf)


def bm25_scores(
  query_tf: Array,
  doc_tf: Array,
  *,
  where: Array | None = None,
  k1: ArrayLike = _D['k1'],
  b: ArrayLike = _D['b'],
  epsilon: ArrayLike = _D['epsilon'],
  form: str = _D['form'],
  delta: ArrayLike = _D['delta'],
) -> Array:
  r"""BM25 scores (the ``form``; ``'okapi'``: equal to ``rank_bm25.BM25Okapi(corpus).get_scores(query)``).

  Definition (``form='okapi'``; the other forms' idf and term weight: the module docstring):
    .. math::
      s(q, d) = \sum_t q_t \, \mathrm{idf}_t \frac{f_{t,d}(k_1+1)}{f_{t,d} + k_1(1 - b + b\,|d|/\mathrm{avgdl})}

  Args:
    query_tf: ``[..., V]`` query term counts over the corpus vocabulary.
    doc_tf: ``[N, V]`` document term counts (padded rows and columns are zero).
    where: ``[N]`` True for real documents; statistics (n, df, avgdl) use real documents only, and
      masked documents score ``-inf``.
    k1, b, epsilon: BM25's parameters; traced, so they can be fit.
    form: static; one of :data:`FORMS` (the module docstring). delta: the bm25+ / bm25l lower bound.

  Returns:
    ``[..., N]`` scores. Differentiable in ``k1`` and ``b``.

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import bm25_scores
    >>> doc_tf = jnp.array([[2, 0, 1], [0, 1, 0], [0, 0, 3]], jnp.float32)  # [N=3 items, V=3 terms]
    >>> query_tf = jnp.array([1, 0, 0], jnp.float32)  # the query holds term 0 once
    >>> [round(s, 3) for s in bm25_scores(query_tf, doc_tf).tolist()]  # only items holding term 0 score
    [0.668, 0.0, 0.0]
  """
  validation.check_embeddings('bm25_scores', query_tf, doc_tf, names=('query_tf', 'doc_tf'))
  check_knobs('bm25', 'bm25_scores', k1=k1, b=b, epsilon=epsilon, form=form, delta=delta)
  doc_tf = jnp.asarray(doc_tf)
  real = jnp.ones(doc_tf.shape[0], bool) if where is None else jnp.asarray(where, bool)
  tf = doc_tf * real[:, None]
  n, dl, avgdl = _length_stats(tf, real, form)
  idf = _idf(jnp.sum(tf > 0, axis=0), n, epsilon, form)
  sat = _term_weight(tf, (dl / avgdl)[:, None], k1, b, form, delta)
  s = jnp.einsum('...v,nv->...n', query_tf, sat * idf[None, :])
  return jnp.where(real, s, -jnp.inf)


# ---- soft twin: BM25 from per-question term statistics ------------------------------------------------------


def term_stats(
  ep: EpisodeArrays,
  n_q: int,
  epsilon: float,
  n_terms: int | None = None,
  *,
  tokenizer: str = _D['tokenizer'],
  form: str = _D['form'],
):
  """Per question: (term counts [Q, T, N], count x idf [Q, T], dl/avgdl [N]) with the form's idf and lengths; T =
  the most distinct in-vocabulary query terms of any question (or ``n_terms``). Read from the ``tokenizer``'s
  :class:`Lexicon` (a SciPy sparse matrix of the item counts; nothing ``[N, V]`` dense)."""
  lex = ep.lexicons[tokenizer]
  where = np.asarray(ep.where)
  terms = np.asarray(lex.doc_terms)
  counts = np.asarray(lex.doc_counts, np.float64) * where[:, None]
  n_items, width = terms.shape
  import scipy.sparse  # only when term counts are built (start-up cost)

  tf = scipy.sparse.csc_matrix(
    (counts.ravel(), (np.repeat(np.arange(n_items), width), terms.ravel())), shape=(n_items, lex.vocab_where.shape[-1])
  )  # duplicate (padding) entries add 0
  dl = counts.sum(-1)
  n = float(np.sum(where & (dl > 0) if form == 'lucene' else where))
  avgdl = dl.sum() / max(n, 1.0)
  if form == 'lucene':
    dl = np.asarray(lucene_length(dl, xp=np), np.float64)
  df = np.asarray((tf > 0).sum(0)).ravel().astype(np.float64)
  in_vocab = df > 0
  idf = np.asarray(_idf(df, n, epsilon, form, xp=np))
  q_terms, q_counts = np.asarray(lex.query_terms)[:n_q], np.asarray(lex.query_counts, np.float64)[:n_q]
  keep = (q_counts > 0) & in_vocab[q_terms]
  if n_terms is None:
    n_terms = max(int(np.max(keep.sum(-1), initial=0)), 1)
  out_tf = np.zeros((n_q, n_terms, n_items), np.float32)
  out_w = np.zeros((n_q, n_terms), np.float32)
  for i in range(n_q):
    cols, qc = q_terms[i][keep[i]], q_counts[i][keep[i]]
    if len(cols) > n_terms:
      raise ValueError(f'question {i} has {len(cols)} distinct terms > {n_terms}')
    out_tf[i, : len(cols)] = tf[:, cols].toarray().T
    out_w[i, : len(cols)] = qc * idf[cols]
  return out_tf, out_w, (dl / (avgdl if avgdl > 0 else 1.0)).astype(np.float32)


def bm25_from_stats(
  tf: Array,
  wq: Array,
  dlr: Array,
  *,
  k1: Array,
  b: Array,
  form: str = _D['form'],
  delta: ArrayLike = _D['delta'],
) -> Array:
  r"""BM25 from per-question term statistics: :math:`\sum_t w_t\,g(f_t, |d|/\mathrm{avgdl})` with the form's term
  weight :math:`g` (``'okapi'``: :math:`f (k_1 + 1) / (f + k_1 (1 - b + b\,|d|/\mathrm{avgdl}))`); equal to
  :func:`bm25_scores` (tested) and differentiable in ``k1`` and ``b``. Shapes: ``tf [..., T, N]``, ``wq [..., T]``,
  ``dlr [..., N]`` -> ``[..., N]``."""
  sat = _term_weight(tf, dlr[..., None, :], k1, b, form, delta)
  return jnp.einsum('...t,...tn->...n', wq, sat)


def bm25_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  k1: float = _D['k1'],
  b: float = _D['b'],
  epsilon: float = _D['epsilon'],
  tokenizer: str = _D['tokenizer'],
  form: str = _D['form'],
  delta: float = _D['delta'],
) -> Array:
  """BM25 scores ``[Q, N]`` of the ``form`` over the term counts of the analyzer ``tokenizer`` (``'words'``,
  ``'flat'`` for LongMemEval's official flat-bm25, ``'english'`` for Lucene's English analyzer, ...).

  Raises:
    ValueError: when ``ep`` was built without that tokenizer's term counts.
  """
  del key
  if tokenizer not in ep.lexicons:
    raise ValueError(
      f'bm25: tokenizer {tokenizer!r} has no term counts in these arrays (built with '
      f'{list(ep.lexicons)}); pass tokenizers=[..., {tokenizer!r}] to episode_arrays'
    )
  return bm25_sparse_scores(ep.lexicons[tokenizer], where=ep.where, k1=k1, b=b, epsilon=epsilon, form=form, delta=delta)


def term_rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options, settings) -> dict:
  """BM25's soft-twin rows (its ``SoftTwin.rows``; reusable by operators built on BM25): per question the term
  counts ``'tf' [Q, T, n_pad]``, count x idf ``'w' [Q, T]`` and ``'dlr' [Q, n_pad]`` (|d| / avgdl; pad with 1.0)."""
  del settings
  tf, w, dlr = term_stats(
    ep, n_questions, float(options['epsilon']), tokenizer=options['tokenizer'], form=options['form']
  )
  return {
    'tf': pools.pad_items(tf, n_pad, 0.0),
    'w': w,
    'dlr': pools.pad_items(np.broadcast_to(dlr, (n_questions, dlr.shape[0])), n_pad, 1.0),
  }


def term_scores(rows, values) -> Array:
  """BM25 ``[B, N]`` on a batch of :func:`term_rows` (no mask), differentiable in ``values['k1']``, ``['b']``."""
  return bm25_from_stats(
    rows['tf'],
    rows['w'],
    rows['dlr'],
    k1=values['k1'],
    b=values['b'],
    form=values.get('form', _D['form']),
    delta=values.get('delta', _D['delta']),
  )


TERM_FILL = {'dlr': 1.0}  # the padding of term_rows' entries when episodes of different sizes are stacked


def _soft(rows, values, ctx) -> Array:
  s = term_scores(rows, values)
  return jnp.where(ctx.where, s, -jnp.inf)


BM25 = register(
  Operator(
    name='bm25',
    leg=bm25_leg,
    doc="BM25 (rank_bm25's BM25Okapi semantics; form='lucene' with tokenizer='english': Lucene's)",
    knobs=KNOBS,
    soft=SoftTwin(rows=term_rows, scores=_soft, fill=TERM_FILL),
    needs=lambda options: {'tokenizers': (options['tokenizer'],)},
    vectors=False,
  )
)
