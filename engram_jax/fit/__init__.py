"""Fit a pipeline's knobs by gradient: its soft twin (built from the operator registry), approx-NDCG@k, optax,
seeded disjoint splits.

Modules: :mod:`~engram_jax.fit.knobs` (transforms), :mod:`~engram_jax.fit.problem` (the soft problem and its rows),
:mod:`~engram_jax.fit.train` (loss, jitted step, fit, cross-fit), :mod:`~engram_jax.fit.folds` (folds). Every
registered operator with a soft twin is fittable (:func:`~engram_jax.fit.problem.fittable_paths`).
"""

from engram_jax.fit.folds import check_disjoint, episode_folds, holdout_split
from engram_jax.fit.knobs import FORWARD, Knobs, inverse
from engram_jax.fit.problem import (
  LegInfo,
  Problem,
  Rows,
  Settings,
  SoftContext,
  Temperatures,
  TemperatureValues,
  build_rows,
  effective_values,
  fittable_paths,
  leg_values,
  make_problem,
  soft_leg,
  soft_scores,
)
from engram_jax.fit.train import (
  FitResult,
  Monitor,
  TrainState,
  anneal_scale,
  crossfit,
  fit,
  fitted_values,
  fold_label,
  loss_fn,
  make_soft_eval,
  make_step,
  max_gold_of,
  soft_ndcg,
  soft_ndcg_rows,
)

__all__ = [
  'FORWARD',
  'FitResult',
  'Knobs',
  'LegInfo',
  'Monitor',
  'Problem',
  'Rows',
  'Settings',
  'SoftContext',
  'TemperatureValues',
  'Temperatures',
  'TrainState',
  'anneal_scale',
  'build_rows',
  'check_disjoint',
  'crossfit',
  'effective_values',
  'episode_folds',
  'fit',
  'fitted_values',
  'fold_label',
  'fittable_paths',
  'holdout_split',
  'inverse',
  'leg_values',
  'loss_fn',
  'make_problem',
  'make_soft_eval',
  'make_step',
  'max_gold_of',
  'soft_leg',
  'soft_ndcg',
  'soft_ndcg_rows',
  'soft_scores',
]
