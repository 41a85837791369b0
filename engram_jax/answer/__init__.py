"""Tier 1, answers: readers that answer from the retrieved items (:mod:`~engram_jax.answer.reader`), an atomic
answer cache (:mod:`~engram_jax.answer.cache`), the official prompts and answer metrics transcribed from upstream
(:mod:`~engram_jax.answer.official_qa`: MemoryAgentBench SubEM, LoCoMo F1) and the Tier-1 table
(:mod:`~engram_jax.answer.tier1`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
  __name__,
  submod_attrs={'official_qa': ['fc_score', 'locomo_score'], 'tier1': ['position_shares']},
)
