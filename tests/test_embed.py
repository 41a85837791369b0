"""Embedding cache: warm cache never re-embeds, corrupt shards are rebuilt, bad vectors rejected."""

import numpy as np
import pytest

from engram_jax import embed


class Counting:
  def __init__(self):
    self.calls, self.texts = 0, 0
    self.inner = embed.hashing_encoder(32)

  def __call__(self, texts):
    self.calls += 1
    self.texts += len(texts)
    return self.inner(texts) * 3.0  # not unit-norm on purpose: embed_texts normalises


def test_cache_warm_never_reembeds_and_dedups(tmp_path):
  enc = Counting()
  texts = ['a b', 'c', 'a b', 'd e f']
  v1 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, shard_size=2, progress=False)
  assert enc.texts == 3 and v1.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(v1, axis=1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(v1[0], v1[2])
  v2 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  assert enc.texts == 3
  np.testing.assert_array_equal(v1, v2)
  embed.embed_texts(['new'] + texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  assert enc.texts == 4
  embed.embed_texts(texts, cache_dir=tmp_path, model_id='other', encoder=enc, progress=False)
  assert enc.texts == 7  # keyed by model id too


def test_corrupt_shard_is_detected_and_rebuilt(tmp_path):
  enc = Counting()
  texts = ['x', 'y', 'z']
  v1 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, shard_size=2, progress=False)
  shards = sorted((tmp_path / 'm').glob('shard-*.npz'))
  assert len(shards) == 2
  shards[0].write_bytes(b'garbage')
  cache = embed.EmbeddingCache(tmp_path, 'm')
  cache.load()
  assert cache.rebuilt == [shards[0].name]
  v2 = embed.embed_texts(texts, cache_dir=tmp_path, model_id='m', encoder=enc, progress=False)
  assert enc.texts == 3 + 2
  np.testing.assert_allclose(v1, v2)


def test_nan_vectors_rejected(tmp_path):
  with pytest.raises(ValueError, match='NaN'):
    embed.embed_texts(['a'], cache_dir=tmp_path, model_id='m', encoder=lambda t: np.full((len(t), 4), np.nan),
                      progress=False)


def test_real_minilm_from_the_wheel(tmp_path):
  enc = embed.sentence_transformer_encoder()
  v = embed.embed_texts(['I adopted a dog last week.', 'We got a puppy recently.', 'The invoice is overdue.'],
                        cache_dir=tmp_path, encoder=enc, progress=False)
  assert v.shape == (3, 384)
  assert v[0] @ v[1] > v[0] @ v[2] + 0.2
  assert embed.resolve_model_path('all-MiniLM-L6-v2').endswith('model')
