"""Operators, one module per family, each registering its declaration in :mod:`engram_jax.ops.registry`.

Families: :mod:`~engram_jax.ops.cosine`, :mod:`~engram_jax.ops.bm25`, :mod:`~engram_jax.ops.mmr`,
:mod:`~engram_jax.ops.cfs`, :mod:`~engram_jax.ops.cfsr`, :mod:`~engram_jax.ops.tide`, :mod:`~engram_jax.ops.tcfsr`
(time-aware CFS-R: prior, basis, gated), :mod:`~engram_jax.ops.tcfsr_learned` (a learned question-aware gate) and :mod:`~engram_jax.ops.controls` (cos2, mem0), :mod:`~engram_jax.ops.trec_run` (an external TREC run as a leg); fusion is
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
  trec_run,
)
from engram_jax.ops.bm25 import bm25_scores
from engram_jax.ops.cfs import cfs_select, soft_cfs_select
from engram_jax.ops.cfsr import cfsr_scores
from engram_jax.ops.controls import additive_fuse, perturbed_cosine
from engram_jax.ops.cosine import cosine_scores
from engram_jax.ops.greedy import Selection, SoftSelection
from engram_jax.ops.mmr import mmr_select, soft_mmr_select
from engram_jax.ops.nnls import nnls_ridge_pg
from engram_jax.ops.registry import OPERATORS as OPERATORS  # the table itself (data: not in __all__)
from engram_jax.ops.registry import Knob, Operator, SoftTwin, get, register
from engram_jax.ops.rrf import rrf_fuse, soft_rrf_fuse
from engram_jax.ops.tcfsr import soft_tcfsr_gated_scores, tcfsr_basis_scores, tcfsr_gated_scores, tcfsr_prior_scores
from engram_jax.ops.tcfsr_learned import tcfsr_learned_scores
from engram_jax.ops.tide import tide_scores

__all__ = [
  # hard operators and their soft twins (a smooth hard operator is its own twin)
  'cosine_scores', 'bm25_scores', 'mmr_select', 'soft_mmr_select', 'cfs_select', 'soft_cfs_select', 'cfsr_scores',
  'nnls_ridge_pg', 'tide_scores', 'tcfsr_prior_scores', 'tcfsr_basis_scores', 'tcfsr_gated_scores',
  'soft_tcfsr_gated_scores', 'tcfsr_learned_scores', 'perturbed_cosine', 'additive_fuse', 'rrf_fuse',
  'soft_rrf_fuse', 'Selection', 'SoftSelection',
  # the registry
  'Knob', 'Operator', 'SoftTwin', 'get', 'register',
]  # fmt: skip
