"""BM25: the exact Okapi semantics of ``rank_bm25.BM25Okapi`` (v0.2.2), as a pure JAX function.

rank_bm25 computes, for a tokenised corpus of ``n`` documents,

* ``df[t]`` = number of documents containing ``t``; ``avgdl`` = mean document length in tokens;
* ``idf[t] = log(n - df[t] + 0.5) - log(df[t] + 0.5)``; every *negative* idf is replaced by
  ``epsilon * mean(idf over the corpus vocabulary)`` (an idf of exactly 0 stays 0);
* ``score(q, d) = sum over query tokens t (with repetition) of
  idf[t] * tf[t,d] (k1 + 1) / (tf[t,d] + k1 (1 - b + b |d| / avgdl))``; tokens absent from the corpus add 0.

One deliberate difference: for an empty document with ``b == 1`` rank_bm25 computes 0/0 and returns
NaN; here a term absent from a document always contributes 0.

Here documents and queries are term-count vectors over the episode's vocabulary, so the sum over
query tokens with repetition is a matrix product with the query's term counts. rank_bm25 takes
pre-tokenised text, so the tokeniser is part of the config (:data:`TOKENIZERS`):

* ``'words'`` (:func:`tokenize`, the default): lower-case ``\\w+`` runs;
* ``'flat'`` (:func:`flat_tokenize`): LongMemEval's official ``flat-bm25`` retriever
  (``run_retrieval.py``: ``BM25Okapi([doc.split(" ") for doc in corpus]).get_scores(query.split(" "))``):
  split on single spaces, case kept, punctuation kept, ``''`` tokens kept, an empty text is ``['']``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from engram_jax.ops import pools
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
  df = jnp.sum(tf > 0, axis=0)
  in_vocab = df > 0
  idf = jnp.log(n - df + 0.5) - jnp.log(df + 0.5)
  idf = jnp.where(in_vocab, idf, 0.0)
  mean_idf = jnp.sum(idf) / jnp.maximum(jnp.sum(in_vocab), 1)
  idf = jnp.where(in_vocab & (idf < 0), epsilon * mean_idf, idf)
  norm = k1 * (1.0 - b + b * dl / jnp.where(avgdl > 0, avgdl, 1.0))
  sat = tf * (k1 + 1.0) / (tf + norm[:, None])
  sat = jnp.where(tf > 0, sat, 0.0)  # 0/0 guard for empty documents
  s = jnp.einsum('...v,nv->...n', query_tf, sat * idf[None, :])
  return jnp.where(real, s, -jnp.inf)


# ---- soft twin: BM25 from per-question term statistics ------------------------------------------------------

def term_stats(ep: EpisodeArrays, n_q: int, epsilon: float, n_terms: int | None = None):
  """Per question: (term counts [Q, T, N], count x idf [Q, T], dl/avgdl [N]) with rank_bm25's idf; T = the most
  distinct in-vocabulary query terms of any question (or ``n_terms``)."""
  tf = np.asarray(ep.doc_tf, np.float64) * np.asarray(ep.where)[:, None]
  n = float(np.sum(ep.where))
  dl = tf.sum(-1)
  avgdl = dl.sum() / max(n, 1.0)
  df = (tf > 0).sum(0)
  in_vocab = df > 0
  idf = np.where(in_vocab, np.log(n - df + 0.5) - np.log(df + 0.5), 0.0)
  mean_idf = idf.sum() / max(in_vocab.sum(), 1)
  idf = np.where(in_vocab & (idf < 0), epsilon * mean_idf, idf)
  qtf = np.asarray(ep.query_tf)[:n_q]
  if n_terms is None:
    n_terms = max(int(np.max(np.sum((qtf > 0) & in_vocab, axis=-1), initial=0)), 1)
  out_tf = np.zeros((n_q, n_terms, tf.shape[0]), np.float32)
  out_w = np.zeros((n_q, n_terms), np.float32)
  for i in range(n_q):
    cols = np.flatnonzero((qtf[i] > 0) & in_vocab)
    if len(cols) > n_terms:
      raise ValueError(f'question {i} has {len(cols)} distinct terms > {n_terms}')
    out_tf[i, :len(cols)] = tf[:, cols].T
    out_w[i, :len(cols)] = qtf[i, cols] * idf[cols]
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
  if tokenizer == 'words':
    query_tf, doc_tf = ep.query_tf, ep.doc_tf
  elif tokenizer in ep.lexicons:
    doc_tf, query_tf = ep.lexicons[tokenizer]
  else:
    raise ValueError(f'bm25: tokenizer {tokenizer!r} has no term counts in these arrays (built with '
                     f"{['words', *ep.lexicons]}); pass tokenizers=[..., {tokenizer!r}] to episode_arrays")
  return bm25_scores(query_tf, doc_tf, where=ep.where, k1=k1, b=b, epsilon=epsilon)


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
