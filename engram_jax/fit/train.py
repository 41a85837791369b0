"""Training: the approx-NDCG loss of the soft pipeline, a jitted optax step that compiles once per problem, a fit
on a set of training rows, and cross-fitting by episode folds.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
from engram_jax.fit.problem import Problem, Rows, effective_values, soft_scores


@struct.dataclass
class TrainState:
  """Unconstrained knobs, optimiser state and step count; the jitted step maps one to the next."""

  raw: dict[str, Array]
  opt_state: Any
  step: Array


def soft_ndcg(
  vals: Mapping[str, Array], rows: Rows, *, problem: Problem, max_gold: int, scale: ArrayLike = 1.0
) -> Array:
  """Approx-NDCG@k ``[B]`` of the soft pipeline on a batch of rows, knob values by path, temperatures times
  ``scale``."""
  s = soft_scores(problem, vals, rows, scale)
  t = problem.temperatures.scaled(scale)
  temp = t.final * relax.gap_scale(s, k=problem.k, where=rows.where)
  return relax.approx_ndcg(
    s, rows.labels, k=problem.k, where=rows.where, temperature=temp, cutoff_temperature=t.cutoff, max_gold=max_gold
  )


def loss_fn(
  raw: Mapping[str, Array],
  fixed: Mapping[str, Array],
  rows: Rows,
  weight: Array,
  scale: ArrayLike = 1.0,
  *,
  problem: Problem,
  max_gold: int,
) -> Array:
  r"""``1 - weighted mean approx-NDCG@k`` of the soft pipeline over a batch of rows (weight 0 = padding), every
  temperature times ``scale``."""
  vals = dict(fixed)
  vals.update(Knobs(raw=dict(raw), transforms=problem.fitted).values())
  nd = soft_ndcg(vals, rows, problem=problem, max_gold=max_gold, scale=scale)
  return 1.0 - jnp.sum(weight * nd) / jnp.maximum(jnp.sum(weight), 1e-12)


def anneal_scale(step: int, steps: int, anneal: tuple[float, float] = (1.0, 1.0)) -> float:
  """The temperature factor at ``step`` of ``steps``: geometric from ``anneal[0]`` (first step) to ``anneal[1]``
  (last step); ``(1, 1)`` keeps the temperatures as set."""
  start, end = (float(a) for a in anneal)
  if start <= 0 or end <= 0:
    raise ValueError(f'annealing factors must be > 0, got {anneal}')
  return start * (end / start) ** (step / max(steps - 1, 1))


def make_step(problem: Problem, optimizer: optax.GradientTransformation, *, max_gold: int) -> Callable:
  """The jitted training step ``(state, fixed, rows, idx [B], weight [B], scale) -> (state, loss)``.

  ``problem`` and ``max_gold`` are static (closed over); knob values, the optimiser state, the rows and the
  temperature factor ``scale`` are traced, so a second call with other values (or another fold's batch, or the
  next step of an annealing schedule) does not recompile.
  """
  grad_fn = jax.value_and_grad(functools.partial(loss_fn, problem=problem, max_gold=max_gold))

  @jax.jit
  def step(state: TrainState, fixed: dict[str, Array], rows: Rows, idx: Array, weight: Array, scale: Array):
    batch = jax.tree_util.tree_map(lambda x: x[idx], rows)
    loss, grads = grad_fn(state.raw, fixed, batch, weight, scale)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.raw)
    raw = optax.apply_updates(state.raw, updates)
    return TrainState(raw=raw, opt_state=opt_state, step=state.step + 1), loss

  return step


@dataclasses.dataclass
class FitResult:
  """One fit: the fitted knobs (constrained, by path, the values the hard pipeline uses), the loss curve."""

  values: dict[str, float]
  losses: list[float]
  train_rows: int
  wall_s: float
  scales: list[float] = dataclasses.field(default_factory=list)  # temperature factor per step
  monitor: list[dict[str, float]] = dataclasses.field(default_factory=list)  # what ``monitor`` returned, by step


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


def fit(
  problem: Problem,
  knobs: Knobs,
  fixed: Mapping[str, float],
  rows: Rows,
  train: np.ndarray,
  *,
  optimizer: optax.GradientTransformation,
  steps: int,
  batch_size: int,
  seed: int = DEFAULT_SEED,
  step_fn: Callable | None = None,
  max_gold: int | None = None,
  anneal: tuple[float, float] = (1.0, 1.0),
  monitor: Monitor | None = None,
  monitor_steps: Sequence[int] = (),
) -> FitResult:
  """Fit ``knobs`` on rows ``train`` (indices) by ``steps`` optax steps on minibatches of ``batch_size``.

  Minibatches are drawn without replacement by ``numpy.random.default_rng(seed)`` (all training rows,
  zero-weight padded, when there are fewer than ``batch_size``). Pass ``step_fn`` (from :func:`make_step`)
  to share one compiled step between fits of the same problem (e.g. cross-fitting folds). Temperatures are
  multiplied by :func:`anneal_scale` at each step. ``monitor(step, scale, every knob value by path)`` is called
  before each step in ``monitor_steps`` (``steps`` = after the last one); what it returns is kept, by step, in
  :attr:`FitResult.monitor` (e.g. the soft-vs-hard gap on the training questions). It never changes the fit.
  """
  t0 = time.perf_counter()
  max_gold = max_gold_of(rows) if max_gold is None else max_gold
  step_fn = step_fn or make_step(problem, optimizer, max_gold=max_gold)
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  state = TrainState(raw=dict(knobs.raw), opt_state=optimizer.init(dict(knobs.raw)), step=jnp.zeros((), jnp.int32))
  rng = np.random.default_rng(seed)
  train = np.asarray(train)
  losses, scales, watched = [], [], []
  monitor_steps = set(monitor_steps)
  for t in range(steps + 1):
    scale = anneal_scale(min(t, steps - 1), steps, anneal)
    if monitor is not None and t in monitor_steps:
      watched.append({'step': t, 'scale': scale, **monitor(t, scale, effective_values(problem, state.raw, fixed_j))})
    if t == steps:
      break
    idx, w = minibatch(rng, train, batch_size)
    state, loss = step_fn(state, fixed_j, rows, jnp.asarray(idx), jnp.asarray(w), jnp.float32(scale))
    losses.append(loss)
    scales.append(scale)
  out = fitted_values(problem, effective_values(problem, state.raw, fixed_j))
  if not all(np.isfinite(v) for v in out.values()) or not np.all(np.isfinite(np.asarray(losses))):
    raise FloatingPointError(f'fit of {problem.name} diverged (non-finite loss or knobs): {out}')
  return FitResult(
    values=out,
    losses=[float(x) for x in losses],
    train_rows=len(train),
    wall_s=time.perf_counter() - t0,
    scales=scales,
    monitor=watched,
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
  *,
  row_episodes: Sequence[str],
  question_ids: Sequence[str],
  folds: Sequence[Sequence[str]],
  optimizer: optax.GradientTransformation,
  steps: int,
  batch_size: int,
  seed: int = DEFAULT_SEED,
  log: Callable[[str], None] | None = None,
  anneal: tuple[float, float] = (1.0, 1.0),
  monitor: Callable[[int, np.ndarray], Monitor] | None = None,
  monitor_steps: Sequence[int] = (),
) -> list[FitResult]:
  """One fit per fold on the rows of every other fold, asserted disjoint (by question id) from the fold's
  rows. Folds share one compiled step; fold f draws minibatches with seed ``seed + f``. ``monitor(f, train rows)``
  gives fold f's monitor (see :func:`fit`)."""
  row_episodes = np.asarray(row_episodes)
  max_gold = max_gold_of(rows)
  step_fn = make_step(problem, optimizer, max_gold=max_gold)
  out = []
  for f, fold in enumerate(folds):
    scored = np.flatnonzero(np.isin(row_episodes, list(fold)))
    train = np.flatnonzero(~np.isin(row_episodes, list(fold)))
    check_disjoint(question_ids, train, scored)
    res = fit(
      problem,
      knobs,
      fixed,
      rows,
      train,
      optimizer=optimizer,
      steps=steps,
      batch_size=batch_size,
      seed=seed + f,
      step_fn=step_fn,
      max_gold=max_gold,
      anneal=anneal,
      monitor=None if monitor is None else monitor(f, train),
      monitor_steps=monitor_steps,
    )
    if log:
      log(
        f'fold {f} ({fold_label(fold)}): {len(train)} training questions, loss {res.losses[0]:.4f} -> '
        f'{np.mean(res.losses[-10:]):.4f} in {res.wall_s:.1f}s; {res.values}'
      )
    out.append(res)
  return out


def make_soft_eval(problem: Problem, *, max_gold: int) -> Callable:
  """A jitted ``(vals, rows, idx [B], scale) -> approx-NDCG@k [B]`` of the soft pipeline on rows ``idx`` (for the
  soft-vs-hard gap; compiles once per problem and batch size)."""

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
