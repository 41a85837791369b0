"""Training: the approx-NDCG loss of the soft pipeline, a jitted optax step that compiles once per problem, one fit
on a set of training rows, and one cross-fit by episode folds.

A fit is a parameter pytree (``{'knobs': the scalar knobs' unconstrained values, <component>: its parameters}``),
a soft loss, an optax optimizer with one learning-rate group per component (:func:`group_optimizer`, through
:func:`optax.partition`), seeded minibatches and the temperature annealing. The scalar knobs are always fit; a
:class:`Component` (the query adapter, :class:`engram_jax.fit.adapter.Adapter`; the question-conditioned knobs,
:class:`engram_jax.fit.conditioned.Conditioning`) adds parameters and a transformation of the soft problem, and
components combine (each transforms the knob values and rows the previous one left)::

    class Component(Protocol):
      name: str            # its group in the parameters and in the optimizer
      lr_scale: float      # its learning rate as a fraction of the scalar knobs'
      per_question: bool   # it makes fusion knobs per question (the soft fusion is vmapped over questions)
      def inputs(self, problem, episodes, arrays) -> pytree     # per-question inputs of every row, built once
      def batch(self, inputs, idx) -> pytree                    # the inputs of rows ``idx``
      def init(self, inputs, seed) -> pytree                    # its parameters at the start of a fit
      def soft_constant(self, problem) -> tuple[int, ...]       # constant legs to soft-rank in the fusion
      def apply(self, problem, params, raw, vals, rows, inputs) -> (vals, rows)   # the soft problem, transformed
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import queue
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import relax
from engram_jax.fit.folds import DEFAULT_SEED, check_disjoint
from engram_jax.fit.knobs import Knobs
from engram_jax.fit.problem import Problem, Rows, effective_values, soft_scores, soft_scores_per_question

SCHEDULE_LOOP = ('optimizer', 'steps', 'batch_size', 'seed', 'anneal')
KNOBS = 'knobs'  # the scalar knobs' group in a fit's parameters and optimizer


class Component(Protocol):
  """A learned part of a fit beside the scalar knobs (see the module docstring).

  Example:
    >>> from engram_jax.fit import Adapter, Component, Conditioning
    >>> [c.__name__ for c in (Adapter, Conditioning)]  # the learned components; each adds parameters to one fit
    ['Adapter', 'Conditioning']
  """

  name: str
  lr_scale: float
  per_question: bool

  def inputs(self, problem: Problem, episodes: Sequence[Any], arrays: Sequence[Any]) -> Any: ...

  def batch(self, inputs: Any, idx: Array) -> Any: ...

  def init(self, inputs: Any, seed: int) -> Any: ...

  def soft_constant(self, problem: Problem) -> tuple[int, ...]: ...

  def apply(
    self, problem: Problem, params: Any, raw: Mapping[str, Array], vals: dict[str, Array], rows: Rows, inputs: Any
  ) -> tuple[dict[str, Array], Rows]: ...


@struct.dataclass
class TrainState:
  """Parameters (``{'knobs': unconstrained scalar knobs, <component>: its parameters}``), optimiser state and
  step count; the jitted step maps one to the next."""

  params: dict[str, Any]
  opt_state: Any
  step: Array


def soft_ndcg(
  vals: Mapping[str, Array],
  rows: Rows,
  *,
  problem: Problem,
  max_gold: int,
  scale: ArrayLike = 1.0,
  soft_constant: Sequence[int] = (),
  per_question: bool = False,
) -> Array:
  """Approx-NDCG@k ``[B]`` of the soft pipeline on a batch of rows, knob values by path (``[B]`` values with
  ``per_question``), temperatures times ``scale``."""
  if per_question:
    s = soft_scores_per_question(problem, vals, rows, scale, soft_constant=soft_constant)
  else:
    s = soft_scores(problem, vals, rows, scale, soft_constant=soft_constant)
  t = problem.temperatures.scaled(scale)
  temp = t.final * relax.gap_scale(s, k=problem.k, where=rows.where)
  return relax.approx_ndcg(
    s, rows.labels, k=problem.k, where=rows.where, temperature=temp, cutoff_temperature=t.cutoff, max_gold=max_gold
  )


def soft_problem(
  params: Mapping[str, Any],
  fixed: Mapping[str, Array],
  rows: Rows,
  inputs: Mapping[str, Any],
  *,
  problem: Problem,
  components: Sequence[Component] = (),
) -> tuple[dict[str, Array], Rows]:
  """Every knob's value by path and the rows after each component's transformation (in order)."""
  vals = dict(fixed)
  vals.update(Knobs(raw=dict(params[KNOBS]), transforms=problem.fitted).values())
  for c in components:
    vals, rows = c.apply(problem, params[c.name], params[KNOBS], vals, rows, inputs[c.name])
  return vals, rows


def soft_options(problem: Problem, components: Sequence[Component]) -> dict[str, Any]:
  """The soft scorer's options the components ask for: constant legs soft-ranked, per-question fusion."""
  return {
    'soft_constant': tuple(sorted({l for c in components for l in c.soft_constant(problem)})),
    'per_question': any(c.per_question for c in components),
  }


def loss_fn(
  params: Mapping[str, Any],
  fixed: Mapping[str, Array],
  rows: Rows,
  inputs: Mapping[str, Any],
  weight: Array,
  scale: ArrayLike = 1.0,
  *,
  problem: Problem,
  max_gold: int,
  components: Sequence[Component] = (),
) -> Array:
  r"""``1 - weighted mean approx-NDCG@k`` of the soft pipeline (transformed by ``components``) over a batch of rows
  (weight 0 = padding), every temperature times ``scale``."""
  vals, rows = soft_problem(params, fixed, rows, inputs, problem=problem, components=components)
  nd = soft_ndcg(vals, rows, problem=problem, max_gold=max_gold, scale=scale, **soft_options(problem, components))
  return 1.0 - jnp.sum(weight * nd) / jnp.maximum(jnp.sum(weight), 1e-12)


def anneal_scale(step: int, steps: int, anneal: tuple[float, float] = (1.0, 1.0)) -> float:
  """The temperature factor at ``step`` of ``steps``: geometric from ``anneal[0]`` (first step) to ``anneal[1]``
  (last step); ``(1, 1)`` keeps the temperatures as set."""
  start, end = (float(a) for a in anneal)
  if start <= 0 or end <= 0:
    raise ValueError(f'annealing factors must be > 0, got {anneal}')
  return start * (end / start) ** (step / max(steps - 1, 1))


def group_optimizer(
  optimizer: optax.GradientTransformation, components: Sequence[Component] = ()
) -> optax.GradientTransformation:
  """``optimizer`` for the scalar knobs and, for each component, ``optimizer`` followed by
  ``optax.scale(lr_scale)`` (its learning rate that fraction of the knobs'), through :func:`optax.partition` on
  the parameters' top-level groups."""
  transforms = {KNOBS: optimizer}
  transforms.update({c.name: optax.chain(optimizer, optax.scale(float(c.lr_scale))) for c in components})
  return optax.partition(
    transforms, lambda params: {g: jax.tree_util.tree_map(lambda _, g=g: g, p) for g, p in params.items()}
  )


def make_step(
  problem: Problem,
  optimizer: optax.GradientTransformation,
  *,
  max_gold: int,
  components: Sequence[Component] = (),
) -> Callable:
  """The jitted training step ``(state, fixed, rows, inputs, idx [B], weight [B], scale) -> (state, loss)``.

  ``optimizer`` is the grouped one (:func:`group_optimizer`). ``problem``, ``components`` and ``max_gold`` are
  static (closed over); knob values, the optimiser state, the rows, the inputs and the temperature factor ``scale``
  are traced, so a second call with other values (or another fold's batch, or the next step of an annealing
  schedule) does not recompile.
  """
  components = tuple(components)
  grad_fn = jax.value_and_grad(functools.partial(loss_fn, problem=problem, max_gold=max_gold, components=components))

  @jax.jit
  def step(state: TrainState, fixed, rows: Rows, inputs, idx: Array, weight: Array, scale: Array):
    batch = jax.tree_util.tree_map(lambda x: x[idx], rows)
    batch_in = {c.name: c.batch(inputs[c.name], idx) for c in components}
    loss, grads = grad_fn(state.params, fixed, batch, batch_in, weight, scale)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(params=params, opt_state=opt_state, step=state.step + 1), loss

  return step


@dataclasses.dataclass
class FitResult:
  """One fit: the fitted knobs (constrained, by path, the values the hard pipeline uses), the scalar knobs'
  unconstrained values, each component's learned parameters (NumPy), the loss curve.

  Example:
    >>> import numpy as np, optax
    >>> from engram_jax.testing.synthetic import toy_fit_data
    >>> episodes, embeddings, arrays, pipe = toy_fit_data()  # 2 x 12 questions that repeat their gold item's text
    >>> from engram_jax.fit import Schedule, build_rows, fit, make_problem
    >>> problem, knobs, fixed = make_problem(pipe, ['k0'])
    >>> rows = build_rows(problem, pipe, episodes, arrays, seed=0)
    >>> res = fit(problem, knobs, fixed, rows, np.arange(24), Schedule(optax.adam(0.05), steps=3, batch_size=8))
    >>> sorted(res.values)[:2], len(res.losses), res.train_rows
    (['k0'], 3, 24)
  """

  values: dict[str, float]
  losses: list[float]
  train_rows: int
  wall_s: float
  scales: list[float] = dataclasses.field(default_factory=list)  # temperature factor per step
  monitor: list[dict[str, float]] = dataclasses.field(default_factory=list)  # what ``monitor`` returned, by step
  raw: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  learned: dict[str, Any] = dataclasses.field(default_factory=dict)  # component name -> its parameters


def minibatch(rng: np.random.Generator, train: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """One training minibatch: ``(row indices [batch_size], weights [batch_size])``, drawn without replacement from
  ``train``; when ``train`` is smaller than a batch, all of it padded with its first row at weight 0."""
  if len(train) >= batch_size:
    return rng.choice(train, batch_size, replace=False), np.ones(batch_size, np.float32)
  idx = np.concatenate([train, np.full(batch_size - len(train), train[0])])
  return idx, (np.arange(batch_size) < len(train)).astype(np.float32)


def max_gold_of(rows: Rows) -> int:
  """Largest number of gold items of any question (static; bucketed to a multiple of 4)."""
  g = int(np.max(np.sum(np.asarray(rows.labels), axis=-1)))
  return max(4, -(-g // 4) * 4)


Monitor = Callable[[int, float, dict[str, Array]], dict[str, float]]


def fitted_values(problem: Problem, vals: Mapping[str, Array]) -> dict[str, float]:
  """The values the hard pipeline takes from a fit (:func:`effective_values`' output): every fitted knob, and every
  fusion weight when they are renormalised."""
  out = {p: float(vals[p]) for p, _ in problem.fitted}
  if problem.normalise_weights:
    out.update({f'legs.{leg.name}.weight': float(vals[f'legs.{leg.name}.weight']) for leg in problem.legs})
  return out


def init_state(
  knobs: Knobs,
  grouped: optax.GradientTransformation,
  *,
  components: Sequence[Component] = (),
  inputs: Mapping[str, Any],
  seed: int,
) -> TrainState:
  """A fit's state at step 0: the knobs' hand-set raw values, each component initialised with ``seed``, the grouped
  optimizer's state (:func:`group_optimizer`)."""
  params = {KNOBS: dict(knobs.raw), **{c.name: c.init(inputs[c.name], seed) for c in components}}
  return TrainState(params=params, opt_state=grouped.init(params), step=jnp.zeros((), jnp.int32))


# jaxlib's CPU kernels that split a batch across XLA's intra-op pool and block a pool thread until it is done
# (LAPACK: Cholesky, LU, QR, triangular solves, eigh, SVD, ...): two such calls from programs running at once on two
# CPU devices can each hold a pool thread while waiting for the other's (see engram_jax.ops.nnls_implicit)
_BLOCKING_KERNEL = re.compile(r'custom_call\s*@(lapack_\w+)|call_target_name\s*=\s*"(lapack_\w+)"')


def host_blocking_kernels(lowered_text: str) -> list[str]:
  """The jaxlib LAPACK kernels (sorted, unique) a lowered program calls (``jax.jit(f).lower(...).as_text()``): a
  program that calls one must not run concurrently with another on the CPU devices of one process.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> host_blocking_kernels(jax.jit(jnp.linalg.cholesky).lower(jnp.eye(3)).as_text())  # doctest: +ELLIPSIS
    ['lapack_...potrf...']
    >>> host_blocking_kernels(jax.jit(jnp.sum).lower(jnp.eye(3)).as_text())
    []
  """
  return sorted({a or b for a, b in _BLOCKING_KERNEL.findall(lowered_text)})


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How a fit runs (:func:`fit`, :func:`crossfit`): the scalar knobs' optax ``optimizer`` (each component gets it
  scaled by its ``lr_scale``), ``steps`` of minibatches of ``batch_size`` rows, the ``seed`` of the minibatches and
  of the components' initialisation, the temperatures' annealing factors (``anneal``: first, last step) and the
  steps at which a monitor is called (``monitor_steps``; ``steps`` = after the last one).

  Example:
    >>> import optax
    >>> from engram_jax.fit import Schedule
    >>> Schedule(optax.adam(0.1), steps=20, batch_size=8).anneal
    (1.0, 1.0)
  """

  optimizer: optax.GradientTransformation
  steps: int
  batch_size: int
  seed: int = DEFAULT_SEED
  anneal: tuple[float, float] = (1.0, 1.0)
  monitor_steps: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Folds:
  """The one cross-fit's split (:func:`crossfit`): each row's episode (``row_episodes`` ``[R]``) and question id
  (``question_ids`` ``[R]``, for the disjointness check), and the folds of scored episode ids.

  Example:
    >>> from engram_jax.fit import Folds
    >>> Folds(['e0', 'e0', 'e1'], ['q0', 'q1', 'q2'], [['e0'], ['e1']]).folds
    [['e0'], ['e1']]
  """

  row_episodes: Sequence[str]
  question_ids: Sequence[str]
  folds: Sequence[Sequence[str]]


def fit(
  problem: Problem,
  knobs: Knobs,
  fixed: Mapping[str, float],
  rows: Rows,
  train: np.ndarray,
  schedule: Schedule,
  *,
  components: Sequence[Component] = (),
  inputs: Mapping[str, Any] | None = None,
  step_fn: Callable | None = None,
  max_gold: int | None = None,
  monitor: Monitor | None = None,
) -> FitResult:
  """Fit ``knobs`` and every component's parameters on rows ``train`` (indices) by ``schedule.steps`` optax steps on
  minibatches of ``schedule.batch_size`` (the one training loop; :class:`Schedule`).

  ``schedule.optimizer`` is the scalar knobs' (each component gets it scaled by its ``lr_scale``,
  :func:`group_optimizer`);
  ``inputs``: each component's :meth:`Component.inputs`, by name. Minibatches are drawn without replacement by
  ``numpy.random.default_rng(seed)`` (all training rows, zero-weight padded, when there are fewer than
  ``batch_size``); components are initialised with ``seed``. Pass ``step_fn`` (from :func:`make_step`, with the
  grouped optimizer) to share one compiled step between fits of the same problem (e.g. cross-fitting folds).
  Temperatures are multiplied by :func:`anneal_scale` at each step. ``monitor(step, scale, every knob value by
  path)`` is called before each step in ``monitor_steps`` (``steps`` = after the last one); what it returns is
  kept, by step, in :attr:`FitResult.monitor` (e.g. the soft-vs-hard gap on the training questions). It never
  changes the fit.

  Example:
    >>> import numpy as np, optax
    >>> from engram_jax.testing.synthetic import toy_fit_data
    >>> episodes, embeddings, arrays, pipe = toy_fit_data()  # 2 x 12 questions that repeat their gold item's text
    >>> from engram_jax.fit import Schedule, build_rows, fit, make_problem
    >>> problem, knobs, fixed = make_problem(pipe, ['legs.bm25.weight'])
    >>> rows = build_rows(problem, pipe, episodes, arrays, seed=0)
    >>> res = fit(problem, knobs, fixed, rows, np.arange(24), Schedule(optax.adam(0.1), steps=20, batch_size=8))
    >>> res.values['legs.bm25.weight'] > 1.5  # BM25 finds each question's repeated text: its weight grows from 1
    True
  """
  t0 = time.perf_counter()
  optimizer, steps, batch_size, seed, anneal = (getattr(schedule, f) for f in SCHEDULE_LOOP)
  components = tuple(components)
  inputs = dict(inputs or {})
  grouped = group_optimizer(optimizer, components)
  max_gold = max_gold_of(rows) if max_gold is None else max_gold
  step_fn = step_fn or make_step(problem, grouped, max_gold=max_gold, components=components)
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  state = init_state(knobs, grouped, components=components, inputs=inputs, seed=seed)
  rng = np.random.default_rng(seed)
  train = np.asarray(train)
  losses, scales, watched = [], [], []
  monitor_steps = set(schedule.monitor_steps)
  for t in range(steps + 1):
    scale = anneal_scale(min(t, steps - 1), steps, anneal)
    if monitor is not None and t in monitor_steps:
      vals = effective_values(problem, state.params[KNOBS], fixed_j)
      watched.append({'step': t, 'scale': scale, **monitor(t, scale, vals)})
    if t == steps:
      break
    idx, w = minibatch(rng, train, batch_size)
    state, loss = step_fn(state, fixed_j, rows, inputs, jnp.asarray(idx), jnp.asarray(w), jnp.float32(scale))
    losses.append(loss)
    scales.append(scale)
  out = fitted_values(problem, effective_values(problem, state.params[KNOBS], fixed_j))
  if not all(np.isfinite(v) for v in out.values()) or not np.all(np.isfinite(np.asarray(losses))):
    raise FloatingPointError(f'fit of {problem.name} diverged (non-finite loss or knobs): {out}')
  return FitResult(
    values=out,
    losses=[float(x) for x in losses],
    train_rows=len(train),
    wall_s=time.perf_counter() - t0,
    scales=scales,
    monitor=watched,
    raw={p: np.asarray(v) for p, v in state.params[KNOBS].items()},
    learned={c.name: jax.tree_util.tree_map(np.asarray, state.params[c.name]) for c in components},
  )


def fold_label(fold: Sequence[str], show: int = 3) -> str:
  """``'a,b,c'`` for a small fold, ``'a,b,c ... (242 episodes)'`` for a large one."""
  fold = list(fold)
  return ','.join(fold) if len(fold) <= show else f'{",".join(fold[:show])} ... ({len(fold)} episodes)'


def crossfit(
  problem: Problem,
  knobs: Knobs,
  fixed: Mapping[str, float],
  rows: Rows,
  split: Folds,
  schedule: Schedule,
  *,
  components: Sequence[Component] = (),
  inputs: Mapping[str, Any] | None = None,
  log: Callable[[str], None] | None = None,
  monitor: Callable[[int, np.ndarray], Monitor] | None = None,
  devices: Sequence[jax.Device] | None = None,
) -> list[FitResult]:
  """One fit (:func:`fit`) per fold on the rows of every other fold, asserted disjoint (by question id) from the
  fold's rows (the one cross-fit). Folds share one compiled step; fold f draws minibatches and initialises its
  components with seed ``schedule.seed + f``. ``monitor(f, train rows)`` gives fold f's monitor (see :func:`fit`).

  ``devices``: with more than one, the folds run concurrently, one thread per device (each device takes the next
  fold when it is free; the rows and inputs are copied to each device once). A fold's computation is the same
  program on any device of a platform, so the results equal the sequential run's (tested); on CPU, fake devices
  (``jax_num_cpu_devices``) put each core to work on its own fold. ``None`` or one device: sequentially on the
  default device. Results are returned in fold order; ``log`` lines come in the order folds finish.

  Example:
    >>> import numpy as np, optax
    >>> from engram_jax.testing.synthetic import toy_fit_data
    >>> episodes, embeddings, arrays, pipe = toy_fit_data()  # 2 x 12 questions that repeat their gold item's text
    >>> from engram_jax.fit import Folds, Schedule, build_rows, crossfit, episode_folds, make_problem
    >>> problem, knobs, fixed = make_problem(pipe, ['legs.bm25.weight'])
    >>> rows = build_rows(problem, pipe, episodes, arrays, seed=0)
    >>> row_episodes = [ep.id for ep in episodes for _ in ep.questions]
    >>> question_ids = [q.id for ep in episodes for q in ep.questions]
    >>> folds = episode_folds([ep.id for ep in episodes], n_folds=2)
    >>> split = Folds(row_episodes, question_ids, folds)
    >>> fits = crossfit(problem, knobs, fixed, rows, split, Schedule(optax.adam(0.1), steps=5, batch_size=8))
    >>> len(fits), fits[0].train_rows  # one fit per fold, each trained on the other fold's 12 questions
    (2, 12)
  """
  components = tuple(components)
  row_episodes, question_ids, folds = np.asarray(split.row_episodes), split.question_ids, split.folds
  seed, batch_size = schedule.seed, schedule.batch_size
  max_gold = max_gold_of(rows)
  grouped = group_optimizer(schedule.optimizer, components)
  step_fn = make_step(problem, grouped, max_gold=max_gold, components=components)
  splits = []
  for fold in folds:
    scored = np.flatnonzero(np.isin(row_episodes, list(fold)))
    train = np.flatnonzero(~np.isin(row_episodes, list(fold)))
    check_disjoint(question_ids, train, scored)
    splits.append(train)

  def one(f: int, rows_f: Rows, inputs_f) -> FitResult:
    res = fit(
      problem,
      knobs,
      fixed,
      rows_f,
      splits[f],
      dataclasses.replace(schedule, seed=seed + f),
      components=components,
      inputs=inputs_f,
      step_fn=step_fn,
      max_gold=max_gold,
      monitor=None if monitor is None else monitor(f, splits[f]),
    )
    if log:
      names = '+'.join([KNOBS, *(c.name for c in components)])
      log(
        f'{names} fold {f} ({fold_label(folds[f])}): {len(splits[f])} training questions, loss {res.losses[0]:.4f} '
        f'-> {np.mean(res.losses[-10:]):.4f} in {res.wall_s:.1f}s; {res.values}'
      )
    return res

  devices = list(devices or [])
  if len(devices) > 1 and len(folds) > 1 and any(d.platform == 'cpu' for d in devices):
    # the step's trace and lowering are cached: the folds' first calls reuse them
    state = init_state(knobs, grouped, components=components, inputs=dict(inputs or {}), seed=seed)
    fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
    idx, w = minibatch(np.random.default_rng(seed), splits[0], batch_size)  # the types a fold's steps pass
    text = step_fn.lower(state, fixed_j, rows, dict(inputs or {}), jnp.asarray(idx), jnp.asarray(w), jnp.float32(1))
    blocking = host_blocking_kernels(text.as_text())
    if blocking:
      if log:
        log(f'folds run one after another: the step calls {blocking}, which can deadlock on concurrent CPU devices')
      devices = []
  if len(devices) <= 1 or len(folds) <= 1:
    return [one(f, rows, inputs) for f in range(len(folds))]
  return _parallel_folds(one, len(folds), devices, rows, inputs)


def _parallel_folds(one: Callable, n_folds: int, devices: Sequence[jax.Device], rows: Rows, inputs) -> list[FitResult]:
  """``[one(f, rows on d, inputs on d) for f in range(n_folds)]``, one worker thread per device ``d`` taking the next
  fold from a queue (:func:`crossfit` ``devices``)."""
  todo: queue.SimpleQueue = queue.SimpleQueue()
  for f in range(n_folds):
    todo.put(f)
  out: dict[int, FitResult] = {}

  def worker(device: jax.Device) -> None:
    with jax.default_device(device):
      rows_d, inputs_d = jax.device_put((rows, inputs), device)
      while True:
        try:
          f = todo.get_nowait()
        except queue.Empty:
          return
        out[f] = one(f, rows_d, inputs_d)

  with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
    for job in [pool.submit(worker, d) for d in devices]:
      job.result()  # re-raises a fold's error
  return [out[f] for f in range(n_folds)]


def make_soft_eval(problem: Problem, *, max_gold: int) -> Callable:
  """A jitted ``(vals, rows, idx [B], scale) -> approx-NDCG@k [B]`` of the scalar soft pipeline on rows ``idx``, knob
  values by path (for the soft-vs-hard gap; compiles once per problem and batch size)."""

  @jax.jit
  def run(vals: dict[str, Array], rows: Rows, idx: Array, scale: Array) -> Array:
    batch = jax.tree_util.tree_map(lambda x: x[idx], rows)
    return soft_ndcg(vals, batch, problem=problem, max_gold=max_gold, scale=scale)

  return run


def soft_ndcg_rows(
  soft_eval: Callable, vals: Mapping[str, Array], rows: Rows, idx: np.ndarray, *, scale: float, batch_size: int
) -> np.ndarray:
  """Approx-NDCG@k ``[len(idx)]`` of rows ``idx`` in batches of ``batch_size`` (the last one padded)."""
  idx = np.asarray(idx)
  out = []
  for lo in range(0, len(idx), batch_size):
    chunk = idx[lo : lo + batch_size]
    padded = np.concatenate([chunk, np.full(batch_size - len(chunk), chunk[0])])
    nd = soft_eval(dict(vals), rows, jnp.asarray(padded), jnp.float32(scale))
    out.append(np.asarray(nd)[: len(chunk)])
  return np.concatenate(out) if out else np.zeros(0)


def soft_objective(
  problem: Problem,
  res: FitResult,
  fixed: Mapping[str, float],
  rows: Rows,
  idx: np.ndarray,
  *,
  scale: float,
  max_gold: int,
  components: Sequence[Component] = (),
  inputs: Mapping[str, Any] | None = None,
  batch_size: int = 128,
) -> float:
  """Mean approx-NDCG@k of a fit's soft pipeline (its scalar knobs and components) on rows ``idx``, every
  temperature times ``scale``: the objective the fit maximised, evaluated on any questions (its training questions
  for the soft-vs-hard gap)."""
  components = tuple(components)
  run = jax.jit(
    lambda p, f, r, i, ix, w, sc: (
      1.0
      - loss_fn(
        p,
        f,
        jax.tree_util.tree_map(lambda x: x[ix], r),
        {c.name: c.batch(i[c.name], ix) for c in components},
        w,
        sc,
        problem=problem,
        max_gold=max_gold,
        components=components,
      )
    )
  )
  params = {KNOBS: {k: jnp.asarray(v) for k, v in res.raw.items()}}
  params.update({c.name: jax.tree_util.tree_map(jnp.asarray, res.learned[c.name]) for c in components})
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  total, idx = 0.0, np.asarray(idx)
  for start in range(0, len(idx), batch_size):
    sel = idx[start : start + batch_size]
    ix = jnp.asarray(np.pad(sel, (0, batch_size - len(sel)), mode='edge'))  # one compiled shape
    w = jnp.asarray(np.arange(batch_size) < len(sel), jnp.float32)
    total += float(run(params, fixed_j, rows, dict(inputs or {}), ix, w, jnp.float32(scale))) * len(sel)
  return total / max(len(idx), 1)
