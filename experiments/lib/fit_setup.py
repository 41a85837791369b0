"""The one place that reads a fit from the config: :func:`read` turns the config into a typed :class:`FitRun` once
(the ``fit`` node through :meth:`engram_jax.fit.config.FitConfig.from_mapping`, which checks it), and everything after
reads its fields: the soft problem (knobs, temperatures, settings), the learned
components (each registered component's node ``fit.<name>``, the variants ``fit.variants``; out-of-tree
components from ``fit.component_modules``), the optimizer and the loop (steps, minibatches, seed,
annealing), the rows with the twin check. ``experiments.fit`` and every research script that fits
(``search_compare``, ``search_budget``) build through :func:`build` and fit through :func:`crossfit` /
:func:`fit_rows`, so that a setting means the same everywhere (``tests/experiments/test_fit_setup.py`` fails when one
is read nowhere, or when a script builds a fit by hand).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import optax
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from engram_jax import fit
from engram_jax.core import modules
from engram_jax.core.errors import EngramError
from engram_jax.eval import pipeline
from engram_jax.eval.config import EvalConfig
from engram_jax.fit import components, twins
from engram_jax.fit.config import FitConfig
from engram_jax.testing import components as contract
from experiments.lib.common import dataset_metrics, eval_settings, one_line

log = logging.getLogger(__name__)


def component_keys() -> tuple[str, ...]:
  """The fit.* keys that are registered components' config nodes (``fit.<name>``)."""
  return tuple(components.COMPONENTS)


@dataclasses.dataclass(frozen=True)
class FitRun:
  """What a fit reads of its run's configuration, typed and read once (:func:`read`): the fit's own settings
  (:class:`engram_jax.fit.config.FitConfig`), the pipeline fitted, and the run's k, seed, resamples, metrics and
  dataset. ``experiments.fit``, its report modules and the artifact read these fields, never the config's ``fit``,
  ``eval`` or ``dataset`` nodes again; the config itself still reaches what sets up the machine and the data (paths,
  caches, devices, the embedder, the loaders, the protocol)."""

  config: FitConfig
  eval: EvalConfig  # the run's eval node, typed (experiments.lib.common.eval_settings)
  pipeline: str  # the config entry fitted
  pipeline_node: Mapping[str, Any]  # its plain node
  seed: int
  metrics: tuple[str, ...]
  dataset: str  # the scored dataset's name
  episode_metrics: Mapping[str, Any]  # its own metrics (:func:`experiments.lib.common.dataset_metrics`)
  embedder: Mapping[str, Any]  # the embedder's plain node
  ops_modules: tuple[str, ...] = ()

  @property
  def k(self) -> int:
    """The ranking depth (``eval.k``)."""
    return self.eval.k

  @property
  def n_resamples(self) -> int:
    """Bootstrap and permutation resamples (``eval.n_resamples``)."""
    return self.eval.n_resamples


def read(cfg: DictConfig, name: str | None = None, settings: EvalConfig | None = None) -> FitRun:
  """The fit of ``cfg`` as a :class:`FitRun`: the modules of ``fit.component_modules`` imported first (they register
  their ``fit.<name>`` keys), then the ``fit`` node converted to plain values once and checked
  (:meth:`FitConfig.from_mapping`: one line for an unknown key or a bad value); ``name``: the pipeline fitted
  (default: the run's one pipeline); ``settings``: the ``eval`` node as the caller read it (default: read here)."""
  import_component_modules(cfg.fit.get('component_modules'))
  config = FitConfig.from_mapping(OmegaConf.to_container(cfg.fit, resolve=True), component_keys())
  settings = eval_settings(cfg) if settings is None else settings
  names = list(cfg.pipeline)
  name = name or (names[0] if len(names) == 1 else '')
  node = cfg.pipeline.get(name) if name else None
  return FitRun(
    config=config,
    eval=settings,
    pipeline=name,
    pipeline_node=OmegaConf.to_container(node, resolve=True) if node is not None else {},
    seed=int(cfg.seed),
    metrics=tuple(cfg.dataset.get('metrics') or settings.metrics),
    dataset=str(cfg.dataset.name),
    episode_metrics=dataset_metrics(cfg.dataset),
    embedder=OmegaConf.to_container(cfg.embedder, resolve=True),
    ops_modules=tuple(cfg.get('ops_modules') or ()),
  )


@dataclasses.dataclass(frozen=True)
class Plan:
  """A fit as the config declares it: the soft problem, the knobs at their hand-set values, every traced knob's
  hand-set value, the learned components (by name, as their config nodes set them), the variants and the loop's
  settings."""

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
  components: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> component (fit.<name> set)
  nodes: dict[str, dict] = dataclasses.field(default_factory=dict)  # name -> its config node (plain)
  declared: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # fit.variants: label -> names
  check_components: bool = True  # the component contract before step 0 (fit.check_components)
  pipe: Any = None  # the hand-set pipeline (what a component's check_problem reads)

  def schedule(self, monitor_steps: Sequence[int] = ()) -> fit.Schedule:
    """The training loop's settings (:class:`engram_jax.fit.Schedule`), as :func:`engram_jax.fit.fit` /
    :func:`engram_jax.fit.crossfit` take them."""
    return fit.Schedule(
      self.optimizer, self.steps, self.batch_size, self.seed, tuple(self.anneal), tuple(monitor_steps)
    )

  def variants(self) -> dict[str, tuple[fit.Problem, tuple[fit.Component, ...]]]:
    """Each fit a run makes, by label: ``fitted`` (the scalar knobs), then each variant ``fit.variants`` declares
    whose components are all set (the scalar knobs plus those components in the listed order, on the fit settings
    they ask for: :func:`engram_jax.fit.components.variant_settings`).

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
    for label, names in self.declared.items():
      if not all(n in self.components for n in names):
        continue
      comps = tuple(self.components[n] for n in names)
      asked = components.variant_settings(comps, self.nodes)
      problem = self.problem
      if asked:
        problem = dataclasses.replace(problem, settings=dataclasses.replace(problem.settings, **asked))
      for c in comps:
        try:
          components.check_problem((c,), self.pipe, problem)
        except ValueError as e:
          raise EngramError(f'fit.{c.name}: {e}') from None
      out[label] = (problem, comps)
    return out


def import_component_modules(names: Sequence[str] | None) -> list[str]:
  """Import the modules named in ``fit.component_modules`` (each registers its components, as ``ops_modules``
  register operators); a module that cannot be imported is one line naming it."""
  return modules.import_modules(list(names or []), 'fit.component_modules')


def components_of(config: FitConfig) -> tuple[dict[str, Any], dict[str, dict]]:
  """Every registered component whose config node ``fit.<name>`` is set, built from it
  (:func:`engram_jax.fit.components.from_config`: unknown and missing keys refused in one line), and the nodes."""
  built, nodes = {}, {}
  for name in components.COMPONENTS:
    if name in config.nodes:
      nodes[name] = dict(config.nodes[name])
      built[name] = components.from_config(name, nodes[name])
  return built, nodes


def variants_of(config: FitConfig, built: dict[str, Any]) -> dict[str, tuple[str, ...]]:
  """``fit.variants`` (label -> the components of that fit, in order), checked: every name registered, no label
  twice with the scalar fit's, each variant's components all set or none (a variant with some set is refused), two
  components on one knob refused (:func:`engram_jax.fit.components.check_composition`), and every set component
  listed by some variant."""
  declared = {}
  for label, names in config.variants.items():
    if label == 'fitted':
      raise EngramError("fit.variants: 'fitted' is the scalar fit's label; name the variant otherwise")
    if not str(label).isidentifier():
      raise EngramError(f'fit.variants.{label}: a variant label is a plain name (letters, digits, _)')
    if isinstance(names, str) or not names:
      raise EngramError(f'fit.variants.{label}: a non-empty list of components, got {names!r}')
    names = tuple(str(n) for n in names)
    for n in names:
      components.get_component(n)  # unknown: one line listing the registered ones
    unset = [n for n in names if n not in built]
    if unset and len(unset) < len(names):
      raise EngramError(
        f'fit.variants.{label} fits {list(names)} together; set ' + ', '.join(f'fit.{n}' for n in unset) + ' too '
        '(now null), or drop the variant'
      )
    if not unset:
      components.check_composition([built[n] for n in names])
    declared[label] = names
  unused = sorted(set(built) - {n for names in declared.values() for n in names})
  if unused:
    raise EngramError(
      f'fit.{unused[0]} is set but no fit.variants entry lists {unused[0]!r}; declare one, e.g. '
      f"'+fit.variants.{unused[0]}=[{unused[0]}]'"
    )
  return declared


def optimizer_of(node: Mapping[str, Any]) -> optax.GradientTransformation:
  """``fit.optimizer`` (a plain node) instantiated; a node Hydra cannot build (a misspelt ``_target_``, a bad
  argument) is one line."""
  from hydra.errors import InstantiationException

  try:
    return instantiate(dict(node))
  except InstantiationException as e:
    raise EngramError(f'fit.optimizer: {one_line(str(e))}') from None


def build(cfg: DictConfig, pipe: pipeline.Pipeline, name: str | None = None) -> Plan:
  """The fit of ``pipe`` (config entry ``name``, default ``pipe.name``) that ``cfg.fit`` declares: :func:`plan` of
  :func:`read`; config errors are raised here, before any data is loaded."""
  return plan(read(cfg, name or pipe.name), pipe)


def plan(run: FitRun, pipe: pipeline.Pipeline) -> Plan:
  """The fit of ``pipe`` (config entry ``run.pipeline``) that ``run.config`` declares: the soft problem, the
  components and variants (each variant's problem checked: e.g. an adapter that would get no gradient is refused),
  the optimizer and the loop, before any data is loaded."""
  config = run.config
  problem, knobs, every = fit.make_problem(
    pipe, list(config.params_of(run.pipeline)), k=run.k, temperatures=config.temperatures, settings=config.settings
  )
  built, nodes = components_of(config)
  declared = variants_of(config, built)
  out = Plan(
    name=run.pipeline,
    problem=problem,
    knobs=knobs,
    every=every,
    optimizer=optimizer_of(config.optimizer),
    steps=config.steps,
    batch_size=config.batch_size,
    seed=config.seed,
    anneal=config.anneal,
    check_twins=config.check_twins,
    check_twins_questions=config.check_twins_questions,
    components=built,
    nodes=nodes,
    declared=declared,
    check_components=config.check_components,
    pipe=pipe,
  )
  plan_variants(out)  # each variant's problem checked (e.g. an adapter that would get no gradient), before any data
  return out


def plan_variants(plan: Plan) -> dict[str, tuple[fit.Problem, tuple[fit.Component, ...]]]:
  """:meth:`Plan.variants`, a component's refusal as one line naming it (``fit.<name>: ...``)."""
  try:
    return plan.variants()
  except EngramError:
    raise
  except ValueError as e:
    raise EngramError(str(e)) from None


def rows(plan: Plan, pipe: pipeline.Pipeline, episodes, arrays, *, seed: int, problem: fit.Problem | None = None):
  """The soft rows of every question of ``episodes`` (``problem``: another variant's, default the plan's), after
  the twin check (``fit.check_twins``)."""
  problem = problem or plan.problem
  out = fit.build_rows(problem, pipe, episodes, arrays, seed=seed)
  if plan.check_twins and problem is plan.problem:
    check_twins(problem, out, episodes, arrays, plan.every, seed=seed, max_questions=plan.check_twins_questions)
  return out


def check_contract(
  plan: Plan,
  problem: fit.Problem,
  comps,
  episodes,
  arrays,
  *,
  seed: int,
  done: set | None = None,
  max_episodes: int = 1,
) -> None:
  """Before step 0: the component contract (:func:`engram_jax.testing.check_component`) of every component of a
  variant, on the first ``max_episodes`` episodes, with the variant's fit settings and temperatures (``done``: the
  (component, settings) already checked in this run, skipped). Raises one line naming the part, the component and the
  knob (``fit.check_components=false`` skips the check)."""
  if not plan.check_components:
    return
  params = [p for p, _ in problem.fitted]
  for c in comps:
    key = (c, problem.settings)
    if done is not None and key in done:
      continue
    why = components.identity_exempt(c)
    try:
      contract.check_component(
        c, plan.pipe, params, episodes[:max_episodes], arrays[:max_episodes], seed=seed, settings=problem.settings,
        temperatures=problem.temperatures,
      )  # fmt: skip
    except EngramError as e:
      raise EngramError(f'refusing to fit: {e} (fit.check_components=false skips the contract)') from None
    log.info(
      'component contract: %r passes (%s)', c.name, f'identity at init exempt: {why}' if why else 'all three parts'
    )
    if done is not None:
      done.add(key)


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
  split = fit.Folds([e.id for e in episodes for _ in e.questions], [q.id for e in episodes for q in e.questions], folds)
  return fit.crossfit(
    problem or plan.problem, plan.knobs, plan.every, rows, split, plan.schedule(monitor_steps),
    components=components, inputs=inputs, log=log.info, monitor=monitor, devices=devices,
  )  # fmt: skip


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
    problem or plan.problem, plan.knobs, plan.every, rows, train, plan.schedule(), components=components, inputs=inputs
  )
