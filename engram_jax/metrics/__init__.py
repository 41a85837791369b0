"""Metrics and statistics: label metrics over top-k lists (:mod:`~engram_jax.metrics.labels`), the official
definitions transcribed (:mod:`~engram_jax.metrics.official`: LongMemEval, MemoryAgentBench), evidence boundaries
(:mod:`~engram_jax.metrics.boundary`), batched bootstrap intervals and paired tests
(:mod:`~engram_jax.metrics.stats`), and the report tables (:mod:`~engram_jax.metrics.report`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
  __name__,
  submodules=['labels', 'official', 'boundary', 'stats', 'report'],
  submod_attrs={
    'labels': ['ndcg_at_k', 'recall_at_k'],
    'stats': ['bootstrap_ci', 'paired_test'],
  },
)
