"""Splits for fitting: cross-fitting folds and hold-out splits by episode, asserted disjoint in code.

Content-level disjointness (question text, corpus fingerprint) is
:func:`engram_jax.data.splits.assert_disjoint_content`, which every fit path calls on the episodes;
:func:`check_disjoint` asserts the rows by question id.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from engram_jax.core.errors import EngramError
from engram_jax.data import splits

DEFAULT_SEED = splits.PILOT_SEED  # 20261008


def episode_folds(episode_ids: Sequence[str], *, n_folds: int, seed: int = DEFAULT_SEED) -> list[list[str]]:
  """Split episodes into ``n_folds`` folds: sorted ids shuffled by ``random.Random(seed)``, dealt round-robin.

  With as many folds as episodes (LoCoMo: 10 conversations, 10 folds) every fold is one episode.

  Example:
    >>> from engram_jax.fit import episode_folds
    >>> folds = episode_folds([f'conv-{i}' for i in range(5)], n_folds=2, seed=0)
    >>> sorted(len(f) for f in folds), sorted(sum(folds, [])) == sorted(f'conv-{i}' for i in range(5))
    ([2, 3], True)
  """
  ids = sorted(set(episode_ids))
  if not 2 <= n_folds <= len(ids):
    raise EngramError(f'fit.folds must be between 2 and {len(ids)} (the number of episodes), got {n_folds}')
  random.Random(seed).shuffle(ids)
  return [sorted(ids[i::n_folds]) for i in range(n_folds)]


def holdout_split(episode_ids: Sequence[str], *, n_test: int, seed: int = DEFAULT_SEED) -> tuple[list[str], list[str]]:
  """``(train, test)`` episode ids: ``n_test`` test episodes drawn by ``random.Random(seed)``, the rest train.

  Raises:
    EngramError: unless ``1 <= n_test < number of distinct episodes`` (both sides must be non-empty).
  """
  n = len(set(episode_ids))
  if not 1 <= n_test < n:
    raise EngramError(
      f'fit.n_test must be between 1 and {n - 1} (the number of episodes minus one, so that '
      f'training and test are both non-empty), got {n_test}'
    )
  test = splits.draw_ids(episode_ids, n=n_test, seed=seed)
  train = sorted(set(episode_ids) - set(test))
  splits.assert_disjoint(train, test)
  return train, test


def check_disjoint(question_ids: Sequence[str], train: np.ndarray, scored: np.ndarray) -> None:
  """Raise ValueError if a training row is a scored question (by id)."""
  ids = np.asarray(question_ids)
  splits.assert_disjoint(ids[np.asarray(train)].tolist(), ids[np.asarray(scored)].tolist())
