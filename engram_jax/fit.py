r"""Fit a pipeline's knobs by gradient: its soft twin, approx-NDCG@k, optax, seeded disjoint splits.

Fit soft, report hard. The soft twin of a :class:`engram_jax.pipeline.Pipeline` keeps every leg that has
nothing to fit exactly as the hard leg (its scores are computed once, by the leg function itself, and
ranked hard inside :func:`engram_jax.fusion.soft_rrf_fuse`), and relaxes only what the fitted knobs
move: soft ranks and a soft depth cutoff for a fitted scoring leg (BM25 ``k1``/``b``, CFS-R ``lam``/``w``,
Tide ``weight``), softmax-relaxed greedy steps for a fitted CFS / MMR leg, soft ranks of the fused list
for the loss.

Everything the knobs cannot move is precomputed per question (:class:`Rows`): cosine scores, the hard
scores of constant legs, the cosine top-P pool and its Gram block (the CFS-R / CFS / MMR pool is the cosine
top-P, which no knob moves), BM25 term statistics. All episodes are padded to one N, so a training step is
a minibatch of questions drawn from any episodes, and the jitted step compiles once per problem.

Temperatures are unit-free: each is a factor times a per-list scale (:func:`engram_jax.relax.gap_scale`,
the mean score gap in the list's top part, gradient stopped), so one setting serves cosine, BM25, CFS-R
and fused RRF scores alike. Depth and NDCG cutoffs are soft in rank units.

Knobs are an unconstrained pytree (:class:`Knobs`: log for positive scales, logit for [0, 1] weights,
softplus for fusion weights), keyed by their dotted path in the pipeline's config node
(``legs.2.score.lam``, ``legs.0.weight``, ``k0``), so fitted values write straight back into config.
When every fusion weight is fitted they are renormalised to their initial mean inside the loss (hard RRF
does not depend on their common scale, so neither should the fit).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax import Array

from engram_jax import diversity, fusion, ranking, recency, reconstruction, relax, validation
from engram_jax import pipeline as pipeline_lib
from engram_jax.data import splits
from engram_jax.pipeline import EpisodeArrays, Pipeline
from engram_jax.types import Episode

DEFAULT_SEED = splits.PILOT_SEED  # 20261008

# ---- knobs and their unconstrained maps ----------------------------------------------------------

_LEG_KINDS = {pipeline_lib.cosine_leg: 'cosine', pipeline_lib.bm25_leg: 'bm25', pipeline_lib.cfsr_leg: 'cfsr',
              pipeline_lib.cfs_leg: 'cfs', pipeline_lib.mmr_leg: 'mmr', pipeline_lib.tide_leg: 'tide'}
# (leg kind, keyword) -> transform of the unconstrained value; what can be fit.
_SCORE_KNOBS = {('bm25', 'k1'): 'log', ('bm25', 'b'): 'logit', ('cfsr', 'lam'): 'log', ('cfsr', 'w'): 'logit',
                ('cfs', 'beta'): 'log', ('cfs', 'sigma'): 'log', ('mmr', 'lam'): 'logit',
                ('tide', 'weight'): 'identity'}

_FORWARD: dict[str, Callable[[Array], Array]] = {
    'softplus': jax.nn.softplus, 'log': jnp.exp, 'logit': jax.nn.sigmoid, 'identity': lambda x: x}


def _inverse(kind: str, value: float) -> float:
  if kind == 'softplus':
    value = max(value, 1e-6)
    return float(value + np.log(-np.expm1(-value)))
  if kind == 'log':
    return float(np.log(max(value, 1e-12)))
  if kind == 'logit':
    v = min(max(value, 1e-4), 1 - 1e-4)
    return float(np.log(v) - np.log1p(-v))
  return float(value)


@struct.dataclass
class Knobs:
  """The fitted knobs: unconstrained values (traced) and how each maps to its constrained value (static)."""

  raw: dict[str, Array]
  transforms: tuple[tuple[str, str], ...] = struct.field(pytree_node=False)

  def values(self) -> dict[str, Array]:
    """Constrained values by config path."""
    kinds = dict(self.transforms)
    return {p: _FORWARD[kinds[p]](v) for p, v in self.raw.items()}


@struct.dataclass
class TrainState:
  """Unconstrained knobs, optimiser state and step count; the jitted step maps one to the next."""

  raw: dict[str, Array]
  opt_state: Any
  step: Array


# ---- the soft problem (static description) ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LegInfo:
  kind: str                        # cosine | bm25 | cfsr | cfs | mmr | tide | other
  depth: int
  options: tuple[tuple[str, Any], ...]  # the leg function's keywords (with its defaults)
  fitted: bool                     # any of its score knobs is fitted

  def opt(self, name: str) -> Any:
    return dict(self.options)[name]


@dataclasses.dataclass(frozen=True)
class Temperatures:
  """Unit-free temperatures (factors of :func:`engram_jax.relax.gap_scale`) and cutoffs in rank units."""

  rank: float = 0.5     # soft ranks inside a fitted leg
  depth: float = 0.5    # soft depth cutoff of a fitted leg (rank units)
  greedy: float = 0.5   # softmax of a relaxed greedy step
  final: float = 0.5    # soft ranks of the final list (the loss)
  cutoff: float = 0.5   # soft NDCG@k cutoff (rank units)

  def __post_init__(self) -> None:
    validation.check_positive(dataclasses.asdict(self), where='fit.temperatures')


@dataclasses.dataclass(frozen=True)
class Problem:
  """Everything static about a soft pipeline: legs, fusion, which knobs are fit, shapes, temperatures."""

  name: str
  legs: tuple[LegInfo, ...]
  fusion: str
  fitted: tuple[tuple[str, str], ...]   # (path, transform), in fit order
  k: int = 10
  temperatures: Temperatures = Temperatures()
  pool: int = 0                # size of the precomputed cosine pool (0 = none)
  greedy_pool: int = 100       # pool of a relaxed CFS / MMR leg (the hard leg may use all items)
  candidates: int = 10         # extra soft-rank candidates beyond a fitted leg's depth
  solve_batch: int | None = 8   # CFS-R pools solved this many at a time (cache-friendly on CPU)
  normalise_weights: bool = False
  initial_weight_mean: float = 1.0


def _leg_info(spec: pipeline_lib.LegSpec, fitted_names: set[str]) -> LegInfo:
  fn = getattr(spec.score, 'func', spec.score)
  kind = _LEG_KINDS.get(fn, 'other')
  options = {n: p.default for n, p in inspect.signature(fn).parameters.items()
             if p.kind == p.KEYWORD_ONLY and p.default is not p.empty}
  options.update(getattr(spec.score, 'keywords', {}) or {})
  for name in fitted_names:
    if (kind, name) not in _SCORE_KNOBS:
      raise ValueError(f'cannot fit {name!r} of a {kind} leg; fittable: '
                       f'{sorted(n for k, n in _SCORE_KNOBS if k == kind)}')
  if kind == 'tide' and options.get('base') != 'cosine' and fitted_names:
    raise ValueError('fitting Tide is supported on a cosine base only')
  return LegInfo(kind=kind, depth=int(spec.depth), options=tuple(sorted(options.items())), fitted=bool(fitted_names))


def knob_value(pipe: Pipeline, path: str) -> float:
  """The hand-set value of knob ``path`` (``k0``, ``legs.I.weight``, ``legs.I.score.NAME``) in ``pipe``."""
  parts = path.split('.')
  if parts == ['k0']:
    return float(pipe.k0)
  if len(parts) >= 3 and parts[0] == 'legs' and parts[1].isdigit() and int(parts[1]) < len(pipe.legs):
    spec = pipe.legs[int(parts[1])]
    if parts[2:] == ['weight']:
      return float(spec.weight)
    if len(parts) == 4 and parts[2] == 'score':
      info = _leg_info(spec, set())
      if parts[3] in dict(info.options):
        return float(info.opt(parts[3]))
  raise ValueError(f'pipeline {pipe.name!r} has no knob {path!r}')


def make_problem(pipe: Pipeline, params: Sequence[str], *, k: int = 10,
                 temperatures: Temperatures = Temperatures(), greedy_pool: int = 100,
                 candidates: int = 10, solve_batch: int | None = 8) -> tuple[Problem, Knobs, dict[str, float]]:
  """The soft problem of ``pipe`` with knobs ``params`` (config paths) to fit.

  Returns:
    ``(problem, knobs at their hand-set values, every numeric knob's hand-set value by path)``.

  Raises:
    ValueError: unknown or unfittable knob, fusion weights / k0 of a pipeline without RRF.
  """
  if not params:
    raise ValueError(f'nothing to fit in pipeline {pipe.name!r}')
  per_leg: dict[int, set[str]] = {i: set() for i in range(len(pipe.legs))}
  transforms = []
  for path in params:
    parts = path.split('.')
    knob_value(pipe, path)  # raises on unknown paths
    if parts == ['k0'] or parts[2:] == ['weight']:
      if pipe.fusion != 'rrf':
        raise ValueError(f'{path}: pipeline {pipe.name!r} has no fusion to weight (fusion {pipe.fusion})')
      transforms.append((path, 'log' if parts == ['k0'] else 'softplus'))
    else:
      leg = int(parts[1])
      per_leg[leg].add(parts[3])
      kind = _leg_info(pipe.legs[leg], set()).kind
      if (kind, parts[3]) not in _SCORE_KNOBS:
        raise ValueError(f'cannot fit {path!r} ({kind} leg)')
      transforms.append((path, _SCORE_KNOBS[(kind, parts[3])]))
  legs = tuple(_leg_info(s, per_leg[i]) for i, s in enumerate(pipe.legs))
  for leg in legs:
    if leg.fitted and leg.kind in ('cfs', 'mmr') and pipe.fusion != 'rrf':
      raise ValueError('a relaxed greedy leg can only be fit inside an RRF fusion')
  pools = [leg.opt('pool') or 0 for leg in legs if leg.fitted and leg.kind == 'cfsr']
  pools += [greedy_pool for leg in legs if leg.fitted and leg.kind in ('cfs', 'mmr')]
  weight_paths = [f'legs.{i}.weight' for i in range(len(pipe.legs))]
  normalise = pipe.fusion == 'rrf' and all(p in params for p in weight_paths)
  problem = Problem(name=pipe.name, legs=legs, fusion=pipe.fusion, fitted=tuple(transforms), k=k,
                    temperatures=temperatures, pool=max(pools, default=0), greedy_pool=greedy_pool,
                    candidates=candidates, solve_batch=solve_batch, normalise_weights=normalise,
                    initial_weight_mean=float(np.mean([s.weight for s in pipe.legs])))
  knobs = Knobs(raw={p: jnp.asarray(_inverse(t, knob_value(pipe, p)), jnp.float32) for p, t in transforms},
                transforms=tuple(transforms))
  every = {'k0': float(pipe.k0)} if pipe.fusion == 'rrf' else {}
  for i, (spec, leg) in enumerate(zip(pipe.legs, legs)):
    every[f'legs.{i}.weight'] = float(spec.weight)
    for (kind, name) in _SCORE_KNOBS:
      if kind == leg.kind and name in dict(leg.options):
        every[f'legs.{i}.score.{name}'] = float(leg.opt(name))
  return problem, knobs, every


# ---- per-question rows -------------------------------------------------------------------------------

@struct.dataclass
class Rows:
  """Per-question arrays, every episode padded to one N (Q questions in all). Fields a problem does not
  need are None."""

  labels: Array        # [Q, N] bool
  where: Array         # [Q, N] bool, real items of the question's episode
  cos: Array           # [Q, N] cosine, -inf for masked items
  positions: Array     # [Q, N] int32 write order
  const: tuple         # per leg: [Q, N] hard scores of a constant leg, or None
  pool_idx: Array | None = None     # [Q, P] cosine top-P (shared tie rule)
  pool_valid: Array | None = None   # [Q, P]
  pool_gram: Array | None = None    # [Q, P, P]
  bm_tf: Array | None = None        # [Q, T, N] doc term counts of the question's distinct in-vocabulary tokens
  bm_w: Array | None = None         # [Q, T] query count x idf of those tokens
  bm_dlr: Array | None = None       # [Q, N] document length / average length


def _bm25_term_stats(ep: EpisodeArrays, n_q: int, epsilon: float, n_terms: int):
  """Per question: (term counts [Q, T, N], count x idf [Q, T], dl/avgdl [N]) with rank_bm25's idf."""
  tf = np.asarray(ep.doc_tf, np.float64) * np.asarray(ep.where)[:, None]
  n = float(np.sum(ep.where))
  dl = tf.sum(-1)
  avgdl = dl.sum() / max(n, 1.0)
  df = (tf > 0).sum(0)
  in_vocab = df > 0
  idf = np.where(in_vocab, np.log(n - df + 0.5) - np.log(df + 0.5), 0.0)
  mean_idf = idf.sum() / max(in_vocab.sum(), 1)
  idf = np.where(in_vocab & (idf < 0), epsilon * mean_idf, idf)
  qtf = np.asarray(ep.query_tf)[:n_q]
  out_tf = np.zeros((n_q, n_terms, tf.shape[0]), np.float32)
  out_w = np.zeros((n_q, n_terms), np.float32)
  for i in range(n_q):
    cols = np.flatnonzero((qtf[i] > 0) & in_vocab)
    if len(cols) > n_terms:
      raise ValueError(f'question {i} has {len(cols)} distinct terms > {n_terms}')
    out_tf[i, :len(cols)] = tf[:, cols].T
    out_w[i, :len(cols)] = qtf[i, cols] * idf[cols]
  return out_tf, out_w, (dl / (avgdl if avgdl > 0 else 1.0)).astype(np.float32)


def bm25_from_stats(tf: Array, wq: Array, dlr: Array, *, k1: Array, b: Array) -> Array:
  r"""BM25 from per-question term statistics: :math:`\sum_t w_t f_t (k_1 + 1) / (f_t + k_1 (1 - b + b\,
  |d|/\mathrm{avgdl}))`; equal to :func:`engram_jax.lexical.bm25_scores` (tested) and differentiable in
  ``k1`` and ``b``. Shapes: ``tf [..., T, N]``, ``wq [..., T]``, ``dlr [..., N]`` -> ``[..., N]``."""
  norm = k1 * (1.0 - b + b * dlr)[..., None, :]
  sat = jnp.where(tf > 0, tf * (k1 + 1.0) / (tf + norm), 0.0)
  return jnp.einsum('...t,...tn->...n', wq, sat)


def build_rows(problem: Problem, pipe: Pipeline, episodes: Sequence[Episode],
               arrays: Sequence[EpisodeArrays], *, seed: int = DEFAULT_SEED) -> Rows:
  """Precompute the per-question rows of ``problem`` for every question of ``episodes`` (in order).

  Constant legs are computed by the hard leg functions of ``pipe`` (keys as in
  :func:`engram_jax.evaluation.evaluate` over this episode list).
  """
  n_pad = max(a.docs.shape[0] for a in arrays)
  base_key = jax.random.key(seed)
  const_fns = {l: jax.jit(spec.score) for l, (spec, leg) in enumerate(zip(pipe.legs, problem.legs))
               if not leg.fitted}
  cos_fn = jax.jit(pipeline_lib.cosine_leg)
  bm_leg = next((l for l, leg in enumerate(problem.legs) if leg.fitted and leg.kind == 'bm25'), None)
  n_terms = 0
  if bm_leg is not None:
    n_terms = max(int(np.max(np.sum(np.asarray(a.query_tf) > 0, axis=-1))) for a in arrays)
  parts: dict[str, list] = {f: [] for f in ('labels', 'where', 'cos', 'positions', 'pool_idx', 'pool_valid',
                                            'pool_gram', 'bm_tf', 'bm_w', 'bm_dlr')}
  const: dict[int, list] = {l: [] for l in const_fns}

  def pad_n(x, fill):
    widths = [(0, 0)] * (x.ndim - 1) + [(0, n_pad - x.shape[-1])]
    return np.pad(x, widths, constant_values=fill)

  for e, (ep, arr) in enumerate(zip(episodes, arrays)):
    nq = len(ep.questions)
    keys = jax.random.split(jax.random.fold_in(base_key, e), len(pipe.legs))
    cos = np.asarray(cos_fn(arr, keys[0]))[:nq]
    parts['labels'].append(pad_n(np.asarray(arr.labels)[:nq], False))
    parts['where'].append(pad_n(np.broadcast_to(np.asarray(arr.where), (nq, arr.where.shape[0])), False))
    parts['cos'].append(pad_n(cos, -np.inf))
    parts['positions'].append(pad_n(np.broadcast_to(np.asarray(arr.positions), (nq, arr.where.shape[0])), 0))
    for l, fn in const_fns.items():
      const[l].append(pad_n(np.asarray(fn(arr, keys[l]))[:nq], -np.inf))
    if problem.pool:
      p = min(problem.pool, n_pad)
      cos_j = jnp.asarray(parts['cos'][-1])
      where_j = jnp.asarray(parts['where'][-1])
      idx, _ = ranking.top_k(cos_j, k=p, where=where_j)
      idx = np.asarray(idx)
      docs = np.asarray(arr.docs)
      docs = np.pad(docs, [(0, n_pad - docs.shape[0]), (0, 0)])
      gram = docs @ docs.T  # the episode Gram once; each question gathers its P x P block
      parts['pool_idx'].append(idx)
      parts['pool_valid'].append(np.take_along_axis(np.asarray(where_j), idx, axis=-1))
      parts['pool_gram'].append(gram[idx[:, :, None], idx[:, None, :]].astype(np.float32))
    if bm_leg is not None:
      eps = float(problem.legs[bm_leg].opt('epsilon'))
      tf, w, dlr = _bm25_term_stats(arr, nq, eps, n_terms)
      parts['bm_tf'].append(pad_n(tf, 0.0))
      parts['bm_w'].append(w)
      parts['bm_dlr'].append(pad_n(np.broadcast_to(dlr, (nq, dlr.shape[0])), 1.0))
  cat = {f: (jnp.asarray(np.concatenate(v)) if v else None) for f, v in parts.items()}
  return Rows(labels=cat['labels'], where=cat['where'], cos=cat['cos'].astype(jnp.float32),
              positions=cat['positions'].astype(jnp.int32),
              const=tuple(jnp.asarray(np.concatenate(const[l]), jnp.float32) if l in const else None
                          for l in range(len(pipe.legs))),
              pool_idx=cat['pool_idx'], pool_valid=cat['pool_valid'], pool_gram=cat['pool_gram'],
              bm_tf=cat['bm_tf'], bm_w=cat['bm_w'], bm_dlr=cat['bm_dlr'])


# ---- the soft pipeline and the loss ----------------------------------------------------------------------

def _scatter_rows(values: Array, idx: Array, n: int, fill: float) -> Array:
  rows = jnp.arange(values.shape[0])[:, None]
  return jnp.full((values.shape[0], n), fill, values.dtype).at[rows, idx].set(values, unique_indices=True)


def _pool(rows: Rows, p: int) -> tuple[Array, Array, Array, Array]:
  idx = rows.pool_idx[:, :p]
  return (idx, rows.pool_valid[:, :p], jnp.take_along_axis(rows.cos, idx, axis=-1),
          rows.pool_gram[:, :p, :p])


def _soft_leg(problem: Problem, l: int, vals: Mapping[str, Array], rows: Rows):
  """Leg ``l``'s soft output on a batch of rows: (scores [B, N] or SoftSelection, soft-rank temperature)."""
  leg = problem.legs[l]
  t = problem.temperatures
  n = rows.cos.shape[-1]
  v = lambda name: vals[f'legs.{l}.score.{name}']
  if not leg.fitted:
    return rows.const[l], None
  if leg.kind == 'bm25':
    s = bm25_from_stats(rows.bm_tf, rows.bm_w, rows.bm_dlr, k1=v('k1'), b=v('b'))
    s = jnp.where(rows.where, s, -jnp.inf)
  elif leg.kind == 'cfsr':
    idx, valid, b, g = _pool(rows, min(int(leg.opt('pool')), rows.pool_idx.shape[-1]))
    sp = reconstruction.cfsr_pool_scores(b, g, valid=valid, lam=v('lam'), w=v('w'),
                                         iterations=int(leg.opt('iterations')), batch_size=problem.solve_batch,
                                         lam_grad='forward')
    s = _scatter_rows(sp, idx, n, -jnp.inf)
  elif leg.kind == 'tide':
    s = recency.tide_scores(rows.cos, rows.positions, weight=v('weight'), depth=int(leg.opt('depth')),
                            where=rows.where)
  elif leg.kind in ('cfs', 'mmr'):
    idx, valid, b, g = _pool(rows, min(problem.greedy_pool, rows.pool_idx.shape[-1]))
    k = int(leg.opt('k'))
    if leg.kind == 'cfs':
      floor = float(leg.opt('floor'))
      rel = jnp.log(jnp.maximum(b, floor))
      temp = t.greedy * relax.gap_scale(rel, k=k, where=valid)
      sel = diversity.soft_cfs_select_gram(b, g, k=k, beta=v('beta'), sigma=v('sigma'), temperature=temp,
                                           where=valid, floor=floor)
    else:
      temp = t.greedy * relax.gap_scale(b, k=k, where=valid) * jax.lax.stop_gradient(v('lam'))
      sel = diversity.soft_mmr_select_gram(b, g, k=k, lam=v('lam'), temperature=temp, where=valid)
    probs = jax.vmap(lambda pr, i: jnp.zeros((k, n), pr.dtype).at[:, i].set(pr, unique_indices=True))(
        sel.probs, idx)
    return diversity.SoftSelection(probs, sel.scores), None
  else:
    raise ValueError(f'no soft twin for a fitted {leg.kind} leg')
  return s, t.rank * relax.gap_scale(s, k=leg.depth, where=rows.where)


def soft_scores(problem: Problem, vals: Mapping[str, Array], rows: Rows) -> Array:
  """The soft pipeline's final scores ``[B, N]`` on a batch of rows, given every knob's value by path."""
  outs = [_soft_leg(problem, l, vals, rows) for l in range(len(problem.legs))]
  if problem.fusion == 'none':
    return jnp.where(rows.where, outs[0][0], -jnp.inf)
  weights = jnp.stack([vals[f'legs.{l}.weight'] for l in range(len(problem.legs))])
  if problem.normalise_weights:
    weights = weights * (problem.initial_weight_mean / jnp.mean(weights))
  fitted_depths = [leg.depth for leg in problem.legs if leg.fitted and leg.kind not in ('cfs', 'mmr')]
  return fusion.soft_rrf_fuse([o for o, _ in outs], weights=weights, depths=[leg.depth for leg in problem.legs],
                              where=rows.where, k0=vals['k0'], temperature=[tp for _, tp in outs],
                              depth_temperature=problem.temperatures.depth,
                              candidates=max(fitted_depths, default=0) + problem.candidates)


def effective_values(problem: Problem, raw: Mapping[str, Array], fixed: Mapping[str, Array]) -> dict[str, Array]:
  """Every knob's value: the fixed (hand-set) ones overridden by the constrained fitted ones, with the
  fusion weights renormalised when all are fitted (the values the hard pipeline should use)."""
  vals = dict(fixed)
  vals.update(Knobs(raw=dict(raw), transforms=problem.fitted).values())
  if problem.normalise_weights:
    paths = [f'legs.{l}.weight' for l in range(len(problem.legs))]
    mean = jnp.mean(jnp.stack([vals[p] for p in paths]))
    for p in paths:
      vals[p] = vals[p] * (problem.initial_weight_mean / mean)
  return vals


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
    out.update({p: float(vals[p]) for p in vals if p.endswith('.weight') and p.startswith('legs.')
                and p.count('.') == 2})
  return FitResult(values=out, losses=[float(x) for x in losses], train_rows=len(train),
                   wall_s=time.perf_counter() - t0)


# ---- splits and cross-fitting ----------------------------------------------------------------------------

def episode_folds(episode_ids: Sequence[str], *, n_folds: int, seed: int = DEFAULT_SEED) -> list[list[str]]:
  """Split episodes into ``n_folds`` folds: sorted ids shuffled by ``random.Random(seed)``, dealt round-robin.

  With as many folds as episodes (LoCoMo: 10 conversations, 10 folds) every fold is one episode.
  """
  ids = sorted(set(episode_ids))
  if not 2 <= n_folds <= len(ids):
    raise ValueError(f'fit.folds must be between 2 and {len(ids)} (the number of episodes), got {n_folds}')
  random.Random(seed).shuffle(ids)
  return [sorted(ids[i::n_folds]) for i in range(n_folds)]


def holdout_split(episode_ids: Sequence[str], *, n_test: int, seed: int = DEFAULT_SEED) -> tuple[list[str], list[str]]:
  """``(train, test)`` episode ids: ``n_test`` test episodes drawn by ``random.Random(seed)``, the rest train.

  Raises:
    ValueError: unless ``1 <= n_test < number of distinct episodes`` (both sides must be non-empty).
  """
  n = len(set(episode_ids))
  if not 1 <= n_test < n:
    raise ValueError(f'fit.n_test must be between 1 and {n - 1} (the number of episodes minus one, so that '
                     f'training and test are both non-empty), got {n_test}')
  test = splits.draw_ids(episode_ids, n=n_test, seed=seed)
  train = sorted(set(episode_ids) - set(test))
  splits.assert_disjoint(train, test)
  return train, test


def check_disjoint(question_ids: Sequence[str], train: np.ndarray, scored: np.ndarray) -> None:
  """Raise ValueError if a training row is a scored question (by id)."""
  ids = np.asarray(question_ids)
  splits.assert_disjoint(ids[np.asarray(train)].tolist(), ids[np.asarray(scored)].tolist())


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
      log(f'fold {f} ({",".join(fold)}): {len(train)} training questions, loss {res.losses[0]:.4f} -> '
          f'{np.mean(res.losses[-10:]):.4f} in {res.wall_s:.1f}s; {res.values}')
    out.append(res)
  return out


def apply_values(pipe: Pipeline, values: Mapping[str, float]) -> Pipeline:
  """``pipe`` with knobs set by path (``k0``, ``legs.I.weight``, ``legs.I.score.NAME``): the hard pipeline
  a fit describes, for scoring."""
  legs = list(pipe.legs)
  k0 = pipe.k0
  for path, value in values.items():
    parts = path.split('.')
    knob_value(pipe, path)
    if parts == ['k0']:
      k0 = float(value)
    elif parts[2:] == ['weight']:
      legs[int(parts[1])] = dataclasses.replace(legs[int(parts[1])], weight=float(value))
    else:
      i = int(parts[1])
      score = legs[i].score
      legs[i] = dataclasses.replace(legs[i], score=functools.partial(score, **{parts[3]: float(value)}))
  return dataclasses.replace(pipe, legs=tuple(legs), k0=k0)
