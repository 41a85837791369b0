"""Padded episode arrays: what every operator reads.

An :class:`EpisodeArrays` is one episode padded to bucketed shapes (items N, questions Q, vocabulary V), with masks
for the real entries: item and question embeddings, write positions, BM25 term counts and gold labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flax import struct
from jax import Array

from engram_jax.ops import bm25 as bm25_ops
from engram_jax.types import Episode


@struct.dataclass
class EpisodeArrays:
  """One episode, padded. Shapes: N items, Q questions, D dims, V vocabulary (all bucketed).

  ``doc_tf`` / ``query_tf`` / ``query_len`` use the default ``'words'`` tokenizer; ``lexicons[name]`` holds the
  ``(doc_tf [N, V'], query_tf [Q, V'])`` of every other tokenizer asked for in :func:`episode_arrays`
  (:data:`engram_jax.bm25_ops.TOKENIZERS`; e.g. ``'flat'`` for LongMemEval's flat-bm25).
  """

  docs: Array         # [N, D] unit-norm item embeddings
  where: Array        # [N] True for real items
  positions: Array    # [N] int32 write order (index)
  doc_tf: Array       # [N, V] term counts
  queries: Array      # [Q, D] unit-norm question embeddings
  query_tf: Array     # [Q, V]
  query_where: Array  # [Q] True for real questions
  query_len: Array    # [Q] number of query tokens (in or out of the vocabulary)
  labels: Array       # [Q, N] True for gold items
  lexicons: dict[str, tuple[Array, Array]] = struct.field(default_factory=dict)  # name -> (doc_tf, query_tf)


def bucket(n: int, multiple: int) -> int:
  """Round ``n`` up to a multiple of ``multiple`` (at least one multiple), so jit compiles a few shapes."""
  return max(multiple, -(-n // multiple) * multiple)


def episode_arrays(episode: Episode, doc_emb: np.ndarray, query_emb: np.ndarray, *, n_multiple: int = 128,
                   q_multiple: int = 64, v_multiple: int = 1024,
                   tokenizers: Sequence[str] = ('words',)) -> EpisodeArrays:
  """Pad one episode to bucketed shapes.

  Args:
    episode: the episode.
    doc_emb: ``[N_real, D]`` item embeddings (unit-norm).
    query_emb: ``[Q_real, D]`` question embeddings.
    tokenizers: names in :data:`engram_jax.bm25_ops.TOKENIZERS` whose term counts to build; ``'words'`` (the
      ``doc_tf`` / ``query_tf`` fields) is always built, each other one goes to ``lexicons[name]``.

  Raises:
    ValueError: on NaN/inf embeddings, shape mismatches (naming the episode) or an unknown tokenizer.
  """
  extra = [t for t in dict.fromkeys(tokenizers) if t != 'words']
  tokenize_fns = {t: bm25_ops.get_tokenizer(t) for t in extra}
  n, q = episode.n_items, len(episode.questions)
  if doc_emb.shape[0] != n or query_emb.shape[0] != q or doc_emb.shape[1:] != query_emb.shape[1:]:
    raise ValueError(f'Shape mismatch in episode {episode.id}: {n} items / {q} questions vs embeddings '
                     f'{doc_emb.shape} / {query_emb.shape}')
  for name, e in (('item', doc_emb), ('question', query_emb)):
    bad = ~np.all(np.isfinite(e), axis=-1)
    if bad.any():
      raise ValueError(f'Episode {episode.id}: {int(bad.sum())} {name} embeddings contain NaN/inf '
                       f'(first at row {int(np.argmax(bad))})')
  nb, qb = bucket(n, n_multiple), bucket(q, q_multiple)
  doc_toks = [bm25_ops.tokenize(it.text) for it in episode.items]
  vocab = bm25_ops.build_vocab(doc_toks)
  vb = bucket(len(vocab), v_multiple)
  docs = np.zeros((nb, doc_emb.shape[1]), np.float32)
  docs[:n] = doc_emb
  queries = np.zeros((qb, doc_emb.shape[1]), np.float32)
  queries[:q] = query_emb
  index = episode.index_of()
  q_toks = [bm25_ops.tokenize(x.text) for x in episode.questions]
  query_len = np.zeros(qb, np.int32)
  query_len[:q] = [len(t) for t in q_toks]
  labels = np.zeros((qb, nb), bool)
  for i, question in enumerate(episode.questions):
    labels[i, [index[g] for g in question.gold]] = True
  lexicons = {}
  for name, fn in tokenize_fns.items():
    d_toks = [fn(it.text) for it in episode.items]
    voc = bm25_ops.build_vocab(d_toks)
    vb_t = bucket(len(voc), v_multiple)
    lexicons[name] = (bm25_ops.term_counts(d_toks, voc, n_rows=nb, n_cols=vb_t),
                      bm25_ops.term_counts([fn(x.text) for x in episode.questions], voc, n_rows=qb, n_cols=vb_t))
  return EpisodeArrays(
      docs=docs, where=np.arange(nb) < n, positions=np.arange(nb, dtype=np.int32),
      doc_tf=bm25_ops.term_counts(doc_toks, vocab, n_rows=nb, n_cols=vb),
      queries=queries,
      query_tf=bm25_ops.term_counts(q_toks, vocab, n_rows=qb, n_cols=vb),
      query_where=np.arange(qb) < q, query_len=query_len, labels=labels, lexicons=lexicons)



def _pad_to(x: np.ndarray, shape: tuple[int, ...], fill=0) -> np.ndarray:
  x = np.asarray(x)
  return np.pad(x, [(0, s - d) for s, d in zip(shape, x.shape)], constant_values=fill)


def stack_arrays(arrays: Sequence[EpisodeArrays]) -> EpisodeArrays:
  """Episodes padded to common shapes (the largest N, Q, V of the list) and stacked on a leading episode axis
  ``[E, ...]``, so that a pipeline compiles once for them all and runs as one jitted map over episodes (the axis to
  shard across devices). Padded items and questions are masked as in :func:`episode_arrays`; ``positions`` keep
  counting past the real items, as there.
  """
  if not arrays:
    raise ValueError('stack_arrays: no episodes')
  n = max(a.docs.shape[0] for a in arrays)
  q = max(a.queries.shape[0] for a in arrays)
  v = max(a.doc_tf.shape[1] for a in arrays)
  names = list(arrays[0].lexicons)
  if any(list(a.lexicons) != names for a in arrays):
    raise ValueError('stack_arrays: episodes were built with different tokenizers')
  lex_v = {t: max(a.lexicons[t][0].shape[1] for a in arrays) for t in names}
  d = arrays[0].docs.shape[1]

  def stack(fn):
    return np.stack([fn(a) for a in arrays])

  return EpisodeArrays(
      docs=stack(lambda a: _pad_to(a.docs, (n, d))), where=stack(lambda a: _pad_to(a.where, (n,), False)),
      positions=np.broadcast_to(np.arange(n, dtype=np.int32), (len(arrays), n)).copy(),
      doc_tf=stack(lambda a: _pad_to(a.doc_tf, (n, v))), queries=stack(lambda a: _pad_to(a.queries, (q, d))),
      query_tf=stack(lambda a: _pad_to(a.query_tf, (q, v))),
      query_where=stack(lambda a: _pad_to(a.query_where, (q,), False)),
      query_len=stack(lambda a: _pad_to(a.query_len, (q,))), labels=stack(lambda a: _pad_to(a.labels, (q, n), False)),
      lexicons={t: (stack(lambda a, t=t: _pad_to(a.lexicons[t][0], (n, lex_v[t]))),
                    stack(lambda a, t=t: _pad_to(a.lexicons[t][1], (q, lex_v[t])))) for t in names})
