"""The array model every operator reads: the loader-boundary types (:class:`Episode`, :class:`Item`,
:class:`Question`), padded episode arrays (:class:`EpisodeArrays`), padding sizes, the hard ranking with its one tie
rule, and the relaxations used for fitting.

Modules: :mod:`~engram_jax.core.types`, :mod:`~engram_jax.core.batch`, :mod:`~engram_jax.core.lexicon` (tokenizers
and sparse term statistics), :mod:`~engram_jax.core.padding`, :mod:`~engram_jax.core.ranking`,
:mod:`~engram_jax.core.relax`, :mod:`~engram_jax.core.pytree`, :mod:`~engram_jax.core.features` (question cues),
:mod:`~engram_jax.core.validation`.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
  __name__,
  submod_attrs={
    'types': ['Episode', 'Item', 'Question'],
    'batch': ['EpisodeArrays', 'episode_arrays'],
    'ranking': ['top_k', 'ranks'],
    'relax': ['soft_ranks', 'approx_ndcg'],
  },
)
