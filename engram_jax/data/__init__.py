"""Datasets: loaders that validate and count every normalisation (:mod:`~engram_jax.data.locomo`,
:mod:`~engram_jax.data.longmemeval`, :mod:`~engram_jax.data.factconsolidation`; one's own episodes,
:mod:`~engram_jax.data.episodes_jsonl`, and BEIR folders, :mod:`~engram_jax.data.beir`; files found through
:mod:`~engram_jax.data.io`), seeded pilot sets and disjoint training splits (:mod:`~engram_jax.data.splits`), and
sentence embeddings with an atomic disk cache (:mod:`~engram_jax.data.embed`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
  __name__,
  submod_attrs={
    'locomo': ['load_locomo'],
    'longmemeval': ['load_longmemeval'],
    'factconsolidation': ['load_factconsolidation'],
    'episodes_jsonl': ['load_episodes_jsonl', 'write_episodes_jsonl'],
    'beir': ['load_beir'],
    'embed': ['hashing_encoder', 'embed_texts'],
  },
)
