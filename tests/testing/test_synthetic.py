"""engram_jax.testing.synthetic: seeded synthetic embedded episodes, the shared fixture of tests and the bench."""

import numpy as np

from engram_jax.core.batch import episode_arrays
from engram_jax.testing.synthetic import EmbeddedEpisode, scale_episode, synthetic_episodes


def test_synthetic_episodes_are_locomo_sized_reproducible_and_padded_by_the_library():
  eps = synthetic_episodes(n_episodes=3, n_queries=5, dim=16, n_items=(30, 40), seed=3)
  assert len(eps) == 3 and all(isinstance(b, EmbeddedEpisode) for b in eps)
  for b in eps:
    n = b.episode.n_items
    assert 30 <= n <= 40 and b.docs.shape == (n, 16) and b.queries.shape == (5, 16) and b.docs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b.queries, axis=-1), 1.0, rtol=1e-5)
    ids = {it.id for it in b.episode.items}
    assert all(len(q.gold) == 1 and q.gold[0] in ids for q in b.episode.questions)
    arr = episode_arrays(b.episode, b.docs, b.queries)
    assert int(arr.where.sum()) == n and int(arr.labels.sum()) == 5
  again = synthetic_episodes(n_episodes=3, n_queries=5, dim=16, n_items=(30, 40), seed=3)
  np.testing.assert_array_equal(again[2].queries, eps[2].queries)
  assert [q.text for q in again[2].episode.questions] == [q.text for q in eps[2].episode.questions]
  other = synthetic_episodes(n_episodes=1, n_queries=5, dim=16, n_items=(30, 40), seed=4)
  assert not np.array_equal(other[0].queries, eps[0].queries)


def test_scale_episode_is_synthetic_and_reproducible():
  b = scale_episode(50, 6, dim=16, vocab=200)
  assert b.docs.shape == (50, 16) and b.queries.shape == (6, 16) and b.docs.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(b.docs, axis=-1), 1.0, rtol=1e-5)
  lengths = [len(it.text.split()) for it in b.episode.items]
  assert min(lengths) >= 20 and max(lengths) <= 30
  assert all(len(q.text.split()) == 8 for q in b.episode.questions)
  again = scale_episode(50, 6, dim=16, vocab=200)
  np.testing.assert_array_equal(again.docs, b.docs)
  assert [q.text for q in again.episode.questions] == [q.text for q in b.episode.questions]
  bare = scale_episode(50, 6, dim=16, vocab=200, texts=False)
  np.testing.assert_array_equal(bare.docs, b.docs)
  assert all(it.text == '' for it in bare.episode.items)
