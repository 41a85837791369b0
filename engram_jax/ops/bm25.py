"""BM25: the exact Okapi semantics of ``rank_bm25.BM25Okapi`` (v0.2.2), as a pure JAX function.

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
pre-tokenised text, so the tokeniser is part of the config (:data:`TOKENIZERS`):

* ``'words'`` (:func:`tokenize`, the default): lower-case ``\\w+`` runs;
* ``'flat'`` (:func:`flat_tokenize`): LongMemEval's official ``flat-bm25`` retriever
  (``run_retrieval.py``: ``BM25Okapi([doc.split(" ") for doc in corpus]).get_scores(query.split(" "))``):
  split on single spaces, case kept, punctuation kept, ``''`` tokens kept, an empty text is ``['']``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array
from jax.typing import ArrayLike

from engram_jax.ops import pools
from engram_jax.shapes import bucket
from engram_jax.ops.registry import Knob, Operator, SoftTwin, register

if TYPE_CHECKING:  # a type only: engram_jax.batch imports the BM25 tokenizers from here
  from engram_jax.batch import EpisodeArrays

_TOKEN = re.compile(r'\w+')


def tokenize(text: str) -> list[str]:
  """Lower-case word tokens (``\\w+``)."""
  return _TOKEN.findall(text.lower())


def flat_tokenize(text: str) -> list[str]:
  """LongMemEval ``flat-bm25`` tokens: ``text.split(' ')`` (case-sensitive; ``''`` tokens kept)."""
  return text.split(' ')


TOKENIZERS = {'words': tokenize, 'flat': flat_tokenize}


def get_tokenizer(name: str) -> Callable[[str], list[str]]:
  """The tokenizer named ``name`` (a key of :data:`TOKENIZERS`); ValueError on unknown names."""
  if name not in TOKENIZERS:
    raise ValueError(f'Unknown tokenizer {name!r}; known: {sorted(TOKENIZERS)}')
  return TOKENIZERS[name]


def build_vocab(docs_tokens: Sequence[Sequence[str]]) -> dict[str, int]:
  """Token -> column, in first-seen order over the corpus."""
  vocab: dict[str, int] = {}
  for toks in docs_tokens:
    for t in toks:
      if t not in vocab:
        vocab[t] = len(vocab)
  return vocab


def term_counts(tokens: Sequence[Sequence[str]], vocab: dict[str, int], *, n_rows: int | None = None,
                n_cols: int | None = None) -> np.ndarray:
  """Term-count matrix ``[R, V]`` (float32); out-of-vocabulary tokens are ignored, rows/cols zero-padded.

  Args:
    tokens: R token lists.
    vocab: token -> column.
    n_rows, n_cols: padded sizes (>= R and >= len(vocab)).
  """
  n_rows = len(tokens) if n_rows is None else n_rows
  n_cols = len(vocab) if n_cols is None else n_cols
  if n_rows < len(tokens) or n_cols < len(vocab):
    raise ValueError(f'Shape mismatch: padding ({n_rows}, {n_cols}) smaller than ({len(tokens)}, {len(vocab)})')
  out = np.zeros((n_rows, n_cols), np.float32)
  for r, toks in enumerate(tokens):
    for t in toks:
      c = vocab.get(t)
      if c is not None:
        out[r, c] += 1.0
  return out


@struct.dataclass
class Lexicon:
  """One tokenizer's sparse term statistics of an episode (padded; ``L``, ``T``, ``V`` bucketed).

  Padding entries have column 0 and count 0 (they add exactly 0 to every sum).
  """

  doc_terms: Array     # [N, L] int32 vocabulary column of each distinct term of each item, ascending
  doc_counts: Array    # [N, L] float32 its count in the item
  query_terms: Array   # [Q, T] int32 distinct in-vocabulary query terms, ascending
  query_counts: Array  # [Q, T] float32 their counts in the question (repetition kept)
  vocab_where: Array   # [V] True for real vocabulary columns (the static vocabulary size)

  def dense(self) -> tuple[np.ndarray, np.ndarray]:
    """``(query_tf [Q, V], doc_tf [N, V])`` dense term counts (NumPy; for tests and small references)."""
    v = self.vocab_where.shape[-1]
    out = []
    for terms, counts in ((self.query_terms, self.query_counts), (self.doc_terms, self.doc_counts)):
      terms, counts = np.asarray(terms), np.asarray(counts)
      m = np.zeros((terms.shape[0], v), np.float32)
      np.add.at(m, (np.arange(terms.shape[0])[:, None], terms), counts)
      out.append(m)
    return out[0], out[1]


def _sparse_rows(rows: Sequence[Sequence[int]], n_rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Distinct ids (ascending) and their counts of each row, padded to ``[n_rows, width]`` (id 0, count 0)."""
  terms = np.zeros((n_rows, width), np.int32)
  counts = np.zeros((n_rows, width), np.float32)
  for r, ids in enumerate(rows):
    if ids:
      c = Counter(ids)
      cols = sorted(c)
      terms[r, :len(cols)] = cols
      counts[r, :len(cols)] = [c[x] for x in cols]
  return terms, counts


def build_lexicon(doc_tokens: Sequence[Sequence[str]], query_tokens: Sequence[Sequence[str]], *, n_rows: int,
                  q_rows: int, l_multiple: int = 16, t_multiple: int = 8, v_multiple: int = 1024,
                  vocab: dict[str, int] | None = None) -> Lexicon:
  """The :class:`Lexicon` of tokenised items and questions; the vocabulary is the items' (first-seen order) unless
  ``vocab`` is given, and query tokens outside it are dropped (they add 0 in rank_bm25 too).

  Args:
    doc_tokens: N token lists; query_tokens: Q token lists.
    n_rows, q_rows: padded N and Q (>= the real counts).
    l_multiple, t_multiple, v_multiple: bucket multiples of L, T and V (few distinct shapes, few compilations).
  """
  if n_rows < len(doc_tokens) or q_rows < len(query_tokens):
    raise ValueError(f'Shape mismatch: padding ({n_rows}, {q_rows}) smaller than ({len(doc_tokens)}, '
                     f'{len(query_tokens)})')
  vocab = build_vocab(doc_tokens) if vocab is None else vocab
  d_ids = [[vocab[t] for t in toks] for toks in doc_tokens]
  q_ids = [[vocab[t] for t in toks if t in vocab] for toks in query_tokens]
  width = lambda rows, m: bucket(max((len(set(r)) for r in rows), default=1), m)
  doc_terms, doc_counts = _sparse_rows(d_ids, n_rows, width(d_ids, l_multiple))
  query_terms, query_counts = _sparse_rows(q_ids, q_rows, width(q_ids, t_multiple))
  v = bucket(max(len(vocab), 1), v_multiple)
  return Lexicon(doc_terms=doc_terms, doc_counts=doc_counts, query_terms=query_terms, query_counts=query_counts,
                 vocab_where=np.arange(v) < len(vocab))


def _idf(df: Array, n: Array, epsilon: ArrayLike) -> Array:
  """rank_bm25's idf over vocabulary columns with ``df > 0`` (0 elsewhere), negative idf floored at
  ``epsilon x`` the mean idf."""
  in_vocab = df > 0
  idf = jnp.log(n - df + 0.5) - jnp.log(df + 0.5)
  idf = jnp.where(in_vocab, idf, 0.0)
  mean_idf = jnp.sum(idf) / jnp.maximum(jnp.sum(in_vocab), 1)
  return jnp.where(in_vocab & (idf < 0), epsilon * mean_idf, idf)


# Elements of a chunk's [N, L, B] gather in bm25_sparse_scores (64 MB of float32): B = 32 questions up to
# N x L = 2^19 (LoCoMo episodes: N x L <= 768 x 80), fewer beyond.
GATHER_BUDGET = 1 << 24


def bm25_sparse_scores(lex: Lexicon, *, where: Array | None = None, k1: ArrayLike = 1.5, b: ArrayLike = 0.75,
                       epsilon: ArrayLike = 0.25, batch_size: int | None = 32) -> Array:
  r"""Okapi BM25 scores from sparse term statistics; equal to :func:`bm25_scores` on the dense counts (tested) and
  to ``rank_bm25.BM25Okapi``.

  Per item, the score is a sum over its own distinct terms :math:`t` of :math:`q_t\,\mathrm{idf}_t\,
  f_{t,d}(k_1+1)/(f_{t,d} + k_1(1-b+b|d|/\mathrm{avgdl}))`, with :math:`q_t` gathered from the question's
  count table (``[V, batch_size]``, built ``batch_size`` questions at a time). Cost ``N x L x Q``; memory
  ``[N, L]`` weights and an ``[N, L, batch_size]`` gather per chunk; no ``[N, V]``.

  Args:
    lex: the episode's :class:`Lexicon` (``doc_* [N, L]``, ``query_* [Q, T]``, ``vocab_where [V]``).
    where: ``[N]`` True for real items; statistics use real items only and masked items score ``-inf``.
    k1, b, epsilon: BM25Okapi's parameters; traced (differentiable in ``k1`` and ``b``).
    batch_size: static; questions per chunk (``lax.map``), lowered so that a chunk's gather stays within
      :data:`GATHER_BUDGET` elements; ``None`` = all at once.

  Returns:
    ``[Q, N]`` scores.
  """
  terms = jnp.asarray(lex.doc_terms)
  n_items = terms.shape[0]
  real = jnp.ones(n_items, bool) if where is None else jnp.asarray(where, bool)
  tf = jnp.asarray(lex.doc_counts) * real[:, None]
  n = jnp.sum(real)
  dl = jnp.sum(tf, axis=-1)
  avgdl = jnp.sum(dl) / jnp.maximum(n, 1)
  v = lex.vocab_where.shape[-1]
  df = jnp.zeros(v, tf.dtype).at[terms].add((tf > 0).astype(tf.dtype))
  idf = _idf(df, n, epsilon)
  norm = k1 * (1.0 - b + b * dl / jnp.where(avgdl > 0, avgdl, 1.0))
  sat = jnp.where(tf > 0, tf * (k1 + 1.0) / (tf + norm[:, None]), 0.0)  # 0/0 guard for empty items
  weight = sat * idf[terms]  # [N, L]

  def chunk(args):
    q_terms, q_counts = args  # [B, T]
    cols = jnp.arange(q_terms.shape[0])[None, :]
    q_rows = jnp.zeros((v, q_terms.shape[0]), weight.dtype).at[q_terms.T, cols].add(
        q_counts.T.astype(weight.dtype))  # [V, B]: a question's count of each term, questions contiguous
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


def bm25_scores(query_tf: Array, doc_tf: Array, *, where: Array | None = None, k1: ArrayLike = 1.5,
                b: ArrayLike = 0.75, epsilon: ArrayLike = 0.25) -> Array:
  r"""Okapi BM25 scores, equal to ``rank_bm25.BM25Okapi(corpus).get_scores(query)``.

  Definition:
    .. math::
      s(q, d) = \sum_t q_t \, \mathrm{idf}_t \frac{f_{t,d}(k_1+1)}{f_{t,d} + k_1(1 - b + b\,|d|/\mathrm{avgdl})}

  Args:
    query_tf: ``[..., V]`` query term counts over the corpus vocabulary.
    doc_tf: ``[N, V]`` document term counts (padded rows and columns are zero).
    where: ``[N]`` True for real documents; statistics (n, df, avgdl) use real documents only, and
      masked documents score ``-inf``.
    k1, b, epsilon: BM25Okapi's parameters; traced, so they can be fit.

  Returns:
    ``[..., N]`` scores. Differentiable in ``k1`` and ``b``.
  """
  doc_tf = jnp.asarray(doc_tf)
  real = jnp.ones(doc_tf.shape[0], bool) if where is None else jnp.asarray(where, bool)
  tf = doc_tf * real[:, None]
  n = jnp.sum(real)
  dl = jnp.sum(tf, axis=-1)
  avgdl = jnp.sum(dl) / jnp.maximum(n, 1)
  idf = _idf(jnp.sum(tf > 0, axis=0), n, epsilon)
  norm = k1 * (1.0 - b + b * dl / jnp.where(avgdl > 0, avgdl, 1.0))
  sat = tf * (k1 + 1.0) / (tf + norm[:, None])
  sat = jnp.where(tf > 0, sat, 0.0)  # 0/0 guard for empty documents
  s = jnp.einsum('...v,nv->...n', query_tf, sat * idf[None, :])
  return jnp.where(real, s, -jnp.inf)


# ---- soft twin: BM25 from per-question term statistics ------------------------------------------------------

def term_stats(ep: EpisodeArrays, n_q: int, epsilon: float, n_terms: int | None = None):
  """Per question: (term counts [Q, T, N], count x idf [Q, T], dl/avgdl [N]) with rank_bm25's idf; T = the most
  distinct in-vocabulary query terms of any question (or ``n_terms``). Read from the ``'words'`` :class:`Lexicon`
  (a SciPy sparse matrix of the item counts; nothing ``[N, V]`` dense)."""
  lex = ep.lexicons['words']
  where = np.asarray(ep.where)
  terms = np.asarray(lex.doc_terms)
  counts = np.asarray(lex.doc_counts, np.float64) * where[:, None]
  n_items, width = terms.shape
  import scipy.sparse  # pylint: disable=import-outside-toplevel  # only when term counts are built (start-up cost)
  tf = scipy.sparse.csc_matrix((counts.ravel(), (np.repeat(np.arange(n_items), width), terms.ravel())),
                               shape=(n_items, lex.vocab_where.shape[-1]))  # duplicate (padding) entries add 0
  n = float(np.sum(where))
  dl = counts.sum(-1)
  avgdl = dl.sum() / max(n, 1.0)
  df = np.asarray((tf > 0).sum(0)).ravel()
  in_vocab = df > 0
  idf = np.where(in_vocab, np.log(n - df + 0.5) - np.log(df + 0.5), 0.0)
  mean_idf = idf.sum() / max(in_vocab.sum(), 1)
  idf = np.where(in_vocab & (idf < 0), epsilon * mean_idf, idf)
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
    out_tf[i, :len(cols)] = tf[:, cols].toarray().T
    out_w[i, :len(cols)] = qc * idf[cols]
  return out_tf, out_w, (dl / (avgdl if avgdl > 0 else 1.0)).astype(np.float32)


def bm25_from_stats(tf: Array, wq: Array, dlr: Array, *, k1: Array, b: Array) -> Array:
  r"""BM25 from per-question term statistics: :math:`\sum_t w_t f_t (k_1 + 1) / (f_t + k_1 (1 - b + b\,
  |d|/\mathrm{avgdl}))`; equal to :func:`bm25_scores` (tested) and differentiable in
  ``k1`` and ``b``. Shapes: ``tf [..., T, N]``, ``wq [..., T]``, ``dlr [..., N]`` -> ``[..., N]``."""
  norm = k1 * (1.0 - b + b * dlr)[..., None, :]
  sat = jnp.where(tf > 0, tf * (k1 + 1.0) / (tf + norm), 0.0)
  return jnp.einsum('...t,...tn->...n', wq, sat)



def bm25_leg(ep: EpisodeArrays, key: Array, *, k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25,
             tokenizer: str = 'words') -> Array:
  """BM25Okapi scores ``[Q, N]`` over the term counts of ``tokenizer`` (``'words'``, or ``'flat'`` for
  LongMemEval's official flat-bm25).

  Raises:
    ValueError: when ``ep`` was built without that tokenizer's term counts.
  """
  del key
  if tokenizer not in ep.lexicons:
    raise ValueError(f'bm25: tokenizer {tokenizer!r} has no term counts in these arrays (built with '
                     f'{list(ep.lexicons)}); pass tokenizers=[..., {tokenizer!r}] to episode_arrays')
  return bm25_sparse_scores(ep.lexicons[tokenizer], where=ep.where, k1=k1, b=b, epsilon=epsilon)


def _rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options, settings) -> dict:
  del settings
  if options['tokenizer'] != 'words':
    raise ValueError(f"fitting BM25 is supported with the 'words' tokenizer, got {options['tokenizer']!r}")
  tf, w, dlr = term_stats(ep, n_questions, float(options['epsilon']))
  return {'tf': pools.pad_items(tf, n_pad, 0.0), 'w': w,
          'dlr': pools.pad_items(np.broadcast_to(dlr, (n_questions, dlr.shape[0])), n_pad, 1.0)}


def _soft(rows, values, ctx) -> Array:
  s = bm25_from_stats(rows['tf'], rows['w'], rows['dlr'], k1=values['k1'], b=values['b'])
  return jnp.where(ctx.where, s, -jnp.inf)


BM25 = register(Operator(
    name='bm25', leg=bm25_leg, doc="Okapi BM25 (rank_bm25's BM25Okapi semantics)",
    knobs=(Knob('k1', 1.5, transform='log', check='>0', doc='BM25 term saturation'),
           Knob('b', 0.75, transform='logit', check='[0,1]', doc='BM25 length normalisation'),
           Knob('epsilon', 0.25, static=True, check='>=0', doc='BM25 idf floor factor'),
           Knob('tokenizer', 'words', static=True, check=tuple(TOKENIZERS), doc='term tokenizer')),
    soft=SoftTwin(rows=_rows, scores=_soft, fill={'dlr': 1.0}),
    needs=lambda options: {'tokenizers': (options['tokenizer'],)}))
