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

from engram_jax import relax
from engram_jax.fit.knobs import Knobs
from engram_jax.fit.problem import Problem, Rows, effective_values, soft_scores
from engram_jax.fit.splits import DEFAULT_SEED, check_disjoint


@struct.dataclass
class TrainState:
  """Unconstrained knobs, optimiser state and step count; the jitted step maps one to the next."""

  raw: dict[str, Array]
  opt_state: Any
  step: Array


def loss_fn(raw: Mapping[str, Array], fixed: Mapping[str, Array], rows: Rows, weight: Array, *,
            problem: Problem, max_gold: int) -> Array:
  r"""``1 - weighted mean approx-NDCG@k`` of the soft pipeline over a batch of rows (weight 0 = padding)."""
  vals = dict(fixed)
  vals.update(Knobs(raw=dict(raw), transforms=problem.fitted).values())
  s = soft_scores(problem, vals, rows)
  t = problem.temperatures
  temp = t.final * relax.gap_scale(s, k=problem.k, where=rows.where)
  nd = relax.approx_ndcg(s, rows.labels, k=problem.k, where=rows.where, temperature=temp,
                         cutoff_temperature=t.cutoff, max_gold=max_gold)
  return 1.0 - jnp.sum(weight * nd) / jnp.maximum(jnp.sum(weight), 1e-12)


def make_step(problem: Problem, optimizer: optax.GradientTransformation, *, max_gold: int) -> Callable:
  """The jitted training step ``(state, fixed, rows, idx [B], weight [B]) -> (state, loss)``.

  ``problem`` and ``max_gold`` are static (closed over); knob values, the optimiser state and the rows are
  traced, so a second call with other values (or another fold's batch) does not recompile.
  """
  grad_fn = jax.value_and_grad(functools.partial(loss_fn, problem=problem, max_gold=max_gold))

  @jax.jit
  def step(state: TrainState, fixed: dict[str, Array], rows: Rows, idx: Array, weight: Array):
    batch = jax.tree_util.tree_map(lambda x: x[idx], rows)
    loss, grads = grad_fn(state.raw, fixed, batch, weight)
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


def max_gold_of(rows: Rows) -> int:
  """Largest number of gold items of any question (static; bucketed to a multiple of 4)."""
  g = int(np.max(np.sum(np.asarray(rows.labels), axis=-1)))
  return max(4, -(-g // 4) * 4)


def fit(problem: Problem, knobs: Knobs, fixed: Mapping[str, float], rows: Rows, train: np.ndarray, *,
        optimizer: optax.GradientTransformation, steps: int, batch_size: int, seed: int = DEFAULT_SEED,
        step_fn: Callable | None = None, max_gold: int | None = None) -> FitResult:
  """Fit ``knobs`` on rows ``train`` (indices) by ``steps`` optax steps on minibatches of ``batch_size``.

  Minibatches are drawn without replacement by ``numpy.random.default_rng(seed)`` (all training rows,
  zero-weight padded, when there are fewer than ``batch_size``). Pass ``step_fn`` (from :func:`make_step`)
  to share one compiled step between fits of the same problem (e.g. cross-fitting folds).
  """
  t0 = time.perf_counter()
  max_gold = max_gold_of(rows) if max_gold is None else max_gold
  step_fn = step_fn or make_step(problem, optimizer, max_gold=max_gold)
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  state = TrainState(raw=dict(knobs.raw), opt_state=optimizer.init(dict(knobs.raw)), step=jnp.zeros((), jnp.int32))
  rng = np.random.default_rng(seed)
  train = np.asarray(train)
  losses = []
  for _ in range(steps):
    if len(train) >= batch_size:
      idx, w = rng.choice(train, batch_size, replace=False), np.ones(batch_size, np.float32)
    else:
      idx = np.concatenate([train, np.full(batch_size - len(train), train[0])])
      w = (np.arange(batch_size) < len(train)).astype(np.float32)
    state, loss = step_fn(state, fixed_j, rows, jnp.asarray(idx), jnp.asarray(w))
    losses.append(loss)
  vals = effective_values(problem, state.raw, fixed_j)
  out = {p: float(vals[p]) for p, _ in problem.fitted}
  if not all(np.isfinite(v) for v in out.values()) or not np.all(np.isfinite(np.asarray(losses))):
    raise FloatingPointError(f'fit of {problem.name} diverged (non-finite loss or knobs): {out}')
  if problem.normalise_weights:
    out.update({f'legs.{leg.name}.weight': float(vals[f'legs.{leg.name}.weight']) for leg in problem.legs})
  return FitResult(values=out, losses=[float(x) for x in losses], train_rows=len(train),
                   wall_s=time.perf_counter() - t0)


def fold_label(fold: Sequence[str], show: int = 3) -> str:
  """``'a,b,c'`` for a small fold, ``'a,b,c ... (242 episodes)'`` for a large one."""
  fold = list(fold)
  return ','.join(fold) if len(fold) <= show else f'{",".join(fold[:show])} ... ({len(fold)} episodes)'


def crossfit(problem: Problem, knobs: Knobs, fixed: Mapping[str, float], rows: Rows, *,
             row_episodes: Sequence[str], question_ids: Sequence[str], folds: Sequence[Sequence[str]],
             optimizer: optax.GradientTransformation, steps: int, batch_size: int, seed: int = DEFAULT_SEED,
             log: Callable[[str], None] | None = None) -> list[FitResult]:
  """One fit per fold on the rows of every other fold, asserted disjoint (by question id) from the fold's
  rows. Folds share one compiled step; fold f draws minibatches with seed ``seed + f``."""
  row_episodes = np.asarray(row_episodes)
  max_gold = max_gold_of(rows)
  step_fn = make_step(problem, optimizer, max_gold=max_gold)
  out = []
  for f, fold in enumerate(folds):
    scored = np.flatnonzero(np.isin(row_episodes, list(fold)))
    train = np.flatnonzero(~np.isin(row_episodes, list(fold)))
    check_disjoint(question_ids, train, scored)
    res = fit(problem, knobs, fixed, rows, train, optimizer=optimizer, steps=steps, batch_size=batch_size,
              seed=seed + f, step_fn=step_fn, max_gold=max_gold)
    if log:
      log(f'fold {f} ({fold_label(fold)}): {len(train)} training questions, loss {res.losses[0]:.4f} -> '
          f'{np.mean(res.losses[-10:]):.4f} in {res.wall_s:.1f}s; {res.values}')
    out.append(res)
  return out

