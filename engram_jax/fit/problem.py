r"""The soft problem of a pipeline, built from the operator registry: which knobs move, what is precomputed, and
the soft pipeline's scores.

Fit soft, report hard. A leg with nothing to fit keeps its hard scores (computed once by the leg itself and ranked
hard inside :func:`engram_jax.ops.rrf.soft_rrf_fuse`); a leg with a fitted knob runs its operator's soft twin
(:class:`engram_jax.ops.registry.SoftTwin`) on per-question rows that the twin precomputes once (the cosine pool and
its Gram, BM25 term statistics, ...). All episodes are padded to one N, so a training step is a minibatch of
questions drawn from any episodes, and the jitted step compiles once per problem.

Temperatures are unit-free: each is a factor times a per-list scale (:func:`engram_jax.core.relax.gap_scale`, the mean
score gap in the list's top part, gradient stopped), so one setting serves cosine, BM25, CFS-R and fused RRF scores
alike. Depth and NDCG cutoffs are soft in rank units.

Knobs are keyed by their path in the pipeline's config node (``legs.cfsr.lam``, ``legs.cos.weight``, ``k0``), so
fitted values write straight back into config. When every fusion weight is fitted they are renormalised to their
initial mean inside the loss (hard RRF does not depend on their common scale, so neither should the fit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import relax, validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.types import Episode
from engram_jax.eval.pipeline import Pipeline, knob_value, split_path
from engram_jax.fit.knobs import Knobs, inverse
from engram_jax.ops import pools, registry
from engram_jax.ops.greedy import SoftSelection
from engram_jax.ops.rrf import soft_rrf_fuse


@dataclasses.dataclass(frozen=True)
class Temperatures:
  """Unit-free temperatures (factors of :func:`engram_jax.core.relax.gap_scale`) and cutoffs in rank units.

  Example:
    >>> from engram_jax.fit import Temperatures
    >>> Temperatures().rank > 0
    True
  """

  rank: float = 0.5  # soft ranks inside a fitted leg
  depth: float = 0.5  # soft depth cutoff of a fitted leg (rank units)
  greedy: float = 0.5  # softmax of a relaxed greedy step
  final: float = 0.5  # soft ranks of the final list (the loss)
  cutoff: float = 0.5  # soft NDCG@k cutoff (rank units)
  gate: float = 0.05  # sigmoid of a relaxed threshold (the gated time-aware CFS-R), in its own units

  def __post_init__(self) -> None:
    validation.check_positive(dataclasses.asdict(self), where='fit.temperatures')

  def scaled(self, scale: ArrayLike = 1.0) -> TemperatureValues:
    """Every temperature times ``scale`` (traced: an annealing schedule never recompiles)."""
    return TemperatureValues(**{f: v * scale for f, v in dataclasses.asdict(self).items()})


class TemperatureValues(NamedTuple):
  """The temperatures a soft twin reads (``ctx.temperatures``): :class:`Temperatures` scaled, possibly traced."""

  rank: ArrayLike
  depth: ArrayLike
  greedy: ArrayLike
  final: ArrayLike
  cutoff: ArrayLike
  gate: ArrayLike


CFSR_GRADS = ('forward', 'reverse', 'implicit')  # how the CFS-R twin passes its gradient (Settings.cfsr_grad)


@dataclasses.dataclass(frozen=True)
class Settings:
  """Fit settings the soft twins read (static).

  Example:
    >>> from engram_jax.fit import Settings
    >>> s = Settings()
    >>> s.greedy_pool, s.solve_batch  # defaults written once (conf/fit/default.yaml is pinned to them by a test)
    (100, 8)
  """

  greedy_pool: int = 100  # cosine pool of a relaxed CFS / MMR leg (the hard leg may use all items)
  candidates: int = 10  # extra soft-rank candidates beyond a fitted leg's depth
  solve_batch: int | None = 8  # CFS-R pools solved this many at a time (cache-friendly on CPU)
  cfsr_grad: str = 'forward'  # CFS-R twin's NNLS gradient: forward (in lam), reverse (unrolled), implicit (KKT)

  def __post_init__(self) -> None:
    if self.cfsr_grad not in CFSR_GRADS:
      raise ValueError(f'fit.cfsr_grad must be one of {list(CFSR_GRADS)}, got {self.cfsr_grad!r}')


@dataclasses.dataclass(frozen=True)
class LegInfo:
  """One leg of the soft problem."""

  name: str
  op: str
  depth: int
  options: tuple[tuple[str, Any], ...]  # every knob value (hand-set)
  fitted: tuple[str, ...]  # its fitted knob names (empty: the leg is constant)

  @property
  def operator(self) -> registry.Operator:
    return registry.get(self.op)


@dataclasses.dataclass(frozen=True)
class Problem:
  """Everything static about a soft pipeline: legs, fusion, which knobs are fit, temperatures, settings."""

  name: str
  legs: tuple[LegInfo, ...]
  fusion: str
  fitted: tuple[tuple[str, str], ...]  # (path, transform), in fit order
  k: int = 10
  temperatures: Temperatures = Temperatures()
  settings: Settings = Settings()
  normalise_weights: bool = False
  initial_weight_mean: float = 1.0


class SoftContext(NamedTuple):
  """What a soft twin's ``scores`` receives besides its rows and knob values (a batch of B questions)."""

  where: Array  # [B, N] real items of each question's episode
  cos: Array  # [B, N] cosine (-inf for masked items)
  positions: Array  # [B, N] write order
  temperatures: TemperatureValues
  settings: Settings


def fittable_paths(pipe: Pipeline) -> list[str]:
  """Every knob path of ``pipe`` that a gradient fit can move.

  Example:
    >>> from engram_jax import make_pipeline
    >>> from engram_jax.fit import fittable_paths
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, fusion='rrf')
    >>> fittable_paths(pipe)
    ['k0', 'legs.cos.weight', 'legs.bm25.weight', 'legs.bm25.k1', 'legs.bm25.b']
  """
  out = ['k0'] + [f'legs.{l.name}.weight' for l in pipe.legs] if pipe.fusion == 'rrf' else []
  for leg in pipe.legs:
    out += [f'legs.{leg.name}.{k}' for k in leg.operator.fittable]
  return out


def make_problem(
  pipe: Pipeline,
  params: Sequence[str],
  *,
  k: int = 10,
  temperatures: Temperatures = Temperatures(),
  settings: Settings = Settings(),
) -> tuple[Problem, Knobs, dict[str, float]]:
  """The soft problem of ``pipe`` with knobs ``params`` (paths) to fit.

  Returns:
    ``(problem, knobs at their hand-set values, every traced knob's hand-set value by path)``.

  Raises:
    ValueError: unknown or unfittable knob (listing the fittable ones), fusion weights / k0 of a pipeline without
      RRF, a relaxed greedy leg outside an RRF fusion.

  Example:
    >>> from engram_jax import make_pipeline
    >>> from engram_jax.fit import make_problem
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, fusion='rrf')
    >>> problem, knobs, fixed = make_problem(pipe, ['legs.bm25.weight', 'legs.bm25.k1'])
    >>> problem.fitted  # (path, transform) of each fitted knob; the rest stays at its hand-set value
    (('legs.bm25.weight', 'softplus'), ('legs.bm25.k1', 'log'))
    >>> {p: round(float(v), 3) for p, v in knobs.values().items()}  # the starting values
    {'legs.bm25.weight': 1.0, 'legs.bm25.k1': 1.5}
  """
  if not params:
    raise ValueError(f'nothing to fit in pipeline {pipe.name!r}; fittable: {fittable_paths(pipe)}')
  per_leg: dict[str, list[str]] = {l.name: [] for l in pipe.legs}
  transforms = []
  for path in params:
    leg, knob = split_path(pipe, path)
    if knob is None or knob == 'weight':
      if pipe.fusion != 'rrf':
        raise ValueError(f'{path}: pipeline {pipe.name!r} has no fusion to weight (fusion {pipe.fusion})')
      transforms.append((path, 'log' if knob is None else 'softplus'))
      continue
    op = pipe.leg(leg).operator
    if knob not in op.fittable:
      raise ValueError(
        f'cannot fit {path!r}: operator {op.name} can fit {list(op.fittable)}; fittable paths of '
        f'{pipe.name}: {fittable_paths(pipe)}'
      )
    per_leg[leg].append(knob)
    transforms.append((path, op.knob(knob).transform))
  legs = tuple(
    LegInfo(name=l.name, op=l.op, depth=int(l.depth), options=l.options, fitted=tuple(per_leg[l.name]))
    for l in pipe.legs
  )
  for leg in legs:
    if leg.fitted and leg.operator.soft.selection and pipe.fusion != 'rrf':
      raise ValueError(f'leg {leg.name}: a relaxed greedy leg ({leg.op}) can only be fit inside an RRF fusion')
  weight_paths = [f'legs.{l.name}.weight' for l in pipe.legs]
  normalise = pipe.fusion == 'rrf' and all(p in params for p in weight_paths)
  problem = Problem(
    name=pipe.name,
    legs=legs,
    fusion=pipe.fusion,
    fitted=tuple(transforms),
    k=k,
    temperatures=temperatures,
    settings=settings,
    normalise_weights=normalise,
    initial_weight_mean=float(np.mean([s.weight for s in pipe.legs])),
  )
  knobs = Knobs(
    raw={p: jnp.asarray(inverse(t, float(knob_value(pipe, p))), jnp.float32) for p, t in transforms},
    transforms=tuple(transforms),
  )
  every = {'k0': float(pipe.k0)} if pipe.fusion == 'rrf' else {}
  for spec, leg in zip(pipe.legs, legs):
    every[f'legs.{spec.name}.weight'] = float(spec.weight)
    for knob in leg.operator.knobs:
      value = dict(leg.options)[knob.name]
      if not knob.static and isinstance(value, (int, float)) and not isinstance(value, bool):
        every[f'legs.{spec.name}.{knob.name}'] = float(value)
  return problem, knobs, every


# ---- per-question rows -------------------------------------------------------------------------------


@struct.dataclass
class Rows:
  """Per-question arrays, every episode padded to one N (Q questions in all).

  ``legs[l]`` is leg l's hard scores ``[Q, N]`` when it is constant, else the dict of rows its soft twin
  precomputed.
  """

  labels: Array  # [Q, N] bool
  where: Array  # [Q, N] bool, real items of the question's episode
  cos: Array  # [Q, N] cosine, -inf for masked items
  positions: Array  # [Q, N] int32 write order
  legs: tuple  # per leg: [Q, N] constant scores, or {name: [Q, ...]}


def _stack(parts: Sequence[np.ndarray], fill: Any) -> np.ndarray:
  """Concatenate ``[Q_e, ...]`` arrays along axis 0, padding every other axis to its maximum with ``fill``."""
  shape = [max(p.shape[i] for p in parts) for i in range(1, parts[0].ndim)]
  out = []
  for p in parts:
    widths = [(0, 0)] + [(0, s - d) for s, d in zip(shape, p.shape[1:])]
    out.append(np.pad(p, widths, constant_values=fill) if any(w for _, w in widths[1:]) else p)
  return np.concatenate(out)


def build_rows(
  problem: Problem, pipe: Pipeline, episodes: Sequence[Episode], arrays: Sequence[EpisodeArrays], *, seed: int
) -> Rows:
  """Precompute the per-question rows of ``problem`` for every question of ``episodes`` (in order).

  Constant legs are computed by the hard leg functions of ``pipe`` (keys as in
  :func:`engram_jax.eval.evaluation.evaluate` over this episode list).

  Example:
    >>> import numpy as np, optax
    >>> from engram_jax.testing.synthetic import toy_fit_data
    >>> episodes, embeddings, arrays, pipe = toy_fit_data()  # 2 x 12 questions that repeat their gold item's text
    >>> from engram_jax.fit import build_rows, make_problem
    >>> problem, knobs, fixed = make_problem(pipe, ['legs.bm25.weight'])
    >>> rows = build_rows(problem, pipe, episodes, arrays, seed=0)
    >>> rows.where.shape  # one row per question: [B = 24 questions, N items]
    (24, 32)
  """
  n_pad = max(a.docs.shape[0] for a in arrays)
  base_key = jax.random.key(seed)
  const_fns = {l: jax.jit(spec.score) for l, (spec, leg) in enumerate(zip(pipe.legs, problem.legs)) if not leg.fitted}
  base: dict[str, list] = {f: [] for f in ('labels', 'where', 'cos', 'positions')}
  per_leg: list[list] = [[] for _ in problem.legs]
  for e, (ep, arr) in enumerate(zip(episodes, arrays)):
    nq = len(ep.questions)
    keys = jax.random.split(jax.random.fold_in(base_key, e), len(pipe.legs))
    n = arr.where.shape[0]
    base['labels'].append(pools.pad_items(np.asarray(arr.labels)[:nq], n_pad, False))
    base['where'].append(pools.pad_items(np.broadcast_to(np.asarray(arr.where), (nq, n)), n_pad, False))
    base['cos'].append(pools.question_cosines(arr, nq, n_pad))
    base['positions'].append(pools.pad_items(np.broadcast_to(np.asarray(arr.positions), (nq, n)), n_pad, 0))
    for l, leg in enumerate(problem.legs):
      if l in const_fns:
        per_leg[l].append(pools.pad_items(np.asarray(const_fns[l](arr, keys[l]))[:nq], n_pad, -np.inf))
      else:
        per_leg[l].append(leg.operator.soft.rows(arr, nq, n_pad, dict(leg.options), problem.settings))
  legs = []
  for l, leg in enumerate(problem.legs):
    if l in const_fns:
      legs.append(jnp.asarray(np.concatenate(per_leg[l]), jnp.float32))
    else:
      fill = leg.operator.soft.fill
      names = per_leg[l][0].keys()
      legs.append({k: jnp.asarray(_stack([r[k] for r in per_leg[l]], fill.get(k, 0))) for k in names})
  return Rows(
    labels=jnp.asarray(np.concatenate(base['labels'])),
    where=jnp.asarray(np.concatenate(base['where'])),
    cos=jnp.asarray(np.concatenate(base['cos']), jnp.float32),
    positions=jnp.asarray(np.concatenate(base['positions']), jnp.int32),
    legs=tuple(legs),
  )


# ---- the soft pipeline -----------------------------------------------------------------------------------------


def leg_values(leg: LegInfo, vals: Mapping[str, Array]) -> dict[str, Any]:
  """Knob values of ``leg`` for its soft twin: static knobs as Python values, the others by path from ``vals``."""
  out = {}
  for knob in leg.operator.knobs:
    path = f'legs.{leg.name}.{knob.name}'
    out[knob.name] = vals[path] if (not knob.static and path in vals) else dict(leg.options)[knob.name]
  return out


def soft_leg(problem: Problem, l: int, vals: Mapping[str, Array], rows: Rows, scale: ArrayLike = 1.0):
  """Leg ``l``'s soft output on a batch of rows: (scores [B, N] or SoftSelection, soft-rank temperature);
  every temperature times ``scale`` (annealing)."""
  leg = problem.legs[l]
  if not leg.fitted:
    return rows.legs[l], None
  temps = problem.temperatures.scaled(scale)
  ctx = SoftContext(
    where=rows.where, cos=rows.cos, positions=rows.positions, temperatures=temps, settings=problem.settings
  )
  out = leg.operator.soft.scores(rows.legs[l], leg_values(leg, vals), ctx)
  if isinstance(out, SoftSelection):
    return out, None
  return out, temps.rank * relax.gap_scale(out, k=leg.depth, where=rows.where)


def soft_scores(
  problem: Problem, vals: Mapping[str, Array], rows: Rows, scale: ArrayLike = 1.0, *, soft_constant: Sequence[int] = ()
) -> Array:
  """The soft pipeline's final scores ``[B, N]`` on a batch of rows, given every knob's value by path, every
  temperature times ``scale`` (1 = as set; an annealing schedule lowers it towards the hard pipeline).

  ``soft_constant``: indices of constant legs (nothing fitted) to soft-rank in the fusion anyway, at the fitted
  legs' rank temperature, because their scores carry a gradient from outside the knobs (a query adapter's cosine
  leg). By default a constant leg is ranked hard: it is then exactly its hard leg, and passes no gradient.
  """
  outs = [soft_leg(problem, l, vals, rows, scale) for l in range(len(problem.legs))]
  temps = problem.temperatures.scaled(scale)
  for l in soft_constant:
    leg = problem.legs[l]
    if leg.fitted:
      raise ValueError(f'soft_constant: leg {leg.name} is fitted (it is soft-ranked already)')
    s = outs[l][0]
    outs[l] = (s, temps.rank * relax.gap_scale(s, k=leg.depth, where=rows.where))
  if problem.fusion == 'none':
    return jnp.where(rows.where, outs[0][0], -jnp.inf)
  weights = jnp.stack([vals[f'legs.{leg.name}.weight'] for leg in problem.legs])
  if problem.normalise_weights:
    weights = weights * (problem.initial_weight_mean / jnp.mean(weights))
  fitted_depths = [
    leg.depth
    for l, leg in enumerate(problem.legs)
    if (leg.fitted and not leg.operator.soft.selection) or l in soft_constant
  ]
  return soft_rrf_fuse(
    [o for o, _ in outs],
    weights=weights,
    depths=[leg.depth for leg in problem.legs],
    where=rows.where,
    k0=vals['k0'],
    temperature=[tp for _, tp in outs],
    depth_temperature=problem.temperatures.depth * scale,
    candidates=max(fitted_depths, default=0) + problem.settings.candidates,
  )


def per_question_fusion(problem: Problem, vals: Mapping[str, Array], b: int) -> tuple[Array, Array]:
  """``(weights [B, L], k0 [B])`` from fusion knob values that are scalars or ``[B]``, the weights renormalised per
  question to the initial mean when all are fit."""
  weights = jnp.stack([jnp.broadcast_to(vals[f'legs.{leg.name}.weight'], (b,)) for leg in problem.legs], -1)
  if problem.normalise_weights:
    weights = weights * (problem.initial_weight_mean / jnp.mean(weights, axis=-1, keepdims=True))
  return weights, jnp.broadcast_to(vals['k0'], (b,))


def soft_scores_per_question(
  problem: Problem, vals: Mapping[str, Array], rows: Rows, scale: ArrayLike = 1.0, *, soft_constant: Sequence[int] = ()
) -> Array:
  """The soft pipeline's final scores ``[B, N]`` with per-question fusion knobs (``vals[path]`` ``[B]`` or
  scalar): the legs as :func:`soft_scores` (``soft_constant`` too), the fusion vmapped over questions."""
  b = rows.where.shape[0]
  outs = [soft_leg(problem, l, vals, rows, scale) for l in range(len(problem.legs))]
  for l in soft_constant:
    leg = problem.legs[l]
    if leg.fitted:
      raise ValueError(f'soft_constant: leg {leg.name} is fitted (it is soft-ranked already)')
    s = outs[l][0]
    outs[l] = (s, problem.temperatures.scaled(scale).rank * relax.gap_scale(s, k=leg.depth, where=rows.where))
  if problem.fusion == 'none':
    return jnp.where(rows.where, outs[0][0], -jnp.inf)
  weights, k0 = per_question_fusion(problem, vals, b)
  fitted_depths = [
    leg.depth
    for l, leg in enumerate(problem.legs)
    if (leg.fitted and not leg.operator.soft.selection) or l in soft_constant
  ]
  depths = [leg.depth for leg in problem.legs]
  temps = [None if t is None else jnp.broadcast_to(t, (b,)) for _, t in outs]
  cands = max(fitted_depths, default=0) + problem.settings.candidates

  def one(legs, temps, where, w, k):
    return soft_rrf_fuse(
      legs,
      weights=w,
      depths=depths,
      where=where,
      k0=k,
      temperature=temps,
      depth_temperature=problem.temperatures.depth * scale,
      candidates=cands,
    )

  return jax.vmap(one)([o for o, _ in outs], temps, rows.where, weights, k0)


def effective_values(problem: Problem, raw: Mapping[str, Array], fixed: Mapping[str, Array]) -> dict[str, Array]:
  """Every knob's value: the fixed (hand-set) ones overridden by the constrained fitted ones, with the fusion
  weights renormalised when all are fitted (the values the hard pipeline should use)."""
  vals = dict(fixed)
  vals.update(Knobs(raw=dict(raw), transforms=problem.fitted).values())
  if problem.normalise_weights:
    paths = [f'legs.{leg.name}.weight' for leg in problem.legs]
    mean = jnp.mean(jnp.stack([vals[p] for p in paths]))
    for p in paths:
      vals[p] = vals[p] * (problem.initial_weight_mean / mean)
  return vals
