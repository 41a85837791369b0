"""BM25 with the exact Okapi semantics of ``rank_bm25.BM25Okapi`` (v0.2.2), as a pure JAX function.

rank_bm25 computes, for a tokenised corpus of ``n`` documents,

* ``df[t]`` = number of documents containing ``t``; ``avgdl`` = mean document length in tokens;
* ``idf[t] = log(n - df[t] + 0.5) - log(df[t] + 0.5)``; every *negative* idf is replaced by
  ``epsilon * mean(idf over the corpus vocabulary)`` (an idf of exactly 0 stays 0);
* ``score(q, d) = sum over query tokens t (with repetition) of
  idf[t] * tf[t,d] (k1 + 1) / (tf[t,d] + k1 (1 - b + b |d| / avgdl))``; tokens absent from the corpus add 0.

One deliberate difference: for an empty document with ``b == 1`` rank_bm25 computes 0/0 and returns
NaN; here a term absent from a document always contributes 0.

Here documents and queries are term-count vectors over the episode's vocabulary, so the sum over
query tokens with repetition is a matrix product with the query's term counts. The tokeniser is
ours (lower-case, ``\\w+`` runs): rank_bm25 takes pre-tokenised text and so it is part of the config.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

_TOKEN = re.compile(r'\w+')


def tokenize(text: str) -> list[str]:
  """Lower-case word tokens (``\\w+``)."""
  return _TOKEN.findall(text.lower())


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
