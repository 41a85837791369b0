"""Synthetic embedded episodes for tests and benchmarks: random unit-vector embeddings and Zipf texts, seeded.

An :class:`EmbeddedEpisode` is ``(episode, docs [N, D], queries [Q, D])``: an :class:`engram_jax.core.types.Episode` with
its unit-norm item and question embeddings, ready for :func:`engram_jax.core.batch.episode_arrays`.

* :func:`synthetic_episodes`: LoCoMo-sized episodes (N 370..690, 200 questions by default);
* :func:`scale_episode`: one episode of any size (up to 1e5 items and more), built in O(N) array code.

Each question's gold is the item its embedding and some of its words are copied from.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from engram_jax.core.types import Episode, Item, Question


class EmbeddedEpisode(NamedTuple):
  """One episode and its unit-norm embeddings ``docs [N, D]``, ``queries [Q, D]`` (float32)."""

  episode: Episode
  docs: np.ndarray
  queries: np.ndarray


def synthetic_episodes(
  *,
  n_episodes: int = 10,
  n_queries: int = 200,
  dim: int = 384,
  seed: int = 0,
  vocab: int = 3000,
  n_items: tuple[int, int] = (370, 690),
) -> list[EmbeddedEpisode]:
  """LoCoMo-sized random episodes: N in ``n_items`` (inclusive; LoCoMo: 370..690), ``n_queries`` questions.

  Items are unit vectors with a shared mean direction (cosines around 0.2, like sentence embeddings);
  each query is a noisy copy of a random item (its gold). Texts are Zipf-distributed words ``w<i>``; a query
  borrows up to 4 tokens of its source item.
  """
  rng = np.random.default_rng(seed)
  words = [f'w{i}' for i in range(vocab)]
  zipf = 1.0 / np.arange(1, vocab + 1)
  zipf /= zipf.sum()
  mean = rng.normal(size=dim)
  mean /= np.linalg.norm(mean)
  out = []
  for e in range(n_episodes):
    n = int(rng.integers(n_items[0], n_items[1] + 1))
    docs = 0.5 * mean + rng.normal(size=(n, dim)) / math.sqrt(dim)
    docs /= np.linalg.norm(docs, axis=-1, keepdims=True)
    src = rng.integers(0, n, size=n_queries)
    queries = docs[src] + 1.0 * rng.normal(size=(n_queries, dim)) / math.sqrt(dim)
    queries /= np.linalg.norm(queries, axis=-1, keepdims=True)
    doc_tokens = [list(rng.choice(words, size=int(rng.integers(5, 40)), p=zipf)) for _ in range(n)]
    query_tokens = []
    for s in src:
      own = list(rng.choice(doc_tokens[s], size=min(4, len(doc_tokens[s])), replace=False))
      query_tokens.append(own + list(rng.choice(words, size=int(rng.integers(2, 8)), p=zipf)))
    items = tuple(
      Item(id=f's{e}:{i}', text=' '.join(t), parent=f's{e}:p{i // 20}', position=i) for i, t in enumerate(doc_tokens)
    )
    questions = tuple(
      Question(id=f's{e}/q{j}', text=' '.join(t), gold=(items[s].id,), gold_parents=(items[s].parent,), category=0)
      for j, (s, t) in enumerate(zip(src.tolist(), query_tokens))
    )
    out.append(
      EmbeddedEpisode(
        Episode(id=f'synthetic-{e}', items=items, questions=questions),
        docs.astype(np.float32),
        queries.astype(np.float32),
      )
    )
  return out


def scale_episode(
  n_items: int, n_queries: int, *, dim: int = 384, vocab: int = 50_000, seed: int = 0, texts: bool = True
) -> EmbeddedEpisode:
  """One synthetic episode of ``n_items`` items and ``n_queries`` questions, built in O(N) array code.

  Embeddings as in :func:`synthetic_episodes` (unit vectors around a shared mean direction; each query a noisy copy
  of a random item, its gold). Texts: 20-30 words per item drawn from a Zipf(1) vocabulary of ``vocab`` words
  ``w<i>`` (so the distinct words grow with N, about 8k at 1e3 items and 50k at 1e5); a query is 4 words of its
  source item and 4 Zipf words. ``texts=False`` leaves every text empty (for operators that read embeddings only).
  The draw depends on ``(seed, n_items)`` only.
  """
  rng = np.random.default_rng([seed, n_items])
  mean = rng.standard_normal(dim).astype(np.float32)
  mean /= np.linalg.norm(mean)
  docs = 0.5 * mean + rng.standard_normal((n_items, dim), dtype=np.float32) / np.float32(math.sqrt(dim))
  docs /= np.linalg.norm(docs, axis=-1, keepdims=True)
  src = rng.integers(0, n_items, size=n_queries)
  queries = docs[src] + rng.standard_normal((n_queries, dim), dtype=np.float32) / np.float32(math.sqrt(dim))
  queries /= np.linalg.norm(queries, axis=-1, keepdims=True)
  doc_texts, query_texts = [''] * n_items, [''] * n_queries
  if texts:
    cdf = np.cumsum(1.0 / np.arange(1, vocab + 1))
    cdf /= cdf[-1]
    zipf = lambda size: np.minimum(np.searchsorted(cdf, rng.random(size)), vocab - 1)
    words = np.array([f'w{i}' for i in range(vocab)])
    lengths = rng.integers(20, 31, size=n_items)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    ids = zipf(int(starts[-1]))
    doc_texts = [' '.join(words[ids[a:b]]) for a, b in zip(starts[:-1], starts[1:])]
    own = ids[starts[src][:, None] + (rng.random((n_queries, 4)) * lengths[src][:, None]).astype(np.int64)]
    q_ids = np.concatenate([own, zipf((n_queries, 4))], axis=1)
    query_texts = [' '.join(words[row]) for row in q_ids]
  items = tuple(Item(id=f'i{i}', text=t, parent=f'p{i // 20}', position=i) for i, t in enumerate(doc_texts))
  questions = tuple(
    Question(id=f'q{j}', text=t, gold=(f'i{s}',), gold_parents=(f'p{s // 20}',), category=0)
    for j, (s, t) in enumerate(zip(src.tolist(), query_texts))
  )
  return EmbeddedEpisode(Episode(id=f'scale-{n_items}', items=items, questions=questions), docs, queries)


def toy_fit_data(n_episodes: int = 2, *, seed: int = 0):
  """Tiny episodes for the fitting examples: 30 items of 6 random words each, 12 questions that repeat their gold
  item's text (so BM25 finds them and cosine, on random 8-d vectors, mostly does not), and an RRF pipeline of a
  cosine and a BM25 leg.

  Returns:
    ``(episodes, embeddings, arrays, pipe)``: the episodes, their ``(items [30, 8], questions [12, 8])`` unit-norm
    embeddings, their padded arrays and the pipeline (named ``hybrid``).

  Example:
    >>> from engram_jax.testing.synthetic import toy_fit_data
    >>> episodes, embeddings, arrays, pipe = toy_fit_data()
    >>> len(episodes), len(episodes[0].questions), [leg.op for leg in pipe.legs]
    (2, 12, ['cosine', 'bm25'])
  """
  from engram_jax.core.batch import episode_arrays  # here: JAX only when the toy data is asked for
  from engram_jax.eval.pipeline import make_pipeline

  rng = np.random.default_rng(seed)
  words = [f'w{i}' for i in range(30)]
  episodes, embeddings = [], []
  for e in range(n_episodes):
    items = tuple(Item(f'e{e}i{i}', ' '.join(rng.choice(words, 6)), 's', i) for i in range(30))
    questions = tuple(Question(f'e{e}q{j}', items[j].text, (items[j].id,), ('s',), 1) for j in range(12))
    docs = rng.normal(size=(30, 8))
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    episodes.append(Episode(f'e{e}', items, questions))
    embeddings.append((docs, docs[:12]))
  arrays = [episode_arrays(ep, *emb) for ep, emb in zip(episodes, embeddings)]
  pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, fusion='rrf', name='hybrid')
  return episodes, embeddings, arrays, pipe
