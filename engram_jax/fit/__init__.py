"""Fit a pipeline's knobs by gradient: its soft twin (built from the operator registry), approx-NDCG@k, optax,
seeded disjoint splits; every fit saved as an artifact that any run can apply.

One engine: :func:`make_problem` (the soft problem of a pipeline), :func:`build_rows` (what no fitted knob moves,
precomputed per question), :func:`fit` (the one training loop) and :func:`crossfit` (the one cross-fit), with
learned :class:`Component` s beside the scalar knobs (:class:`Adapter`, :class:`Conditioning`); :func:`load_artifact`
reads a fit's folder back as a callable pipeline;
:func:`retrieve` ranks one's own items for label-free questions with it (or with a hand-set pipeline).

Modules: :mod:`~engram_jax.fit.knobs` (transforms), :mod:`~engram_jax.fit.problem` (the soft problem and its rows),
:mod:`~engram_jax.fit.train` (the loss, the jitted step, the loop, the cross-fit, components),
:mod:`~engram_jax.fit.adapter`, :mod:`~engram_jax.fit.conditioned` (components), :mod:`~engram_jax.fit.twins` (the
twin contract on a fit's rows), :mod:`~engram_jax.fit.folds` (folds), :mod:`~engram_jax.fit.artifact` (saved fits), :mod:`~engram_jax.fit.config`
(a run's fit settings, typed: :class:`FitConfig`).
The entry points also use the modules' other functions (``from engram_jax.fit import train``); they are not API.
"""

from engram_jax.fit.adapter import Adapter
from engram_jax.fit.artifact import Artifact, load_artifact
from engram_jax.fit.components import register_component
from engram_jax.fit.conditioned import Conditioning
from engram_jax.fit.config import FitConfig
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
  soft_scores_per_question,
)
from engram_jax.fit.retrieve import Retrieved, retrieve
from engram_jax.fit.train import (
  KNOBS,
  Component,
  FitResult,
  Folds,
  Monitor,
  Schedule,
  TrainState,
  anneal_scale,
  crossfit,
  fit,
  fitted_values,
  fold_label,
  group_optimizer,
  loss_fn,
  make_soft_eval,
  make_step,
  max_gold_of,
  soft_ndcg,
  soft_ndcg_rows,
  soft_objective,
  soft_problem,
)

# The public API. The other names above stay importable from here for the entry points and tests that use them
# (``fit.loss_fn``, ``fit.Problem``, ...), but are internals: undocumented, free to change.
__all__ = [
  'make_problem',
  'build_rows',
  'fit',
  'crossfit',
  'Schedule',
  'Folds',
  'FitConfig',
  'fittable_paths',
  'episode_folds',
  'Settings',
  'Temperatures',
  'FitResult',
  'Component',
  'Adapter',
  'Conditioning',
  'register_component',
  'Artifact',
  'load_artifact',
  'retrieve',
  'Retrieved',
]
