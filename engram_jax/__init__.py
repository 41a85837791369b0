"""engram_jax: JAX retrieval operators, benchmarks and gradient fitting for long-memory retrieval.

Operators are pure functions over padded, masked arrays (callers ``jit``/``vmap``); loaders, metrics and statistics
are plain Python/NumPy. The names below are the public API; each is documented with an example. They resolve on
first use (``lazy_loader``), so ``import engram_jax`` stays light and imports JAX only when an operator is touched.

Subpackages, by concern: :mod:`engram_jax.core` (data model, padding, ranking, relaxations),
:mod:`engram_jax.ops` (one module per operator + the registry), :mod:`engram_jax.eval` (pipelines and the
evaluation engine), :mod:`engram_jax.metrics` (label metrics, official transcriptions, statistics, reports),
:mod:`engram_jax.data` (loaders, splits, embeddings), :mod:`engram_jax.fit` (gradient fitting),
:mod:`engram_jax.answer` (Tier-1 readers and answer metrics), :mod:`engram_jax.testing` (NumPy references and the
operator contract).

>>> import engram_jax as ej
>>> 'cfsr_scores' in ej.__all__
True
"""

import lazy_loader

__version__ = '0.2.0'

# name -> the module that defines it (one place; __all__ is built from it)
_PUBLIC = {
  # operators (hard) and their soft twins; a smooth hard operator is its own twin
  'ops.cosine': ['cosine_scores'],
  'ops.bm25': ['bm25_scores'],
  'ops.mmr': ['mmr_select', 'soft_mmr_select'],
  'ops.cfs': ['cfs_select', 'soft_cfs_select'],
  'ops.cfsr': ['cfsr_scores'],
  'ops.nnls': ['nnls_ridge_pg'],
  'ops.tide': ['tide_scores'],
  'ops.tcfsr': ['tcfsr_prior_scores', 'tcfsr_basis_scores', 'tcfsr_gated_scores', 'soft_tcfsr_gated_scores'],
  'ops.tcfsr_learned': ['tcfsr_learned_scores'],
  'ops.controls': ['perturbed_cosine', 'additive_fuse'],
  'ops.rrf': ['rrf_fuse', 'soft_rrf_fuse'],
  'ops.greedy': ['Selection', 'SoftSelection'],
  # the registry and the contract every operator passes
  'ops.registry': ['Knob', 'Operator', 'SoftTwin', 'register'],
  'testing.operators': ['check_operator'],
  'testing.components': ['check_component'],
  # data model
  'core.types': ['Episode', 'Item', 'Question'],
  'core.batch': ['EpisodeArrays', 'episode_arrays'],
  # ranking, relaxations, metrics
  'core.ranking': ['top_k', 'ranks'],
  'core.relax': ['soft_ranks', 'approx_ndcg'],
  'metrics.labels': ['ndcg_at_k', 'recall_at_k'],
  # pipelines and evaluation
  'eval.pipeline': ['Pipeline', 'make_pipeline', 'pipeline_scores', 'pipeline_topk'],
  'eval.evaluation': ['EvalResult', 'evaluate'],
  'eval.grid': ['GridResult', 'evaluate_grid'],
  # fitting (the loop itself is engram_jax.fit.fit)
  'fit.problem': ['make_problem', 'build_rows'],
  'fit.train': ['crossfit'],
  'fit.artifact': ['load_artifact'],
  'fit.retrieve': ['Retrieved', 'retrieve'],
}

__getattr__, __dir__, __all__ = lazy_loader.attach(
  __name__,
  submodules=['answer', 'core', 'data', 'eval', 'fit', 'metrics', 'ops', 'testing'],
  submod_attrs=_PUBLIC,
)
