"""Tokenizers and sparse term statistics: what BM25 reads, built once per episode on the host.

A :class:`Lexicon` holds one tokenizer's term statistics of an episode: each item's distinct terms (vocabulary
columns, ascending) and their counts ``[N, L]``, each question's distinct in-vocabulary terms and counts ``[Q, T]``,
and the vocabulary mask ``[V]``; nothing ``[N, V]`` is built. :func:`engram_jax.core.batch.episode_arrays` builds one per
tokenizer asked for (:data:`TOKENIZERS`); :mod:`engram_jax.ops.bm25` scores from it. This module imports no
operator, so the episode arrays and the operators import in one direction (``lexicon <- batch <- ops``).

* ``'words'`` (:func:`tokenize`, the default): lower-case ``\\w+`` runs;
* ``'flat'`` (:func:`flat_tokenize`): LongMemEval's official ``flat-bm25`` tokens (``text.split(' ')``, case kept,
  punctuation kept, ``''`` tokens kept, an empty text is ``['']``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
from jax import Array

from engram_jax.core import pytree
from engram_jax.core.padding import bucket

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


def term_counts(
  tokens: Sequence[Sequence[str]], vocab: dict[str, int], *, n_rows: int | None = None, n_cols: int | None = None
) -> np.ndarray:
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


@pytree.dataclass
class Lexicon:
  """One tokenizer's sparse term statistics of an episode (padded; ``L``, ``T``, ``V`` bucketed).

  Padding entries have column 0 and count 0 (they add exactly 0 to every sum).
  """

  doc_terms: Array  # [N, L] int32 vocabulary column of each distinct term of each item, ascending
  doc_counts: Array  # [N, L] float32 its count in the item
  query_terms: Array  # [Q, T] int32 distinct in-vocabulary query terms, ascending
  query_counts: Array  # [Q, T] float32 their counts in the question (repetition kept)
  vocab_where: Array  # [V] True for real vocabulary columns (the static vocabulary size)

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
      terms[r, : len(cols)] = cols
      counts[r, : len(cols)] = [c[x] for x in cols]
  return terms, counts


def build_lexicon(
  doc_tokens: Sequence[Sequence[str]],
  query_tokens: Sequence[Sequence[str]],
  *,
  n_rows: int,
  q_rows: int,
  l_multiple: int = 16,
  t_multiple: int = 8,
  v_multiple: int = 1024,
  vocab: dict[str, int] | None = None,
) -> Lexicon:
  """The :class:`Lexicon` of tokenised items and questions; the vocabulary is the items' (first-seen order) unless
  ``vocab`` is given, and query tokens outside it are dropped (they add 0 in rank_bm25 too).

  Args:
    doc_tokens: N token lists; query_tokens: Q token lists.
    n_rows, q_rows: padded N and Q (>= the real counts).
    l_multiple, t_multiple, v_multiple: bucket multiples of L, T and V (few distinct shapes, few compilations).
  """
  if n_rows < len(doc_tokens) or q_rows < len(query_tokens):
    raise ValueError(
      f'Shape mismatch: padding ({n_rows}, {q_rows}) smaller than ({len(doc_tokens)}, {len(query_tokens)})'
    )
  vocab = build_vocab(doc_tokens) if vocab is None else vocab
  d_ids = [[vocab[t] for t in toks] for toks in doc_tokens]
  q_ids = [[vocab[t] for t in toks if t in vocab] for toks in query_tokens]
  width = lambda rows, m: bucket(max((len(set(r)) for r in rows), default=1), m)
  doc_terms, doc_counts = _sparse_rows(d_ids, n_rows, width(d_ids, l_multiple))
  query_terms, query_counts = _sparse_rows(q_ids, q_rows, width(q_ids, t_multiple))
  v = bucket(max(len(vocab), 1), v_multiple)
  return Lexicon(
    doc_terms=doc_terms,
    doc_counts=doc_counts,
    query_terms=query_terms,
    query_counts=query_counts,
    vocab_where=np.arange(v) < len(vocab),
  )
