"""Operators, one module per family, each registering its declaration in :mod:`engram_jax.ops.registry`.

Families: :mod:`~engram_jax.ops.cosine`, :mod:`~engram_jax.ops.bm25`, :mod:`~engram_jax.ops.mmr`,
:mod:`~engram_jax.ops.cfs`, :mod:`~engram_jax.ops.cfsr`, :mod:`~engram_jax.ops.tide`, :mod:`~engram_jax.ops.tcfsr`
(time-aware CFS-R: prior, basis, gated), :mod:`~engram_jax.ops.tcfsr_learned` (a learned question-aware gate) and :mod:`~engram_jax.ops.controls` (cos2, mem0); fusion is
:mod:`~engram_jax.ops.rrf`. Importing this package registers every built-in operator.
"""

from engram_jax.ops import (  # noqa: F401
  bm25,
  cfs,
  cfsr,
  controls,
  cosine,
  mmr,
  rrf,
  tcfsr,
  tcfsr_learned,
  tide,  # (importing registers)
)
from engram_jax.ops.registry import OPERATORS, Knob, Operator, SoftTwin, get, register

__all__ = ['OPERATORS', 'Knob', 'Operator', 'SoftTwin', 'get', 'register']
