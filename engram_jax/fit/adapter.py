r"""A low-rank query adapter fit through the soft pipeline: :math:`q' = (q + U V^\top q) / \|q + U V^\top q\|`.

``U, V`` are ``[D, r]`` (rank ``r`` from config); ``U`` starts at 0, so the adapter starts as the identity, and both
are fit jointly with the pipeline's scalar knobs on the soft twins (approx-NDCG@k). Hard scoring embeds nothing
again: it runs the hard pipeline on the adapted query embeddings (:func:`adapt_queries`), every leg that reads the
query (cosine, the CFS-R pool and solve, ...) seeing :math:`q'`.

What the soft pipeline recomputes from :math:`q'` at every step, per question of the minibatch:

* the cosine list (``rows.cos``, the twins' context) and a constant ``cosine`` leg's scores: ``docs @ q'``, from
  the episode's item embeddings (gathered per question: ``[B, N, D]``). A constant leg is ranked hard in the soft
  fusion, so by default these scores pass no gradient to the adapter (and the context's temperature scales stop
  theirs): the adapter then learns only through fitted legs that read the query (a CFS-R leg's pool cosines).
  With ``soft_query_legs`` (``fit.adapter.soft_query_legs: true``) every constant cosine leg is soft-ranked in the
  fusion at the fitted legs' rank temperature (:func:`engram_jax.fit.problem.soft_scores`, ``soft_constant``), so
  the adapter learns through it too; cold, that soft rank is the hard one. The default (false) is what the
  confirmed ``locomo_adapter`` / ``lme_adapter`` runs used, kept so that they reproduce;
* a fitted CFS-R-family leg's pool cosines ``pool_cos`` (the NNLS right-hand side :math:`b = C q'`), recomputed
  from the pool's rows. **The pool itself (its items and its Gram block) is held from the base embedding.** The
  pool is a hard top-P cut (no gradient through membership), its Gram :math:`C C^\top` does not depend on the query
  at all, and re-pooling per step would re-gather ``[B, P, P]`` blocks from the episode Gram for every step. The
  hard scorer does re-pool under :math:`q'`. This is an approximation that grows with how far the adapter moves the
  query (on LoCoMo a rank-8 adapter moved it to a cosine of 0.39-0.75 with the base query); its cost is not yet
  measured (no soft-vs-hard gap monitor for adapter fits).
  The gradient reaches ``b`` only when the CFS-R twin differentiates its solve in ``b``: ``fit.cfsr_grad`` must be
  ``implicit`` (KKT, nothing stored) or ``reverse`` (unrolled); ``forward`` stops it (checked).
* BM25 and other lexical legs do not read the query embedding and stay as they are.
"""

from __future__ import annotations

import dataclasses
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
from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.types import Episode
from engram_jax.fit.folds import check_disjoint
from engram_jax.fit.knobs import Knobs
from engram_jax.fit.problem import Problem, Rows, effective_values, soft_scores
from engram_jax.fit.train import anneal_scale, max_gold_of, minibatch


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
  """The adapter's rank and its learning rate as a fraction of the scalar knobs' (from config)."""

  rank: int
  lr_scale: float
  soft_query_legs: bool = False  # soft-rank constant cosine legs in the fusion (their gradient reaches q')

  def __post_init__(self) -> None:
    if int(self.rank) < 1 or not self.lr_scale > 0:
      raise ValueError(f'adapter.rank must be >= 1 and adapter.lr_scale > 0, got {self.rank}, {self.lr_scale}')

  def check(self, problem: Problem) -> None:
    """The CFS-R twin must pass gradients to its pool cosines when a fitted leg has them."""
    pooled = [leg.name for leg in problem.legs if leg.fitted and leg.op.startswith(('cfsr', 'tcfsr'))]
    if pooled and problem.settings.cfsr_grad == 'forward':
      raise ValueError(
        f'a query adapter needs fit.cfsr_grad=implicit or reverse (legs {pooled} read the query '
        'through their NNLS right-hand side; forward mode passes no gradient there)'
      )
    if not pooled and not (self.soft_query_legs and query_legs(problem)):
      why = (
        'it has no cosine leg'
        if not query_legs(problem)
        else 'its cosine legs are ranked hard in the soft fusion: set fit.adapter.soft_query_legs=true'
      )
      raise ValueError(
        f'the query adapter of {problem.name} would get no gradient: no fitted leg reads the query '
        f'(CFS-R pool cosines) and {why}'
      )


@struct.dataclass
class Inputs:
  """Per-question query embeddings and per-episode item embeddings (padded to one N)."""

  query: Array  # [Q, D]
  docs: Array  # [E, N, D]
  episode: Array  # [Q] int32, each question's episode (row into ``docs``)


def build_inputs(episodes: Sequence[Episode], arrays: Sequence[EpisodeArrays]) -> Inputs:
  n_pad = max(a.docs.shape[0] for a in arrays)
  docs = np.stack([np.pad(np.asarray(a.docs, np.float32), [(0, n_pad - a.docs.shape[0]), (0, 0)]) for a in arrays])
  query = np.concatenate([np.asarray(a.queries, np.float32)[: len(e.questions)] for e, a in zip(episodes, arrays)])
  ep = np.concatenate([np.full(len(e.questions), i, np.int32) for i, e in enumerate(episodes)])
  return Inputs(query=jnp.asarray(query), docs=jnp.asarray(docs), episode=jnp.asarray(ep))


def init_params(spec: AdapterSpec, dim: int, seed: int) -> dict[str, Array]:
  """``U = 0`` (identity adapter), ``V ~ N(0, 1/D)``."""
  v = jax.random.normal(jax.random.key(seed), (dim, int(spec.rank)), jnp.float32) / np.sqrt(dim)
  return {'u': jnp.zeros((dim, int(spec.rank)), jnp.float32), 'v': v}


def adapt(params: Mapping[str, Array], q: ArrayLike) -> Array:
  """``[..., D]`` unit-norm adapted queries."""
  q = jnp.asarray(q)
  x = q + (q @ params['v']) @ params['u'].T
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def adapt_queries(params: Mapping[str, Any], queries: np.ndarray) -> np.ndarray:
  """NumPy-in, NumPy-out :func:`adapt` (float32) for hard scoring."""
  return np.asarray(adapt({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(queries, jnp.float32)))


def adapted_rows(problem: Problem, rows: Rows, inputs: Inputs, params: Mapping[str, Array]) -> Rows:
  """``rows`` (a batch) with everything that reads the query recomputed from the adapted query (see the module
  docstring: the cosine list, a constant cosine leg, fitted CFS-R legs' pool cosines; pools held)."""
  q = adapt(params, inputs.query)
  d = inputs.docs[inputs.episode]
  cos = jnp.where(rows.where, jnp.einsum('bnd,bd->bn', d, q), -jnp.inf)
  legs = []
  for l, leg in enumerate(problem.legs):
    x = rows.legs[l]
    if not leg.fitted and leg.op == 'cosine':
      x = cos
    elif leg.fitted and isinstance(x, dict) and 'pool_cos' in x:
      x = {**x, 'pool_cos': jnp.where(x['pool_valid'], jnp.take_along_axis(cos, x['pool_idx'], axis=-1), x['pool_cos'])}
    legs.append(x)
  return rows.replace(cos=cos, legs=tuple(legs))


def query_legs(problem: Problem) -> tuple[int, ...]:
  """Indices of the constant legs whose scores :func:`adapted_rows` recomputes from the adapted query (cosine)."""
  return tuple(l for l, leg in enumerate(problem.legs) if not leg.fitted and leg.op == 'cosine')


def loss_fn(
  params: dict,
  fixed: Mapping[str, Array],
  rows: Rows,
  inputs: Inputs,
  weight: Array,
  scale: ArrayLike = 1.0,
  *,
  problem: Problem,
  max_gold: int,
  soft_legs: tuple[int, ...] = (),
) -> Array:
  """``1 - weighted mean approx-NDCG@k`` of the soft pipeline on adapted queries; constant legs ``soft_legs``
  soft-ranked (:func:`query_legs` when ``AdapterSpec.soft_query_legs``)."""
  vals = dict(fixed)
  vals.update(Knobs(raw=dict(params['raw']), transforms=problem.fitted).values())
  r = adapted_rows(problem, rows, inputs, params['adapter'])
  s = soft_scores(problem, vals, r, scale, soft_constant=soft_legs)
  t = problem.temperatures.scaled(scale)
  temp = t.final * relax.gap_scale(s, k=problem.k, where=r.where)
  nd = relax.approx_ndcg(
    s, r.labels, k=problem.k, where=r.where, temperature=temp, cutoff_temperature=t.cutoff, max_gold=max_gold
  )
  return 1.0 - jnp.sum(weight * nd) / jnp.maximum(jnp.sum(weight), 1e-12)


def make_step(
  problem: Problem, spec: AdapterSpec, optimizer: optax.GradientTransformation, *, max_gold: int
) -> Callable:
  soft_legs = query_legs(problem) if spec.soft_query_legs else ()
  grad_fn = jax.value_and_grad(lambda p, *a: loss_fn(p, *a, problem=problem, max_gold=max_gold, soft_legs=soft_legs))

  @jax.jit
  def step(params, opt_state, fixed, rows, inputs, idx, weight, scale):
    batch_rows = jax.tree_util.tree_map(lambda x: x[idx], rows)
    batch_in = Inputs(query=inputs.query[idx], docs=inputs.docs, episode=inputs.episode[idx])
    loss, grads = grad_fn(params, fixed, batch_rows, batch_in, weight, scale)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    updates = {
      'raw': updates['raw'],
      'adapter': jax.tree_util.tree_map(lambda u: u * spec.lr_scale, updates['adapter']),
    }
    return optax.apply_updates(params, updates), opt_state, loss

  return step


@dataclasses.dataclass
class AdapterFit:
  values: dict[str, float]
  adapter: dict[str, np.ndarray]
  losses: list[float]
  train_rows: int
  wall_s: float
  raw: dict[str, np.ndarray] | None = None  # the scalar knobs' unconstrained values (for soft re-evaluation)


def fit(
  problem: Problem,
  spec: AdapterSpec,
  knobs: Knobs,
  fixed: Mapping[str, float],
  rows: Rows,
  inputs: Inputs,
  train: np.ndarray,
  *,
  optimizer: optax.GradientTransformation,
  steps: int,
  batch_size: int,
  seed: int,
  step_fn: Callable | None = None,
  max_gold: int | None = None,
  anneal: tuple[float, float] = (1.0, 1.0),
) -> AdapterFit:
  """Fit the scalar knobs and the adapter jointly on rows ``train`` (minibatches as :func:`engram_jax.fit.fit`)."""
  t0 = time.perf_counter()
  spec.check(problem)
  max_gold = max_gold_of(rows) if max_gold is None else max_gold
  step_fn = step_fn or make_step(problem, spec, optimizer, max_gold=max_gold)
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  params = {'raw': dict(knobs.raw), 'adapter': init_params(spec, inputs.query.shape[-1], seed)}
  opt_state = optimizer.init(params)
  rng = np.random.default_rng(seed)
  train = np.asarray(train)
  losses = []
  for t in range(steps):
    scale = anneal_scale(t, steps, anneal)
    idx, w = minibatch(rng, train, batch_size)
    params, opt_state, loss = step_fn(
      params, opt_state, fixed_j, rows, inputs, jnp.asarray(idx), jnp.asarray(w), jnp.float32(scale)
    )
    losses.append(loss)
  vals = effective_values(problem, params['raw'], fixed_j)
  out = {p: float(vals[p]) for p, _ in problem.fitted}
  losses = [float(x) for x in losses]
  if not all(np.isfinite(v) for v in out.values()) or not np.all(np.isfinite(losses)):
    raise FloatingPointError(f'adapter fit of {problem.name} diverged: {out}')
  return AdapterFit(
    values=out,
    adapter={k: np.asarray(v) for k, v in params['adapter'].items()},
    losses=losses,
    train_rows=len(train),
    wall_s=time.perf_counter() - t0,
    raw={k: np.asarray(v) for k, v in params['raw'].items()},
  )


def soft_ndcg_fn(problem: Problem, spec: AdapterSpec, *, max_gold: int) -> Callable:
  """The jitted batch objective :func:`soft_ndcg` evaluates (build it once, use it for every fold)."""
  soft_legs = query_legs(problem) if spec.soft_query_legs else ()
  return jax.jit(
    lambda p, f, r, i, w, sc: 1.0 - loss_fn(p, f, r, i, w, sc, problem=problem, max_gold=max_gold, soft_legs=soft_legs)
  )


def soft_ndcg(
  problem: Problem,
  spec: AdapterSpec,
  res: AdapterFit,
  fixed: Mapping[str, float],
  rows: Rows,
  inputs: Inputs,
  idx: np.ndarray,
  *,
  scale: float,
  max_gold: int,
  batch_size: int = 128,
  fn: Callable | None = None,
) -> float:
  """Mean approx-NDCG@k of a fitted adapter's soft pipeline on rows ``idx`` (every temperature times ``scale``):
  the objective the fit maximised, evaluated on any questions (its training questions for the soft-vs-hard gap).
  ``fn``: :func:`soft_ndcg_fn` of the same problem (one compilation across calls)."""
  fn = fn or soft_ndcg_fn(problem, spec, max_gold=max_gold)
  params = {
    'raw': {k: jnp.asarray(v) for k, v in (res.raw or {}).items()},
    'adapter': {k: jnp.asarray(v) for k, v in res.adapter.items()},
  }
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  total = 0.0
  idx = np.asarray(idx)
  for start in range(0, len(idx), batch_size):
    sel = idx[start : start + batch_size]
    sel_j = jnp.asarray(np.pad(sel, (0, batch_size - len(sel)), mode='edge'))  # one compiled shape
    w = jnp.asarray(np.arange(batch_size) < len(sel), jnp.float32)
    r = jax.tree_util.tree_map(lambda x: x[sel_j], rows)
    b_in = Inputs(query=inputs.query[sel_j], docs=inputs.docs, episode=inputs.episode[sel_j])
    total += float(fn(params, fixed_j, r, b_in, w, jnp.float32(scale))) * len(sel)
  return total / max(len(idx), 1)


def crossfit(
  problem: Problem,
  spec: AdapterSpec,
  knobs: Knobs,
  fixed: Mapping[str, float],
  rows: Rows,
  inputs: Inputs,
  *,
  row_episodes: Sequence[str],
  question_ids: Sequence[str],
  folds: Sequence[Sequence[str]],
  optimizer: optax.GradientTransformation,
  steps: int,
  batch_size: int,
  seed: int,
  anneal: tuple[float, float] = (1.0, 1.0),
  log: Callable[[str], None] | None = None,
) -> list[AdapterFit]:
  """One adapter fit per fold on every other fold's rows (asserted disjoint by question id); seed ``seed + f``."""
  row_episodes = np.asarray(row_episodes)
  max_gold = max_gold_of(rows)
  step_fn = make_step(problem, spec, optimizer, max_gold=max_gold)
  out = []
  for f, fold in enumerate(folds):
    scored = np.flatnonzero(np.isin(row_episodes, list(fold)))
    train = np.flatnonzero(~np.isin(row_episodes, list(fold)))
    check_disjoint(question_ids, train, scored)
    res = fit(
      problem,
      spec,
      knobs,
      fixed,
      rows,
      inputs,
      train,
      optimizer=optimizer,
      steps=steps,
      batch_size=batch_size,
      seed=seed + f,
      step_fn=step_fn,
      max_gold=max_gold,
      anneal=anneal,
    )
    if log:
      log(
        f'adapter fold {f}: {len(train)} training questions, loss {res.losses[0]:.4f} -> '
        f'{np.mean(res.losses[-10:]):.4f} in {res.wall_s:.1f}s; scalars {res.values}'
      )
    out.append(res)
  return out
