"""Small random padded episodes for operator checks (:func:`engram_jax.testing.check_operator`).

Each episode has its own item count (so the rows of a fit, padded to the largest, carry ragged masks), a few
questions (a batch of B >= 2 rows per episode), unit embeddings with a shared mean direction, near-duplicate items
written far apart (so a revision detector has something to find), texts over a small vocabulary that questions
share with their gold item (BM25 scores are not all 0) and the question cues of :mod:`engram_jax.core.features`.
Reproducible from a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from engram_jax.core import batch
from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.types import Episode, Item, Question

WORDS = tuple(f'w{i}' for i in range(40))
CUE_WORDS = ('now', 'when', 'how many', 'currently', 'before', 'total')


def random_episode(
  rng: np.random.Generator, n_items: int, n_questions: int, *, dim: int = 16, name: str = 'e'
) -> tuple[Episode, np.ndarray, np.ndarray]:
  """``(episode, docs [n_items, dim], queries [n_questions, dim])`` float32 unit rows.

  A third of the items restate an earlier one (cosine about 0.85, written at least a third of the episode later);
  each question is a noisy copy of a random item (its gold) and shares two of its words.
  """
  mean = rng.normal(size=dim)
  mean /= np.linalg.norm(mean)
  docs = 0.8 * mean + rng.normal(size=(n_items, dim)) / np.sqrt(dim)
  docs /= np.linalg.norm(docs, axis=-1, keepdims=True)
  for i in range(n_items // 3 + 1, n_items, 3):  # restatements of earlier items
    j = int(rng.integers(0, max(i - n_items // 3, 1)))
    v = docs[j] + 0.5 * rng.normal(size=dim) / np.sqrt(dim)
    docs[i] = v / np.linalg.norm(v)
  texts = [list(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(n_items)]
  gold = rng.choice(n_items, size=n_questions, replace=n_questions > n_items)
  queries = docs[gold] + 0.6 * rng.normal(size=(n_questions, dim)) / np.sqrt(dim)
  queries /= np.linalg.norm(queries, axis=-1, keepdims=True)
  items = tuple(
    Item(id=f'{name}:{i}', text=' '.join(t), parent=f'{name}:s{i // 5}', position=i) for i, t in enumerate(texts)
  )
  questions = []
  for j, g in enumerate(gold.tolist()):
    words = list(rng.choice(texts[g], size=2)) + list(rng.choice(WORDS, size=int(rng.integers(0, 3))))
    cue = [str(rng.choice(CUE_WORDS))] if rng.random() < 0.6 else []
    questions.append(
      Question(
        id=f'{name}/q{j}',
        text=' '.join(cue + words),
        gold=(items[g].id,),
        gold_parents=(items[g].parent,),
        category=j % 2,
      )
    )
  episode = Episode(id=name, items=items, questions=tuple(questions))
  return episode, docs.astype(np.float32), queries.astype(np.float32)


def random_padded_episodes(
  seed: int = 0,
  *,
  sizes: Sequence[int] = (35, 47, 60),
  n_questions: Sequence[int] = (3, 4, 3),
  dim: int = 16,
  tokenizers: Sequence[str] = ('words',),
  inputs: Mapping[str, Callable[[Episode], np.ndarray]] | None = None,
) -> tuple[list[Episode], list[EpisodeArrays]]:
  """Episodes of ``sizes`` items and ``n_questions`` questions each, padded as :func:`engram_jax.core.batch.episode_arrays`
  pads, into one shape (N to 64, Q to 4, V to 64: one compilation per operator setting), so every episode has
  padded items and (with fewer than 4 questions) padded questions. ``inputs``: the leg inputs to build
  (:func:`engram_jax.core.batch.episode_arrays`; the episodes drawn are the same for a seed, whatever ``inputs``)."""
  if not (32 < min(sizes) and max(sizes) <= 64 and 2 < min(n_questions) and max(n_questions) <= 4):
    raise ValueError(
      f'random_padded_episodes: 33..64 items and 3..4 questions per episode (one padded shape), got '
      f'{sizes}, {n_questions}'
    )
  if len(sizes) != len(n_questions) or min(n_questions) < 2:
    raise ValueError(f'random_padded_episodes: one question count (>= 2) per size, got {sizes}, {n_questions}')
  rng = np.random.default_rng(seed)
  drawn = [random_episode(rng, n, q, dim=dim, name=f'r{seed}-{e}') for e, (n, q) in enumerate(zip(sizes, n_questions))]
  episodes = [ep for ep, _, _ in drawn]
  arrays = [
    batch.episode_arrays(
      ep, docs, queries, n_multiple=64, q_multiple=4, v_multiple=64, tokenizers=tokenizers, inputs=inputs
    )
    for ep, docs, queries in drawn
  ]
  return episodes, arrays
