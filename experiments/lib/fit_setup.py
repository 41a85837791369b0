"""The one place that reads a fit from the config: the soft problem (knobs, temperatures, settings), the learned
components (``fit.conditioned``, ``fit.adapter``), the optimizer and the loop (steps, minibatches, seed,
annealing), the rows with the twin check. ``experiments.fit`` and every research script that fits
(``search_compare``, ``search_budget``) build through :func:`build` and fit through :func:`crossfit` /
:func:`fit_rows`, so that a setting means the same everywhere (``tests/experiments/test_fit_setup.py`` fails when one
is read nowhere, or when a script builds a fit by hand).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optax
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from engram_jax import fit
from engram_jax.core.errors import EngramError
from engram_jax.eval import pipeline
from engram_jax.fit import adapter as A
from engram_jax.fit import conditioned as C
from engram_jax.fit import twins
from experiments.lib.common import one_line

log = logging.getLogger(__name__)

# fit.* keys this module reads (a test checks that every key of conf/fit/default.yaml is here or in
# ELSEWHERE, and that changing one of these changes what build returns)
READ = (
  'params',
  'params_by_pipeline',
  'seed',
  'steps',
  'batch_size',
  'optimizer',
  'temperatures',
  'anneal',
  'check_twins',
  'check_twins_questions',
  'greedy_pool',
  'candidates',
  'solve_batch',
  'cfsr_grad',
  'conditioned',
  'adapter',
  'combined',
)
# the keys of a fit.adapter node (train_gap: read by experiments/lib/fit_adapter.py); the first three are required
ADAPTER_KEYS = ('rank', 'lr_scale', 'cfsr_grad', 'soft_query_legs', 'train_gap')
ADAPTER_REQUIRED = ('rank', 'lr_scale', 'cfsr_grad')
# read by experiments.fit itself: which questions are scored and against what
ELSEWHERE = ('split', 'train', 'folds', 'n_test', 'gap_checks', 'baselines', 'final')


@dataclasses.dataclass(frozen=True)
class Plan:
  """A fit as the config declares it: the soft problem, the knobs at their hand-set values, every traced knob's
  hand-set value, the learned components and the loop's settings."""

  name: str
  problem: fit.Problem
  knobs: fit.Knobs
  every: dict[str, float]
  optimizer: optax.GradientTransformation
  steps: int
  batch_size: int
  seed: int
  anneal: tuple[float, float]
  check_twins: bool = True
  check_twins_questions: int = 512
  conditioned: C.Conditioning | None = None
  adapter: A.Adapter | None = None
  adapter_cfsr_grad: str | None = None  # the adapter fit's CFS-R gradient (its problem's settings.cfsr_grad)
  combined: bool = False  # one more fit with the adapter and the conditioned knobs together (fit.combined)

  def loop(self) -> dict[str, Any]:
    """The training loop's settings, as :func:`engram_jax.fit.fit` / :func:`engram_jax.fit.crossfit` take them."""
    return {
      'optimizer': self.optimizer,
      'steps': self.steps,
      'batch_size': self.batch_size,
      'seed': self.seed,
      'anneal': self.anneal,
    }

  def variants(self) -> dict[str, tuple[fit.Problem, tuple[fit.Component, ...]]]:
    """Each fit a run makes, by label: ``fitted`` (the scalar knobs), and ``conditioned`` / ``adapter`` when
    declared (the scalar knobs plus that component; the adapter on its own CFS-R gradient setting); with
    ``combined``, ``combined`` (the scalar knobs, the adapter and the conditioned knobs in one fit, on the adapter's
    CFS-R gradient setting).

    Example:
      >>> from engram_jax.testing.synthetic import toy_fit_data
      >>> from engram_jax import fit
      >>> pipe = toy_fit_data()[3]
      >>> problem, knobs, every = fit.make_problem(pipe, ['legs.bm25.weight'])
      >>> plan = Plan('toy', problem, knobs, every, optimizer=None, steps=1, batch_size=1, seed=0, anneal=(1.0, 1.0))
      >>> list(plan.variants())
      ['fitted']
    """
    out = {'fitted': (self.problem, ())}
    if self.conditioned is not None:
      out['conditioned'] = (self.problem, (self.conditioned,))
    if self.adapter is not None:
      problem = dataclasses.replace(
        self.problem, settings=dataclasses.replace(self.problem.settings, cfsr_grad=self.adapter_cfsr_grad)
      )
      self.adapter.check(problem)
      out['adapter'] = (problem, (self.adapter,))
      if self.combined and self.conditioned is not None:
        out['combined'] = (problem, (self.adapter, self.conditioned))
    return out


def params_of(cfg: DictConfig, name: str) -> list[str]:
  """The knob paths to fit: ``fit.params``, else ``fit.params_by_pipeline[name]``."""
  return list(cfg.fit.params or cfg.fit.params_by_pipeline[name])


def settings_of(cfg: DictConfig) -> fit.Settings:
  try:
    return fit.Settings(
      greedy_pool=int(cfg.fit.greedy_pool),
      candidates=int(cfg.fit.candidates),
      solve_batch=None if cfg.fit.solve_batch is None else int(cfg.fit.solve_batch),
      cfsr_grad=str(cfg.fit.cfsr_grad),
    )
  except ValueError as e:  # a bad value: one line (EngramError), not a traceback
    raise EngramError(str(e)) from None


def conditioned_of(cfg: DictConfig) -> C.Conditioning | None:
  """``fit.conditioned`` as a component (None when off); unknown keys are refused."""
  node = cfg.fit.get('conditioned')
  if not node:
    return None
  node = OmegaConf.to_container(node)
  known = {f.name for f in dataclasses.fields(C.Conditioning)}
  unknown = sorted(set(node) - known)
  if unknown:
    raise EngramError(f'fit.conditioned: unknown keys {unknown}; allowed {sorted(known)}')
  required = [f.name for f in dataclasses.fields(C.Conditioning) if f.default is dataclasses.MISSING]
  missing = [k for k in required if k not in node]
  if missing:
    raise EngramError(
      f'fit.conditioned is missing {", ".join(missing)}; it needs {", ".join(required)} '
      '(e.g. {knobs: [k0], features: [cues], hidden: 0, rank: 8, net_lr_scale: 0.1}; conf/fit/default.yaml)'
    )
  optional = {
    f.name: node[f.name]
    for f in dataclasses.fields(C.Conditioning)
    if f.default is not dataclasses.MISSING and f.name in node
  }
  try:
    return C.Conditioning(
      knobs=tuple(node['knobs']),
      features=tuple(node['features']),
      hidden=int(node['hidden']),
      rank=int(node['rank']),
      net_lr_scale=float(node['net_lr_scale']),
      **optional,
    )
  except (TypeError, ValueError) as e:
    raise EngramError(f'fit.conditioned: {e}') from None


def adapter_of(cfg: DictConfig) -> tuple[A.Adapter, str] | None:
  """``fit.adapter`` as a component and its CFS-R gradient setting (None when off)."""
  node = cfg.fit.get('adapter')
  if not node:
    return None
  node = OmegaConf.to_container(node)
  unknown = sorted(set(node) - set(ADAPTER_KEYS))
  if unknown:
    raise EngramError(f'fit.adapter: unknown keys {unknown}; allowed {list(ADAPTER_KEYS)}')
  missing = [k for k in ADAPTER_REQUIRED if k not in node]
  if missing:
    raise EngramError(
      f'fit.adapter is missing {", ".join(missing)}; it needs {", ".join(ADAPTER_REQUIRED)} (cfsr_grad: implicit or '
      'reverse, how the CFS-R twin passes the gradient to the query), e.g. '
      "'fit.adapter={rank: 8, lr_scale: 0.1, cfsr_grad: implicit}' (conf/fit/default.yaml)"
    )
  grad = str(node['cfsr_grad'])
  try:
    fit.Settings(cfsr_grad=grad)  # validates it
    adapter = A.Adapter(
      rank=int(node['rank']), lr_scale=float(node['lr_scale']), soft_query_legs=bool(node.get('soft_query_legs', False))
    )
  except (TypeError, ValueError) as e:
    raise EngramError(f'fit.adapter: {e}') from None
  return adapter, grad


def optimizer_of(cfg: DictConfig) -> optax.GradientTransformation:
  """``fit.optimizer`` instantiated; a node Hydra cannot build (a misspelt ``_target_``, a bad argument) is one line."""
  from hydra.errors import InstantiationException

  try:
    return instantiate(cfg.fit.optimizer)
  except InstantiationException as e:
    raise EngramError(f'fit.optimizer: {one_line(str(e))}') from None


def build(cfg: DictConfig, pipe: pipeline.Pipeline, name: str | None = None) -> Plan:
  """The fit of ``pipe`` (config entry ``name``, default ``pipe.name``) that ``cfg.fit`` declares; config errors
  are raised here, before any data is loaded."""
  name = name or pipe.name
  params = params_of(cfg, name)
  problem, knobs, every = fit.make_problem(
    pipe,
    params,
    k=int(cfg.eval.k),
    temperatures=fit.Temperatures(**cfg.fit.temperatures),
    settings=settings_of(cfg),
  )
  cond = conditioned_of(cfg)
  if cond is not None:
    try:
      cond.check(pipe, params)
    except ValueError as e:
      raise EngramError(f'fit.conditioned: {e}') from None
  adapter = adapter_of(cfg)
  combined = bool(cfg.fit.get('combined') or False)
  if combined and (cond is None or adapter is None):
    raise EngramError(
      'fit.combined=true fits fit.adapter and fit.conditioned together in one more fit: set both '
      f'(fit.adapter is {"set" if adapter else "null"}, fit.conditioned is {"set" if cond else "null"})'
    )
  plan = Plan(
    name=name,
    problem=problem,
    knobs=knobs,
    every=every,
    optimizer=optimizer_of(cfg),
    steps=int(cfg.fit.steps),
    batch_size=int(cfg.fit.batch_size),
    seed=int(cfg.fit.seed),
    anneal=tuple(float(a) for a in (cfg.fit.get('anneal') or (1.0, 1.0))),
    check_twins=bool(cfg.fit.get('check_twins', True)),
    check_twins_questions=int(cfg.fit.get('check_twins_questions') or 512),
    conditioned=cond,
    adapter=None if adapter is None else adapter[0],
    adapter_cfsr_grad=None if adapter is None else adapter[1],
    combined=combined,
  )
  try:
    plan.variants()  # each variant's problem checked (e.g. an adapter that would get no gradient), before any data
  except ValueError as e:
    raise EngramError(str(e)) from None
  return plan


def rows(plan: Plan, pipe: pipeline.Pipeline, episodes, arrays, *, seed: int, problem: fit.Problem | None = None):
  """The soft rows of every question of ``episodes`` (``problem``: another variant's, default the plan's), after
  the twin check (``fit.check_twins``)."""
  problem = problem or plan.problem
  out = fit.build_rows(problem, pipe, episodes, arrays, seed=seed)
  if plan.check_twins and problem is plan.problem:
    check_twins(problem, out, episodes, arrays, plan.every, seed=seed, max_questions=plan.check_twins_questions)
  return out


def check_twins(
  problem: fit.Problem, rows: fit.Rows, episodes, arrays, every: dict[str, float], *, seed: int, max_questions: int
) -> None:
  """Before step 0: every fitted leg's soft twin, cold, against its hard leg (:mod:`engram_jax.fit.twins`) on the
  training rows of the first episodes (up to ``max_questions`` questions), at the hand-set knob values and with
  every fitted knob moved once. Raises a one-line ValueError naming the operator and the gap when they differ
  (``fit.check_twins=false`` skips the check)."""
  n_questions = [len(e.questions) for e in episodes]
  sel, total = [], 0
  for e, n in enumerate(n_questions):
    if total >= max_questions:
      break
    sel.append(e)
    total += n
  moved = dict(every)
  for l in range(len(problem.legs)):
    moved = twins.moved_values(problem, l, moved)
  for at, vals in (('hand-set', every), ('moved', moved)):
    for gap in twins.cold_twin_gaps(problem, rows, arrays, n_questions, vals, seed=seed, at=at, episode_index=sel):
      log.info(
        'twin check: %s',
        gap.message()
        if not gap.ok
        else f'operator {gap.op} (leg {gap.leg}, {at}): cold soft twin == hard leg on {gap.n_questions} questions '
        f'(max |soft - hard| {gap.max_diff:.3g})',
      )
      if not gap.ok:
        hint = (
          f' (a relaxed greedy leg picks among the cosine top fit.greedy_pool={problem.settings.greedy_pool} '
          'items, its hard leg among its own pool: a larger fit.greedy_pool may close the gap)'
          if gap.selection
          else ''
        )
        ties = cosine_ties(arrays, n_questions, sel, top=problem.settings.greedy_pool, row=gap.worst)
        if ties:
          raise EngramError(
            f'refusing to fit: {gap.message()}; {ties}: the soft twin and the hard leg break such ties '
            'differently (a bag-of-words embedder such as embedder=hashing gives them), so they cannot agree; '
            'fit with a dense embedder (e.g. embedder=minilm), or set fit.check_twins=false to fit anyway'
          )
        raise EngramError(
          f'refusing to fit: {gap.message()}{hint}; fix the soft twin (engram_jax.testing.'
          f'check_operator({gap.op!r}) runs the full check) or set fit.check_twins=false'
        )


def cosine_ties(arrays, n_questions: Sequence[int], episodes: Sequence[int], *, top: int, row: int) -> str:
  """Exact cosine ties among the ``top`` items of the questions of ``episodes`` (their rows first, in order, as the
  twin check reads them), said in a few words ('' when none at the question of ``row``): where the question at
  ``row`` of a failed twin check has tied items, the failure is theirs, not the twin's."""
  at_row, n_tied, total = 0, 0, 0
  for e in episodes:
    a = arrays[e]
    docs = np.asarray(a.docs, np.float64)[np.asarray(a.where, bool)]
    cos = np.asarray(a.queries, np.float64)[: n_questions[e]] @ docs.T  # [Q, N]
    best = -np.sort(-cos, axis=-1)[:, :top]
    tied = np.any(best[:, 1:] == best[:, :-1], axis=-1) if best.shape[-1] > 1 else np.zeros(len(best), bool)
    if 0 <= row - total < len(tied):
      at_row = int(np.sum(best[row - total][1:] == best[row - total][:-1]))
    n_tied += int(tied.sum())
    total += len(tied)
  if not at_row:
    return ''
  return (
    f'the question at row {row} has {at_row} exact cosine ties among its top {top} items ({n_tied} of the {total} '
    'questions checked have some)'
  )


def crossfit(
  plan: Plan,
  rows: fit.Rows,
  episodes,
  folds: Sequence[Sequence[str]],
  *,
  problem: fit.Problem | None = None,
  components: Sequence[fit.Component] = (),
  inputs: dict[str, Any] | None = None,
  monitor: Callable | None = None,
  monitor_steps: Sequence[int] = (),
  devices: Sequence[Any] | None = None,
) -> list[fit.FitResult]:
  """:func:`engram_jax.fit.crossfit` with the plan's knobs and loop (``problem``: a variant's, default the plan's);
  ``devices``: the folds run concurrently, one per device (:func:`engram_jax.fit.crossfit`)."""
  return fit.crossfit(
    problem or plan.problem,
    plan.knobs,
    plan.every,
    rows,
    row_episodes=[e.id for e in episodes for _ in e.questions],
    question_ids=[q.id for e in episodes for q in e.questions],
    folds=folds,
    components=components,
    inputs=inputs,
    log=log.info,
    monitor=monitor,
    monitor_steps=monitor_steps,
    devices=devices,
    **plan.loop(),
  )


def fit_rows(
  plan: Plan,
  rows: fit.Rows,
  train: np.ndarray,
  *,
  problem: fit.Problem | None = None,
  components: Sequence[fit.Component] = (),
  inputs: dict[str, Any] | None = None,
) -> fit.FitResult:
  """One :func:`engram_jax.fit.fit` on rows ``train`` with the plan's knobs and loop."""
  return fit.fit(
    problem or plan.problem, plan.knobs, plan.every, rows, train, components=components, inputs=inputs, **plan.loop()
  )
