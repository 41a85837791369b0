r"""Question-conditioned knobs: a small flax module maps each question's features to per-question knob values.

A pipeline's fit may declare (``fit.conditioned``)::

    conditioned: {knobs: [legs.cos.weight, legs.bm25.weight, legs.cfsr.weight, k0],
                  features: [cues, pool, query], hidden: 0, rank: 8, net_lr_scale: 0.1}

Each conditioned knob's value for question :math:`q` is its declared transform (:data:`engram_jax.fit.knobs.FORWARD`)
of the scalar unconstrained value plus the module's output,

.. math:: v_{q,j} = T_j(\theta_j + f_\phi(x_q)_j),

so with :math:`f_\phi \equiv 0` (its last layer starts at zero) every question gets the scalar fit's value, and the
scalar knobs and :math:`\phi` are fit jointly on the soft pipeline (approx-NDCG@k, as :mod:`engram_jax.fit.train`).
With ``form: gate`` the module is a gate on the knob instead, :math:`v_{q,j} = T_j(\theta_j)\,
\sigma(f_\phi(x_q)_j)` (half the scalar value at init).
Inputs :math:`x_q` (``features``, always in this order):

* ``cues``: the question's text cues (:mod:`engram_jax.core.features`: current, when, count, bias);
* ``pool``: statistics of its cosine list: the top cosine, the mean of the top 10 and the top-1 minus top-10 gap;
* ``revision``: the revision detector's statistic (:func:`engram_jax.ops.tcfsr.revision_signal`, hard) on the
  question's cosine top-``pool`` at ``theta`` / ``delta``;
* ``top_cos``: the top cosine of that pool;
* ``query``: its embedding through a learned rank-``rank`` projection (``D x rank`` parameters).

None of them depends on a fitted knob (the pool is a cosine top-P), so they are computed once per question.
``hidden`` = 0 makes :math:`f_\phi` linear; otherwise one tanh layer of that width. ``bias: false`` drops the last
layer's bias (the ``cues`` carry a constant column).

Conditioned knobs are the fusion knobs (leg weights and ``k0``) and any operator knob declared ``per_question``
(:class:`engram_jax.ops.registry.Knob`: its hard leg takes ``[Q]`` values and its twin ``[B]``, e.g. the recency
weight ``gamma`` of ``tcfsr_prior``). Hard scoring runs each leg at its fitted scalar knobs and its conditioned
knobs' per-question values, then fuses by :func:`engram_jax.ops.rrf.rrf_fuse` with each question's own weights and
``k0`` (``vmap`` over questions); the soft twins take the per-question values batched, and the fusion is
:func:`engram_jax.ops.rrf.soft_rrf_fuse` under ``vmap`` (``fusion: none`` pipelines: the one leg).

The learned recency gate of ``tcfsr_learned`` (:mod:`engram_jax.ops.tcfsr_learned`) is one use:
``tcfsr_prior`` with ``gamma`` conditioned, ``form: gate``, ``features: [cues, revision, top_cos]``, ``hidden: 0``,
``bias: false``, ``net_lr_scale: 1`` is the same model with the same parameters (``conf/pipeline/tcfsr_gate.yaml``;
``tests/fit/test_conditioned.py`` checks that both give the same soft loss, gradients and hard rankings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array

from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.types import Episode
from engram_jax.eval.pipeline import Pipeline, split_path
from engram_jax.fit.components import register_component
from engram_jax.fit.knobs import FORWARD, Knobs
from engram_jax.fit.problem import Problem, Rows, per_question_fusion, soft_scores_per_question
from engram_jax.fit.train import FitResult
from engram_jax.ops import pools
from engram_jax.ops.registry import knob_defaults
from engram_jax.ops.tcfsr import GATED_KNOBS, PoolSolve, masked_pool, revision_features

FEATURE_GROUPS = ('cues', 'pool', 'revision', 'top_cos', 'query')
FORMS = ('offset', 'gate')
_REVISION = knob_defaults(GATED_KNOBS)
POOL_STATS = ('top_cos', 'mean_top10_cos', 'gap_top1_top10')


@register_component
@dataclasses.dataclass(frozen=True)
class Conditioning:
  """Which knobs are conditioned on the question, on what, and the module's size (all from config).

  Example:
    >>> from engram_jax.fit import Conditioning
    >>> Conditioning.__name__  # question features -> per-question knob values (see fit.conditioned in conf/fit)
    'Conditioning'
  """

  knobs: tuple[str, ...]
  features: tuple[str, ...]
  hidden: int
  rank: int
  net_lr_scale: float  # the module's learning rate as a fraction of the scalar knobs' (its updates times this)
  form: str = 'offset'  # offset: T(theta + f(x)); gate: T(theta) * sigmoid(f(x))
  bias: bool = True  # the last layer's bias
  pool: int = _REVISION['pool']  # the cosine pool of the revision / top_cos features
  theta: float = _REVISION['theta']  # the revision detector's near-duplicate cosine
  delta: float = _REVISION['delta']  # and its relevance band (defaults: tcfsr_gated's declared knobs)

  def __post_init__(self) -> None:
    if self.form not in FORMS:
      raise ValueError(f'conditioned.form must be one of {list(FORMS)}, got {self.form!r}')
    if int(self.pool) < 1 or not 0 <= float(self.theta) <= 1 or not float(self.delta) > 0:
      raise ValueError(
        f'conditioned.pool must be >= 1, theta in [0, 1] and delta > 0, got {self.pool}, {self.theta}, {self.delta}'
      )
    if not self.knobs:
      raise ValueError('conditioned.knobs is empty: name the knobs to condition on the question')
    bad = [f for f in self.features if f not in FEATURE_GROUPS]
    if bad or not self.features:
      raise ValueError(
        f'conditioned.features must be a non-empty subset of {list(FEATURE_GROUPS)}, got {list(self.features)}'
      )
    if not self.net_lr_scale > 0:
      raise ValueError(f'conditioned.net_lr_scale must be > 0, got {self.net_lr_scale}')
    if int(self.hidden) < 0 or int(self.rank) < 1:
      raise ValueError(f'conditioned.hidden must be >= 0 and conditioned.rank >= 1, got {self.hidden}, {self.rank}')

  def check(self, pipe: Pipeline, fitted: Sequence[str]) -> None:
    """Every conditioned knob is a fusion knob of an RRF ``pipe`` (a leg weight or ``k0``) or an operator knob
    declared ``per_question``, and is also fitted."""
    for path in self.knobs:
      leg, knob = split_path(pipe, path)
      if knob in (None, 'weight'):
        if pipe.fusion != 'rrf':
          raise ValueError(
            f'conditioned knob {path!r}: a fusion knob needs an RRF fusion; pipeline {pipe.name!r} '
            f'has fusion {pipe.fusion}'
          )
      elif knob == 'depth' or not pipe.leg(leg).operator.knob(knob).per_question:
        per_q = [k.name for k in pipe.leg(leg).operator.knobs if k.per_question]
        raise ValueError(
          f'conditioned knob {path!r}: only fusion knobs (legs.<leg>.weight, k0) and operator knobs '
          f'declared per_question can be conditioned (the hard leg takes one scalar {knob}); '
          f"{pipe.leg(leg).op}'s per-question knobs: {per_q}"
        )
      if path not in fitted:
        raise ValueError(f'conditioned knob {path!r} must also be in fit.params (its scalar value is the base)')

  # ---- the component interface (engram_jax.fit.train.Component) ----

  name: ClassVar[str] = 'conditioned'
  per_question: ClassVar[bool] = True
  config_example: ClassVar[str] = (
    '{knobs: [k0], features: [cues], hidden: 0, rank: 8, net_lr_scale: 0.1}; conf/fit/default.yaml'
  )

  @property
  def identity_exempt(self) -> str | None:
    """Form ``gate`` starts each conditioned knob at half its scalar value (``sigmoid(0) = 1/2``), by design."""
    if self.form == 'gate':
      return 'form gate starts each conditioned knob at sigmoid(0) = 1/2 of its scalar value'
    return None

  def check_problem(self, pipe: Pipeline, problem: Problem) -> None:
    self.check(pipe, [p for p, _ in problem.fitted])

  @property
  def lr_scale(self) -> float:
    return float(self.net_lr_scale)

  def inputs(self, problem: Problem, episodes: Sequence[Episode], arrays: Sequence[EpisodeArrays]) -> Inputs:
    del problem
    return build_inputs(self, episodes, arrays)

  def batch(self, inputs: Inputs, idx: Array) -> Inputs:
    return jax.tree_util.tree_map(lambda x: x[idx], inputs)

  def init(self, inputs: Inputs, seed: int) -> Any:
    return init_net(self, inputs, seed)

  def soft_constant(self, problem: Problem) -> tuple[int, ...]:
    del problem
    return ()

  def apply(
    self, problem: Problem, params: Any, raw: Mapping[str, Array], vals: dict, rows: Rows, inputs: Inputs
  ) -> tuple[dict, Rows]:
    return conditioned_values(problem, self, raw, vals, params, inputs.feats, inputs.query), rows

  # ---- the hard half (engram_jax.fit.components) ----

  @property
  def conditions(self) -> tuple[str, ...]:
    return tuple(self.knobs)

  def hard_queries(self, params: Any, queries: np.ndarray) -> np.ndarray:
    del params
    return queries

  def hard_inputs(self, base: EpisodeArrays, n_questions: int) -> tuple[Array, Array]:
    """``(feats, query)`` over the padded question axis (zeros past the real questions), from the base arrays."""
    f, _ = episode_inputs(self, base, n_questions)
    f = np.concatenate([f, np.zeros((base.queries.shape[0] - n_questions, f.shape[1]), np.float32)])
    return jnp.asarray(f), jnp.asarray(base.queries, jnp.float32)

  def hard_values(self, problem: Problem, params: Any, raw: Mapping[str, Array], vals: dict, inputs: Any) -> dict:
    feats, query = inputs
    return conditioned_values(problem, self, raw, vals, params, feats, query)


class KnobNet(nn.Module):
  """``(features [B, F], query [B, D]) -> [B, n_out]`` offsets of the unconstrained knob values (0 at init)."""

  n_out: int
  hidden: int
  rank: int
  use_query: bool
  use_bias: bool = True

  @nn.compact
  def __call__(self, feats: Array, query: Array) -> Array:
    parts = [feats]
    if self.use_query:
      parts.append(nn.Dense(self.rank, use_bias=False, kernel_init=nn.initializers.normal(0.1), name='proj')(query))
    h = jnp.concatenate(parts, axis=-1)
    if self.hidden:
      h = jnp.tanh(nn.Dense(self.hidden, name='hidden')(h))
    return nn.Dense(
      self.n_out, use_bias=self.use_bias, kernel_init=nn.initializers.zeros, bias_init=nn.initializers.zeros, name='out'
    )(h)


@struct.dataclass
class Inputs:
  """Per-question inputs of the module, in the order of :func:`engram_jax.fit.build_rows` (Q questions)."""

  feats: Array  # [Q, F] cue indicators, pool statistics, revision signal, top cosine (as ``features`` selects)
  query: Array  # [Q, D] query embeddings


def pool_stats(cos: np.ndarray) -> np.ndarray:
  """``[Q, 3]`` :data:`POOL_STATS` of each question's cosine list ``cos [Q, N]`` (``-inf`` = masked)."""
  c = np.where(np.isfinite(cos), cos, -np.inf)
  top = -np.sort(-c, axis=-1)[:, :10]
  top = np.where(np.isfinite(top), top, np.nan)
  first = top[:, 0]
  return np.stack(
    [first, np.nanmean(top, axis=-1), first - top[:, np.sum(np.isfinite(top), -1).min() - 1]], axis=-1
  ).astype(np.float32)


def episode_inputs(spec: Conditioning, ep: EpisodeArrays, n_questions: int) -> tuple[np.ndarray, np.ndarray]:
  """One episode's ``(feats [Q, F], query [Q, D])`` for its ``n_questions`` real questions."""
  parts = []
  if 'cues' in spec.features:
    if ep.query_features is None:
      raise ValueError('conditioned feature "cues" needs EpisodeArrays.query_features')
    parts.append(np.asarray(ep.query_features)[:n_questions])
  if 'pool' in spec.features:
    n = ep.where.shape[0]
    parts.append(pool_stats(pools.question_cosines(ep, n_questions, n)))
  pooled = [f for f in ('revision', 'top_cos') if f in spec.features]
  if pooled:
    stats = revision_stats(ep, n_questions, pool=spec.pool, theta=spec.theta, delta=spec.delta)
    parts.append(stats[:, [('revision', 'top_cos').index(f) for f in pooled]])
  feats = np.concatenate(parts, -1) if parts else np.zeros((n_questions, 0), np.float32)
  return feats.astype(np.float32), np.asarray(ep.queries, np.float32)[:n_questions]


def revision_stats(ep: EpisodeArrays, n_questions: int, *, pool: int, theta: float, delta: float) -> np.ndarray:
  """``[Q, 2]`` float32: the revision detector's statistic (:func:`engram_jax.ops.tcfsr.revision_signal`, hard)
  and the top cosine of each real question's cosine top-``pool`` (:func:`engram_jax.ops.pools.cosine_pool_rows`:
  the pool, Gram and write times the hard ``tcfsr_*`` legs read), 0 for an empty pool."""
  rows = pools.cosine_pool_rows(ep, n_questions, ep.where.shape[0], pool, times=True)

  def one(b, g, t, v):
    gp, bb, tp = masked_pool(b, g, t, v)
    sol = PoolSolve(jnp.zeros(b.shape, jnp.int32), v, jnp.zeros_like(b), bb, tp, gp)
    return revision_features(sol, theta=theta, delta=delta)

  out = jax.vmap(one)(
    *(
      jnp.asarray(rows[k], jnp.float32) if k != 'pool_valid' else jnp.asarray(rows[k])
      for k in ('pool_cos', 'pool_gram', 'pool_t', 'pool_valid')
    )
  )
  return np.asarray(out, np.float32)


def build_inputs(spec: Conditioning, episodes: Sequence[Episode], arrays: Sequence[EpisodeArrays]) -> Inputs:
  """:class:`Inputs` of every question of ``episodes`` (the rows' order)."""
  got = [episode_inputs(spec, a, len(e.questions)) for e, a in zip(episodes, arrays)]
  return Inputs(
    feats=jnp.asarray(np.concatenate([f for f, _ in got])), query=jnp.asarray(np.concatenate([q for _, q in got]))
  )


def make_net(spec: Conditioning) -> KnobNet:
  return KnobNet(
    n_out=len(spec.knobs),
    hidden=int(spec.hidden),
    rank=int(spec.rank),
    use_query='query' in spec.features,
    use_bias=bool(spec.bias),
  )


def init_net(spec: Conditioning, inputs: Inputs, seed: int) -> Any:
  return make_net(spec).init(jax.random.key(seed), inputs.feats[:1], inputs.query[:1])


def conditioned_values(
  problem: Problem,
  spec: Conditioning,
  raw: Mapping[str, Array],
  vals: Mapping[str, Array],
  net_params: Any,
  feats: Array,
  query: Array,
) -> dict[str, Array]:
  """``vals`` with the conditioned knobs ``[B]``: ``transform(raw + net(x)[:, j])`` (form ``offset``) or
  ``transform(raw) * sigmoid(net(x)[:, j])`` (form ``gate``)."""
  vals = dict(vals)
  delta = make_net(spec).apply(net_params, feats, query)
  kinds = dict(problem.fitted)
  for j, path in enumerate(spec.knobs):
    if spec.form == 'gate':
      vals[path] = FORWARD[kinds[path]](raw[path]) * jax.nn.sigmoid(delta[:, j])
    else:
      vals[path] = FORWARD[kinds[path]](raw[path] + delta[:, j])
  return vals


def question_values(
  problem: Problem,
  spec: Conditioning,
  raw: Mapping[str, Array],
  fixed: Mapping[str, Array],
  net_params: Any,
  feats: Array,
  query: Array,
) -> dict[str, Array]:
  """Every knob's value on a batch: scalars as :func:`engram_jax.fit.effective_values` (weights not renormalised
  here), the conditioned ones ``[B]`` (:func:`conditioned_values`)."""
  vals = dict(fixed)
  vals.update(Knobs(raw=dict(raw), transforms=problem.fitted).values())
  return conditioned_values(problem, spec, raw, vals, net_params, feats, query)


soft_scores = soft_scores_per_question  # the conditioned soft pipeline (per-question fusion knobs)


# ---- hard scoring: engram_jax.fit.components.hard_scores / score_episodes with this component ----------------------


def per_question_knobs(
  problem: Problem, spec: Conditioning, res: FitResult, fixed: Mapping[str, float], feats: Array, query: Array
) -> dict[str, np.ndarray]:
  """The conditioned knobs' per-question values ``{path: [Q]}`` as the hard scorer uses them (weights
  renormalised)."""
  fixed_j = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  vals = question_values(problem, spec, res.raw, fixed_j, res.learned[spec.name], feats, query)
  b = feats.shape[0]
  out = {p: np.broadcast_to(np.asarray(vals[p]), (b,)) for p in spec.knobs}
  if problem.fusion == 'rrf':
    weights, k0 = per_question_fusion(problem, vals, b)
    out.update({f'legs.{leg.name}.weight': np.asarray(weights[:, l]) for l, leg in enumerate(problem.legs)})
    out['k0'] = np.asarray(k0)
  return {p: out[p] for p in spec.knobs}
