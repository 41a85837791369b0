"""Pipelines and the evaluation engine: named legs and a fusion (:class:`Pipeline`), their scores and top-k, and
:func:`evaluate`, which runs pipelines over stacked episodes and scores every question.

Modules: :mod:`~engram_jax.eval.pipeline`, :mod:`~engram_jax.eval.evaluation`, :mod:`~engram_jax.eval.legcache`
(legs computed once per sweep), :mod:`~engram_jax.eval.sharding` (the episode axis over devices),
:mod:`~engram_jax.eval.compile_cache` (a persistent compilation cache that parallel jobs share),
:mod:`~engram_jax.eval.timing` (where a run's time goes), :mod:`~engram_jax.eval.trec` (what a run scored, as TREC runs and
qrels), :mod:`~engram_jax.eval.config` (a run's evaluation settings, typed: :class:`EvalConfig`).
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
  __name__,
  submod_attrs={
    'pipeline': ['Pipeline', 'make_pipeline', 'pipeline_scores', 'pipeline_topk'],
    'evaluation': ['EvalResult', 'evaluate'],
    'grid': ['GridResult', 'evaluate_grid'],
    'trec': ['trec_qids', 'trec_qrels', 'trec_run'],
    'config': ['EvalConfig'],
  },
)
