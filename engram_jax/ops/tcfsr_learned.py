r"""Time-aware CFS-R with a learned, question-aware recency gate.

The gated variant (:func:`engram_jax.ops.tcfsr.tcfsr_gated_scores`) opens its recency prior from the pool alone:
it never sees the question. Here the gate is a small flax module (``RecencyGate``, :func:`recency_gate`: a
logistic unit) over features of the question and of its pool:

.. math::
  s_i = w\,\mathrm{mm}(a^\star)_i + (1-w)\,\mathrm{mm}(\cos)_i + \gamma\, g_q\, t_i, \qquad
  g_q = \sigma\!\left(u^\top x_q\right), \quad
  x_q = [\,f_q,\; r_q,\; \max_{\mathcal P}\cos\,]

where :math:`f_q` are the question's text features (:data:`engram_jax.core.features.FEATURES`: cue indicators
``current``, ``when``, ``count`` and a constant 1, carried by ``EpisodeArrays.query_features``), :math:`r_q` the
revision detector's statistic (:func:`engram_jax.ops.tcfsr.revision_signal` at ``theta``/``delta``, hard) and the
top pool cosine; :math:`t_i` the write-order fraction. The gate's weights :math:`u` are knobs (``u_current``,
``u_when``, ``u_count``, ``u_bias``, ``u_revision``, ``u_topcos``), fit by gradient jointly with ``lam``, ``w`` and
``gamma`` (engram_jax.fit); their hand-set values are 0 (a gate of 1/2 for every question: the recency prior at
weight gamma / 2).

The gate is smooth, so the hard operator is its own soft twin (on cosine pools gathered once,
:func:`learned_pool_scores`; tested equal). ``gamma = 0`` is CFS-R exactly.

The same model is one use of the question-conditioned knobs (:mod:`engram_jax.fit.conditioned`): ``tcfsr_prior``,
whose ``gamma`` is declared per question, with ``gamma`` conditioned through a gate (``form: gate``, ``features:
[cues, revision, top_cos]``, no bias; ``conf/pipeline/tcfsr_gate.yaml``). Its inputs read only the cosine pool, not
the solve, so they are fixed per question. ``tests/fit/test_conditioned.py`` checks equal losses, gradients and hard
metrics, and the protocol ``tgate_cond_locomo`` reproduced ``tgate_locomo`` in every ledger digit. This operator is
kept so that the committed ``tgate_*`` protocols run as they were scored; new work conditions ``gamma`` instead.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import features, validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops import pools
from engram_jax.ops.cfsr import nnls_ridge_pg
from engram_jax.ops.greedy import episode_gram, map_queries
from engram_jax.ops.pools import write_time
from engram_jax.ops.registry import Knob, Operator, SoftTwin, knob_defaults, register
from engram_jax.ops.tcfsr import (
  PoolSolve,
  blend_pool,
  cfsr_knobs,
  check_corpus,
  masked_pool,
  revision_features,
  scatter_pool,
  solve_pool,
)

GATE_INPUTS: tuple[str, ...] = (*features.FEATURES, 'revision', 'topcos')
WEIGHTS: tuple[str, ...] = tuple(f'u_{name}' for name in GATE_INPUTS)
if WEIGHTS != ('u_current', 'u_when', 'u_count', 'u_bias', 'u_revision', 'u_topcos'):
  raise ImportError(f"tcfsr_learned: the leg's gate keywords do not match the gate inputs {GATE_INPUTS}")

# The declaration of the knobs: the one place their defaults are written (signatures below read _L).
KNOBS = cfsr_knobs() + (
  Knob('gamma', 0.2, transform='identity', doc='recency weight'),
  Knob('theta', 0.7, static=True, check='[0,1]', doc='revision detector: near-duplicate cosine'),
  Knob('delta', 0.1, static=True, check='>=0', doc='revision detector: relevance band'),
  *(
    Knob(name, 0.0, transform='identity', doc=f'gate weight of input {inp}') for name, inp in zip(WEIGHTS, GATE_INPUTS)
  ),
  Knob('batch_size', 8, static=True, doc='queries solved at a time (None = all)'),
)
_L = knob_defaults(KNOBS)


@functools.cache
def recency_gate() -> type:
  """The gate's flax module class, ``RecencyGate``: a logistic unit ``sigmoid(u . x)`` over the gate inputs
  ``x [..., F]`` (:data:`GATE_INPUTS`; the text features include a constant column, so there is no separate bias).
  Defined on first use: importing ``flax.linen`` costs ~0.2 s, and every process imports this module (the registry)
  while few run the operator."""
  import flax.linen as nn

  class RecencyGate(nn.Module):
    @nn.compact
    def __call__(self, x: Array) -> Array:
      return jax.nn.sigmoid(nn.Dense(1, use_bias=False, name='gate')(x))[..., 0]

  return RecencyGate


def gate_params(weights: ArrayLike) -> dict:
  """The ``RecencyGate`` (:func:`recency_gate`) parameters for weights ``u [F]`` (in :data:`GATE_INPUTS` order)."""
  u = jnp.asarray(weights)
  return {'params': {'gate': {'kernel': u[:, None]}}}


def gate_inputs(text_features: Array, sol: PoolSolve, *, theta: ArrayLike, delta: ArrayLike) -> Array:
  """One question's gate inputs ``[F]``: its text features, the revision signal and the top pool cosine."""
  return jnp.concatenate(
    [text_features.astype(sol.cos.dtype), revision_features(sol, theta=theta, delta=delta).astype(sol.cos.dtype)]
  )


def _gated_blend(sol: PoolSolve, x: Array, *, w: ArrayLike, gamma: ArrayLike, weights: ArrayLike) -> Array:
  g = recency_gate()().apply(gate_params(weights), x)
  return blend_pool(sol, w) + jnp.asarray(gamma, sol.cos.dtype) * g * sol.t


def tcfsr_learned_scores(
  query: Array,
  docs: Array,
  positions: Array,
  query_features: Array,
  *,
  weights: ArrayLike,
  where: Array | None = None,
  gram: Array | None = None,
  pool: int = _L['pool'],
  iterations: int = _L['iterations'],
  lam: ArrayLike = _L['lam'],
  w: ArrayLike = _L['w'],
  gamma: ArrayLike = _L['gamma'],
  theta: float = _L['theta'],
  delta: float = _L['delta'],
  power_iterations: int = 20,
  batch_size: int | None = None,
) -> Array:
  r"""CFS-R plus a recency prior weighted by a learned, question-aware gate (module docstring).

  Args:
    query: ``[Q, D]`` unit-norm queries.
    docs: ``[N, D]`` unit-norm items (one shared corpus).
    positions: ``[N]`` write order.
    query_features: ``[Q, F_text]`` text features of each query (:func:`engram_jax.core.features.question_features`).
    weights: ``[F]`` gate weights :math:`u` in :data:`GATE_INPUTS` order; traced.
    where, gram, pool, iterations, lam, w, power_iterations, batch_size: as CFS-R.
    gamma: recency weight; traced.
    theta, delta: the revision detector's near-duplicate cosine and relevance band (static inputs to the gate).

  Returns:
    ``[Q, N]`` scores, ``-inf`` outside the pool or masked.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from engram_jax import tcfsr_learned_scores
    >>> from engram_jax.core.features import FEATURES
    >>> from engram_jax.ops.tcfsr_learned import GATE_INPUTS
    >>> docs = jax.random.normal(jax.random.key(0), (20, 8))
    >>> docs = docs / jnp.linalg.norm(docs, axis=-1, keepdims=True)
    >>> features = jnp.zeros((2, len(FEATURES)))  # each question's text cues (engram_jax.core.features)
    >>> s = tcfsr_learned_scores(docs[:2], docs, jnp.arange(20), features, weights=jnp.zeros(len(GATE_INPUTS)), pool=5)
    >>> s.shape
    (2, 20)
  """
  knobs = dict(pool=pool, iterations=iterations, lam=lam, w=w, gamma=gamma, theta=theta, delta=delta)
  check_corpus('tcfsr_learned_scores', 'tcfsr_learned', query, docs, positions, **knobs)
  validation.check_value(weights, 'weights', where='tcfsr_learned_scores', check=None, doc='gate weights')
  if query_features.shape[:-1] != query.shape[:-1]:
    raise ValueError(f'Shape mismatch: query_features {query_features.shape} vs queries {query.shape}')
  n = docs.shape[0]
  where = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
  t_all = write_time(positions, where)
  q_and_f, docs_ext = _with_features(query, docs, query_features)
  dim = query.shape[-1]

  def one(qf, d, wh, g):
    sol = solve_pool(qf, d, wh, g, t_all, pool=pool, iterations=iterations, lam=lam, power_iterations=power_iterations)
    x = gate_inputs(qf[dim:], sol, theta=theta, delta=delta)
    return scatter_pool(d.shape[0], sol, _gated_blend(sol, x, w=w, gamma=gamma, weights=weights))

  return map_queries(one, q_and_f, docs_ext, where, gram, batch_size=batch_size)


def _with_features(query: Array, docs: Array, query_features: Array) -> tuple[Array, Array]:
  """``[Q, D + F]`` queries with their features appended and ``[N, D + F]`` items with zeros there, so that the
  per-query map carries each query's features while every cosine and Gram entry is unchanged."""
  query, docs = jnp.asarray(query), jnp.asarray(docs)
  f = jnp.asarray(query_features, query.dtype)
  return (
    jnp.concatenate([query, f], axis=-1),
    jnp.concatenate([docs, jnp.zeros(docs.shape[:-1] + f.shape[-1:], docs.dtype)], axis=-1),
  )


def _weights(options: Mapping[str, ArrayLike]) -> Array:
  return jnp.stack([jnp.asarray(options[name], jnp.float32) for name in WEIGHTS])


def tcfsr_learned_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  pool: int = _L['pool'],
  iterations: int = _L['iterations'],
  lam: float = _L['lam'],
  w: float = _L['w'],
  gamma: float = _L['gamma'],
  theta: float = _L['theta'],
  delta: float = _L['delta'],
  u_current: float = _L['u_current'],
  u_when: float = _L['u_when'],
  u_count: float = _L['u_count'],
  u_bias: float = _L['u_bias'],
  u_revision: float = _L['u_revision'],
  u_topcos: float = _L['u_topcos'],
  batch_size: int | None = _L['batch_size'],
) -> Array:
  """:func:`tcfsr_learned_scores` as a leg ``[Q, N]`` (gate weights ``u_*`` in :data:`GATE_INPUTS` order)."""
  del key
  if ep.query_features is None:
    raise ValueError('tcfsr_learned needs EpisodeArrays.query_features (built by engram_jax.core.batch.episode_arrays)')
  weights = _weights(
    {
      'u_current': u_current,
      'u_when': u_when,
      'u_count': u_count,
      'u_bias': u_bias,
      'u_revision': u_revision,
      'u_topcos': u_topcos,
    }
  )
  return tcfsr_learned_scores(
    ep.queries,
    ep.docs,
    ep.positions,
    ep.query_features,
    weights=weights,
    where=ep.where,
    gram=episode_gram(ep.docs),
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    gamma=gamma,
    theta=theta,
    delta=delta,
    batch_size=batch_size,
  )


# ---- soft twin on precomputed pools ------------------------------------------------------------------------


def learned_pool_scores(
  b: Array,
  g: Array,
  t: Array,
  valid: Array,
  text_features: Array,
  *,
  weights: ArrayLike,
  lam: ArrayLike,
  w: ArrayLike,
  gamma: ArrayLike,
  iterations: int,
  theta: float = _L['theta'],
  delta: float = _L['delta'],
  power_iterations: int = 20,
) -> Array:
  """The operator on gathered pools: ``b [B, P]``, ``g [B, P, P]``, ``t [B, P]``, ``valid [B, P]``,
  ``text_features [B, F_text]`` -> ``[B, P]`` (``-inf`` for invalid slots); equal to the hard operator."""

  def one(bi, gi, ti, vi, fi):
    gp, bb, tp = masked_pool(bi, gi, ti, vi)
    a = nnls_ridge_pg(gp, bb, lam=lam, iterations=iterations, valid=vi, power_iterations=power_iterations)
    sol = PoolSolve(jnp.zeros(bb.shape, jnp.int32), vi, a, bb, tp, gp)
    x = gate_inputs(fi, sol, theta=theta, delta=delta)
    return jnp.where(vi, _gated_blend(sol, x, w=w, gamma=gamma, weights=weights), -jnp.inf)

  return jax.vmap(one)(b, g, t, valid, text_features)


def _rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options, settings) -> dict:
  del settings
  out = pools.cosine_pool_rows(ep, n_questions, n_pad, options['pool'], times=True)
  out['text_features'] = np.asarray(ep.query_features)[:n_questions]
  return out


def _soft(rows, values, ctx) -> Array:
  sp = learned_pool_scores(
    rows['pool_cos'],
    rows['pool_gram'],
    rows['pool_t'],
    rows['pool_valid'],
    rows['text_features'],
    weights=_weights(values),
    lam=values['lam'],
    w=values['w'],
    gamma=values['gamma'],
    iterations=int(values['iterations']),
    theta=values['theta'],
    delta=values['delta'],
  )
  return pools.scatter_rows(sp, rows['pool_idx'], ctx.where.shape[-1], -jnp.inf)


TCFSR_LEARNED = register(
  Operator(
    name='tcfsr_learned',
    leg=tcfsr_learned_leg,
    doc='CFS-R + recency prior weighted by a learned question-aware gate (flax logistic unit)',
    knobs=KNOBS,
    soft=SoftTwin(rows=_rows, scores=_soft),
  )
)
