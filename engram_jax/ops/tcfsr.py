r"""Time-aware CFS-R: three ways to put write order into Conditional Field Reconstruction.

CFS-R (:mod:`engram_jax.ops.cfsr`) reconstructs the query from a cosine pool and knows nothing about
when an item was written; its post names temporal questions as its weakest spot. Each variant here keeps the
CFS-R pool (cosine top-``P``), solver (:func:`~engram_jax.ops.cfsr.nnls_ridge_pg`) and blend, and adds
time in one place. Time is the item's write-order fraction

.. math:: t_i = p_i / \max(N_{real} - 1, 1) \in [0, 1]   \qquad (0 = \text{oldest}, 1 = \text{newest})

computed from ``positions`` and ``where``, the only time the padded arrays carry (the Tide convention).

* :func:`tcfsr_prior_scores` -- a **recency prior inside the blend**:
  :math:`s = w\,\mathrm{mm}(a) + (1-w)\,\mathrm{mm}(\cos) + \gamma\, t`.
* :func:`tcfsr_basis_scores` -- **time appended to the basis**: every pool row gets an extra coordinate
  :math:`\alpha t_i`, the query gets :math:`\alpha \tau` (``anchor`` :math:`\tau`, 1 = "now"), so the non-negative
  reconstruction must also explain *when*: among near-collinear candidates the one written nearer the anchor
  takes the coefficient mass (an old and a new version of the same fact stop sharing it). In Gram form
  :math:`G \leftarrow G + \alpha^2 t t^\top`, :math:`b \leftarrow b + \alpha^2 \tau t`.
* :func:`tcfsr_gated_scores` -- **recency gated by a revision detector**: the recency prior applies only to
  queries whose pool holds near-duplicate relevant items written far apart (the asked fact was restated, so it
  may have changed):
  :math:`r_q = \max_{i \ne j} \rho_i \rho_j\, [G_{ij} \ge \theta]\, |t_i - t_j|`, gate :math:`g_q = [r_q \ge \rho_0]`,
  :math:`s = s^{\text{CFS-R}} + \gamma\, g_q\, t` (:math:`\rho_i` = 1 at the best pool cosine falling to 0 at
  ``delta`` below it, :func:`revision_signal`). The detector
  reads only embeddings and positions (the padded arrays carry no question text), so it detects a *changed
  topic*, not the wording of a question about change.

Soft twins (for the fitter: on cosine pools gathered once, :func:`pool_scores`). The prior and basis variants
are differentiable in every knob (``lam``, ``w``, ``gamma``, ``alpha``,
``anchor``) as they stand -- like CFS-R and Tide, each is its own soft twin (the cosine pool cut is a hard top-P
in all of them). The gated variant thresholds twice; :func:`soft_tcfsr_gated_scores` replaces both indicators
by sigmoids at ``temperature`` (differentiable in ``theta``, ``rho0``, ``gamma``, ``lam``, ``w``) and tends to the
hard operator as ``temperature -> 0``.

All functions score a shared corpus (``docs [N, D]``, ``positions [N]``, ``where [N]``) for queries ``[..., D]``
and return ``[..., N]`` scores, ``-inf`` outside the pool. No jit inside; legs (``*_leg``) adapt them to
:class:`~engram_jax.core.batch.EpisodeArrays`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops import cfsr, pools
from engram_jax.ops.cfsr import cosine_pool, minmax, nnls_ridge_pg
from engram_jax.ops.greedy import episode_gram, map_queries
from engram_jax.ops.pools import write_time
from engram_jax.ops.registry import Knob, Operator, SoftTwin, check_knobs, knob_defaults, register


def cfsr_knobs() -> tuple[Knob, ...]:
  """CFS-R's knobs ``pool``, ``iterations``, ``lam``, ``w`` (:data:`engram_jax.ops.cfsr.KNOBS`), shared by all."""
  return cfsr.KNOBS[:4]


# The declarations of the variants' knobs: the one place their defaults are written (signatures below read them).
_BATCH = cfsr.KNOBS[4]
PRIOR_KNOBS = cfsr_knobs() + (Knob('gamma', 0.1, transform='identity', doc='recency weight', per_question=True), _BATCH)
BASIS_KNOBS = cfsr_knobs() + (
  Knob('alpha', 0.2, transform='softplus', check='>=0', doc='time-feature scale'),
  Knob('anchor', 1.0, transform='identity', doc='target time'),
  _BATCH,
)
GATED_KNOBS = cfsr_knobs() + (
  Knob('gamma', 0.2, transform='identity', doc='recency weight'),
  Knob('theta', 0.7, transform='logit', check='[0,1]', doc='near-duplicate cosine'),
  Knob('delta', 0.1, static=True, check='>=0', doc='relevance band below the best cosine'),
  Knob('rho0', 0.1, transform='logit', check='[0,1]', doc='gate threshold'),
  _BATCH,
)
_C = knob_defaults(cfsr.KNOBS)
_P, _B, _G = knob_defaults(PRIOR_KNOBS), knob_defaults(BASIS_KNOBS), knob_defaults(GATED_KNOBS)


class PoolSolve(NamedTuple):
  """One query's CFS-R pool and solution (shapes ``[P]``, ``[P, P]``)."""

  idx: Array  # [P] item index of each pool slot
  valid: Array  # [P] real pool slots
  a: Array  # [P] non-negative coefficients
  cos: Array  # [P] pool cosines
  t: Array  # [P] write-order fractions
  gram: Array  # [P, P] semantic pool Gram (without time features)


def solve_pool(
  q: Array,
  d: Array,
  wh: Array,
  g: Array | None,
  t_all: Array,
  *,
  pool: int,
  iterations: int,
  lam: ArrayLike,
  power_iterations: int,
  alpha: ArrayLike = 0.0,
  anchor: ArrayLike = _B['anchor'],
) -> PoolSolve:
  r"""One query's CFS-R pool and solve, time optionally appended to the basis.

  Args:
    q: ``[D]`` query; d: ``[N, D]`` items; wh: ``[N]`` real items; g: optional ``[N, N]`` episode Gram;
    t_all: ``[N]`` write fractions (:func:`engram_jax.ops.pools.write_time`); pool, iterations, power_iterations:
    static; lam: ridge (scalar or ``[P]`` per pool slot, :func:`engram_jax.ops.nnls.nnls_ridge_pg`); alpha, anchor:
    the time feature :math:`\alpha t` and its target :math:`\alpha \tau` (0: plain CFS-R).

  Returns:
    :class:`PoolSolve` (``[P]`` / ``[P, P]`` fields).
  """
  cos, idx, valid, gp = cosine_pool(q, d, wh, g, pool=pool)
  both = valid[:, None] & valid[None, :]
  gp = jnp.where(both, gp, 0.0)  # padded rows may hold junk or NaN: keep them out of every product
  b, tp = jnp.where(valid, cos[idx], 0.0), jnp.where(valid, t_all[idx], 0.0)
  a2 = jnp.square(jnp.asarray(alpha, cos.dtype))
  a = nnls_ridge_pg(
    gp + a2 * tp[:, None] * tp[None, :],
    b + a2 * jnp.asarray(anchor, cos.dtype) * tp,
    lam=lam,
    iterations=iterations,
    valid=valid,
    power_iterations=power_iterations,
  )
  return PoolSolve(idx, valid, a, b, tp, gp)


def scatter_pool(n: int, sol: PoolSolve, s: Array) -> Array:
  """Pool scores ``s [P]`` of a :class:`PoolSolve` at its items in an ``[n]`` row of ``-inf`` (invalid slots too)."""
  s = jnp.where(sol.valid, s, -jnp.inf)
  return jnp.full((n,), -jnp.inf, s.dtype).at[sol.idx].set(s, unique_indices=True)


def blend_pool(sol: PoolSolve, w: ArrayLike) -> Array:
  """CFS-R's blend ``w mm(a) + (1 - w) mm(cos)`` of a :class:`PoolSolve` (``[P]``, not masked: see
  :func:`engram_jax.ops.cfsr.cfsr_blend` for the masked one)."""
  w_ = jnp.asarray(w, sol.cos.dtype)
  return w_ * minmax(sol.a, sol.valid) + (1.0 - w_) * minmax(sol.cos, sol.valid)


def check_corpus(where: str, op: str, query: Array, docs: Array, positions: Array, **knobs) -> None:
  """The boundary check of a temporal CFS-R function (``where``): one shared corpus ``docs [N, D]`` with its
  ``positions [N]``, the query and items finite and non-empty (concrete arrays only), and ``knobs`` within the
  declaration of the registered operator ``op`` (:func:`engram_jax.ops.registry.check_knobs`)."""
  if jnp.ndim(docs) != 2:
    raise ValueError(
      f'Shape mismatch: temporal CFS-R scores one shared corpus docs [N, D], got {jnp.shape(docs)}; vmap over episodes'
    )
  if jnp.shape(positions) != jnp.shape(docs)[:1]:
    raise ValueError(f'Shape mismatch: positions {jnp.shape(positions)} vs N={jnp.shape(docs)[0]}')
  validation.check_embeddings(where, query, docs)
  check_knobs(op, where, **knobs)


def _run(one, query, docs, positions, where, gram, batch_size, per_query=(), query_where=None):
  n = docs.shape[0]
  where = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
  t_all = write_time(positions, where)
  return cfsr.map_live_queries(
    lambda q, d, wh, g, *x: one(q, d, wh, g, t_all, *x),
    query,
    docs,
    where,
    gram,
    live=query_where,
    batch_size=batch_size,
    per_query=per_query,
  )


def tcfsr_prior_scores(
  query: Array,
  docs: Array,
  positions: Array,
  *,
  where: Array | None = None,
  gram: Array | None = None,
  pool: int = _C['pool'],
  iterations: int = _C['iterations'],
  lam: ArrayLike = _C['lam'],
  w: ArrayLike = _C['w'],
  gamma: ArrayLike = _P['gamma'],
  power_iterations: int = 20,
  batch_size: int | None = None,
  query_where: Array | None = None,
) -> Array:
  r"""CFS-R with a recency prior inside the blend.

  Definition (pool :math:`\mathcal P` and :math:`a^\star` as :func:`~engram_jax.ops.cfsr.cfsr_scores`):
    .. math::
      s_i = w\, \mathrm{mm}(a^\star)_i + (1 - w)\, \mathrm{mm}(\cos(q, \cdot))_i + \gamma\, t_i
      \;\; (i \in \mathcal P), \qquad s_i = -\infty \;\; (i \notin \mathcal P)

  ``gamma = 0`` is CFS-R exactly. Differentiable in ``lam``, ``w``, ``gamma`` (its own soft twin). ``gamma`` may
  be one value per query (``[...]``, the queries' batch shape): a question-conditioned recency weight
  (:mod:`engram_jax.fit.conditioned`; a learned gate :math:`\gamma_q = \gamma\, \sigma(u^\top x_q)` is one).

  Args:
    query: ``[..., D]`` unit-norm queries.
    docs: ``[N, D]`` unit-norm items (one shared corpus).
    positions: ``[N]`` write order, ``0..N_real-1`` for real items.
    where: ``[N]`` True for real items.
    gram: optional ``[N, N]`` ``docs @ docs.T``.
    pool, iterations, power_iterations, batch_size: static, as CFS-R; query_where: optional ``[Q]`` real queries
      (chunks of padded ones are skipped, rows ``-inf``: :func:`engram_jax.ops.cfsr.map_live_queries`).
    lam, w: CFS-R's ridge weight and blend; traced.
    gamma: recency weight on the [0, 1] blend scale, a scalar or ``[...]`` (one per query); traced.

  Returns:
    ``[..., N]`` scores, ``-inf`` outside the pool or masked.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from engram_jax import cfsr_scores, tcfsr_prior_scores
    >>> docs = jax.random.normal(jax.random.key(0), (20, 8))
    >>> docs = docs / jnp.linalg.norm(docs, axis=-1, keepdims=True)
    >>> query = docs[3] / jnp.linalg.norm(docs[3])
    >>> bool(jnp.allclose(tcfsr_prior_scores(query, docs, jnp.arange(20), pool=5, gamma=0.0), cfsr_scores(query, docs, pool=5)))
    True
  """
  check_corpus(
    'tcfsr_prior_scores',
    'tcfsr_prior',
    query,
    docs,
    positions,
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    gamma=gamma,
  )
  per_query = jnp.ndim(gamma) > 0

  def one(q, d, wh, g, t_all, *gamma_q):
    sol = solve_pool(q, d, wh, g, t_all, pool=pool, iterations=iterations, lam=lam, power_iterations=power_iterations)
    gam = gamma_q[0] if per_query else gamma
    return scatter_pool(d.shape[0], sol, blend_pool(sol, w) + jnp.asarray(gam, sol.cos.dtype) * sol.t)

  return _run(
    one, query, docs, positions, where, gram, batch_size, (gamma,) if per_query else (), query_where=query_where
  )


def tcfsr_basis_scores(
  query: Array,
  docs: Array,
  positions: Array,
  *,
  where: Array | None = None,
  gram: Array | None = None,
  pool: int = _C['pool'],
  iterations: int = _C['iterations'],
  lam: ArrayLike = _C['lam'],
  w: ArrayLike = _C['w'],
  alpha: ArrayLike = _B['alpha'],
  anchor: ArrayLike = _B['anchor'],
  power_iterations: int = 20,
  batch_size: int | None = None,
  query_where: Array | None = None,
) -> Array:
  r"""CFS-R over a time-augmented basis: reconstruct ``[z_q, alpha * anchor]`` from rows ``[c_i, alpha * t_i]``.

  Definition:
    .. math::
      a^\star = \arg\min_{a \ge 0} \|z_q - C^\top a\|^2 + \alpha^2 (\tau - t^\top a)^2 + \lambda \|a\|^2

      s_i = w\, \mathrm{mm}(a^\star)_i + (1 - w)\, \mathrm{mm}(\cos(q, \cdot))_i \;\; (i \in \mathcal P)

    i.e. the CFS-R solve with :math:`G + \alpha^2 t t^\top` and :math:`b + \alpha^2 \tau t`; the pool and the
    cosine term are unchanged, so ``alpha = 0`` is CFS-R exactly. ``anchor`` :math:`\tau = 1` asks for
    "now"; 0 would ask for the oldest.

  Args: as :func:`tcfsr_prior_scores`, with ``alpha`` (time-feature scale) and ``anchor`` (target time)
    instead of ``gamma``; both traced (its own soft twin).

  Returns:
    ``[..., N]`` scores in [0, 1] for pool items, ``-inf`` elsewhere.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from engram_jax import tcfsr_basis_scores
    >>> docs = jax.random.normal(jax.random.key(0), (20, 8))
    >>> docs = docs / jnp.linalg.norm(docs, axis=-1, keepdims=True)
    >>> s = tcfsr_basis_scores(docs[3], docs, jnp.arange(20), pool=5, alpha=0.2)
    >>> s.shape, int(jnp.isfinite(s).sum())
    ((20,), 5)
  """
  check_corpus(
    'tcfsr_basis_scores',
    'tcfsr_basis',
    query,
    docs,
    positions,
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    alpha=alpha,
    anchor=anchor,
  )

  def one(q, d, wh, g, t_all):
    sol = solve_pool(
      q,
      d,
      wh,
      g,
      t_all,
      pool=pool,
      iterations=iterations,
      lam=lam,
      power_iterations=power_iterations,
      alpha=alpha,
      anchor=anchor,
    )
    return scatter_pool(d.shape[0], sol, blend_pool(sol, w))

  return _run(one, query, docs, positions, where, gram, batch_size, query_where=query_where)


def revision_signal(
  sol: PoolSolve, *, theta: ArrayLike, delta: ArrayLike = _G['delta'], temperature: ArrayLike | None = None
) -> Array:
  r"""The revision detector's statistic for one query's pool (a scalar >= 0).

  .. math:: r = \max_{i \ne j \in \mathcal P} \rho_i \rho_j\, h(G_{ij} - \theta)\, |t_i - t_j|,
            \qquad \rho_i = \max\!\left(0,\, 1 - \frac{\max_{\mathcal P} \cos - \cos_i}{\delta}\right)

  :math:`\rho` is 1 for the best cosine and 0 for items more than :math:`\delta` below it, so only pairs of
  near-top, mutually near-duplicate items written far apart count; :math:`h` is the step function (hard,
  ``temperature=None``) or :math:`\sigma(\cdot / T)` (soft).
  """
  top = jnp.max(jnp.where(sol.valid, sol.cos, -jnp.inf))
  rho = jnp.where(sol.valid, jax.nn.relu(1.0 - (top - sol.cos) / jnp.asarray(delta, sol.cos.dtype)), 0.0)
  x = sol.gram - jnp.asarray(theta, sol.gram.dtype)
  near = (x >= 0).astype(sol.gram.dtype) if temperature is None else jax.nn.sigmoid(x / temperature)
  p = sol.valid.shape[0]
  pair = sol.valid[:, None] & sol.valid[None, :] & ~jnp.eye(p, dtype=bool)
  v = rho[:, None] * rho[None, :] * near * jnp.abs(sol.t[:, None] - sol.t[None, :])
  return jnp.max(jnp.where(pair, v, 0.0), initial=0.0)


def revision_features(sol: PoolSolve, *, theta: ArrayLike, delta: ArrayLike) -> Array:
  """``[2]``: the revision signal (:func:`revision_signal`, hard) and the top pool cosine (0 for an empty pool) of
  one query's pool: the gate inputs of ``tcfsr_learned`` and the ``revision`` / ``top_cos`` features of the
  question-conditioned knobs. Neither reads the solution ``sol.a``."""
  r = revision_signal(sol, theta=theta, delta=delta)
  top = jnp.max(jnp.where(sol.valid, sol.cos, -jnp.inf))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  return jnp.stack([r, top])


def masked_pool(b: Array, g: Array, t: Array, valid: Array) -> tuple[Array, Array, Array]:
  """One gathered pool's ``(gram [P, P], cos [P], t [P])`` (from the fitter's rows) with its padded slots zeroed:
  they may hold junk, and must stay out of every product."""
  both = valid[:, None] & valid[None, :]
  return jnp.where(both, g, 0.0), jnp.where(valid, b, 0.0), jnp.where(valid, t, 0.0)


def _gated(
  query,
  docs,
  positions,
  *,
  where,
  gram,
  pool,
  iterations,
  lam,
  w,
  gamma,
  theta,
  delta,
  rho0,
  power_iterations,
  batch_size,
  temperature,
  query_where=None,
):
  where_ = 'tcfsr_gated_scores' if temperature is None else 'soft_tcfsr_gated_scores'
  knobs = dict(pool=pool, iterations=iterations, lam=lam, w=w, gamma=gamma, theta=theta, delta=delta, rho0=rho0)
  check_corpus(where_, 'tcfsr_gated', query, docs, positions, **knobs)
  if temperature is not None:
    validation.check_value(temperature, 'temperature', where=where_, check='>0')

  def one(q, d, wh, g, t_all):
    sol = solve_pool(q, d, wh, g, t_all, pool=pool, iterations=iterations, lam=lam, power_iterations=power_iterations)
    r = revision_signal(sol, theta=theta, delta=delta, temperature=temperature)
    x = r - jnp.asarray(rho0, r.dtype)
    gate = (x >= 0).astype(r.dtype) if temperature is None else jax.nn.sigmoid(x / temperature)
    return scatter_pool(d.shape[0], sol, blend_pool(sol, w) + jnp.asarray(gamma, r.dtype) * gate * sol.t)

  return _run(one, query, docs, positions, where, gram, batch_size, query_where=query_where)


def tcfsr_gated_scores(
  query: Array,
  docs: Array,
  positions: Array,
  *,
  where: Array | None = None,
  gram: Array | None = None,
  pool: int = _C['pool'],
  iterations: int = _C['iterations'],
  lam: ArrayLike = _C['lam'],
  w: ArrayLike = _C['w'],
  gamma: ArrayLike = _G['gamma'],
  theta: ArrayLike = _G['theta'],
  delta: ArrayLike = _G['delta'],
  rho0: ArrayLike = _G['rho0'],
  power_iterations: int = 20,
  batch_size: int | None = None,
  query_where: Array | None = None,
) -> Array:
  r"""CFS-R plus a recency prior for queries whose pool shows a revised fact.

  Definition:
    .. math::
      s_i = w\, \mathrm{mm}(a^\star)_i + (1 - w)\, \mathrm{mm}(\cos)_i + \gamma\, [r_q \ge \rho_0]\, t_i

    with :math:`r_q` from :func:`revision_signal` (near-duplicates: pool Gram :math:`\ge \theta`).
    ``gamma = 0`` (or a gate that never opens) is CFS-R exactly.

  Not differentiable in ``theta`` / ``rho0`` (steps); :func:`soft_tcfsr_gated_scores` is its relaxed twin.

  Args: as :func:`tcfsr_prior_scores`, plus ``theta`` (near-duplicate cosine), ``delta`` (how far below the
    best pool cosine an item still counts) and ``rho0`` (gate threshold on :math:`r_q`, in units of the
    write-order fraction).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from engram_jax import tcfsr_gated_scores
    >>> docs = jax.random.normal(jax.random.key(0), (20, 8))
    >>> docs = docs / jnp.linalg.norm(docs, axis=-1, keepdims=True)
    >>> s = tcfsr_gated_scores(docs[:2], docs, jnp.arange(20), pool=5)  # two queries
    >>> s.shape, jnp.isfinite(s).sum(-1).tolist()
    ((2, 20), [5, 5])
  """
  return _gated(
    query,
    docs,
    positions,
    where=where,
    gram=gram,
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    gamma=gamma,
    theta=theta,
    delta=delta,
    rho0=rho0,
    power_iterations=power_iterations,
    batch_size=batch_size,
    temperature=None,
    query_where=query_where,
  )


def soft_tcfsr_gated_scores(
  query: Array,
  docs: Array,
  positions: Array,
  *,
  where: Array | None = None,
  gram: Array | None = None,
  pool: int = _C['pool'],
  iterations: int = _C['iterations'],
  lam: ArrayLike = _C['lam'],
  w: ArrayLike = _C['w'],
  gamma: ArrayLike = _G['gamma'],
  theta: ArrayLike = _G['theta'],
  delta: ArrayLike = _G['delta'],
  rho0: ArrayLike = _G['rho0'],
  temperature: ArrayLike = 0.05,
  power_iterations: int = 20,
  batch_size: int | None = None,
) -> Array:
  r"""Relaxed :func:`tcfsr_gated_scores`: both steps become :math:`\sigma(x / T)` at ``temperature`` T > 0.

  Differentiable in ``lam``, ``w``, ``gamma``, ``theta``, ``rho0`` and ``temperature``; tends to the hard
  operator as ``temperature -> 0`` (away from exact ties at the thresholds).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from engram_jax import soft_tcfsr_gated_scores, tcfsr_gated_scores
    >>> docs = jax.random.normal(jax.random.key(0), (20, 8))
    >>> docs = docs / jnp.linalg.norm(docs, axis=-1, keepdims=True)
    >>> hard = tcfsr_gated_scores(docs[:2], docs, jnp.arange(20), pool=5)
    >>> soft = soft_tcfsr_gated_scores(docs[:2], docs, jnp.arange(20), pool=5, temperature=1e-4)
    >>> bool(jnp.allclose(soft, hard, atol=1e-4))
    True
  """
  return _gated(
    query,
    docs,
    positions,
    where=where,
    gram=gram,
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    gamma=gamma,
    theta=theta,
    delta=delta,
    rho0=rho0,
    power_iterations=power_iterations,
    batch_size=batch_size,
    temperature=jnp.asarray(temperature),
  )


# ---- legs -------------------------------------------------------------------------------------------


def _leg_args(ep: EpisodeArrays) -> dict:
  return {'where': ep.where, 'gram': episode_gram(ep.docs), 'query_where': ep.query_where}


def tcfsr_prior_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  pool: int = _P['pool'],
  iterations: int = _P['iterations'],
  lam: float = _P['lam'],
  w: float = _P['w'],
  gamma: float | Array = _P['gamma'],
  batch_size: int | None = _P['batch_size'],
) -> Array:
  """:func:`tcfsr_prior_scores` as a leg ``[Q, N]``."""
  del key
  return tcfsr_prior_scores(
    ep.queries,
    ep.docs,
    ep.positions,
    **_leg_args(ep),
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    gamma=gamma,
    batch_size=batch_size,
  )


def tcfsr_basis_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  pool: int = _B['pool'],
  iterations: int = _B['iterations'],
  lam: float = _B['lam'],
  w: float = _B['w'],
  alpha: float = _B['alpha'],
  anchor: float = _B['anchor'],
  batch_size: int | None = _B['batch_size'],
) -> Array:
  """:func:`tcfsr_basis_scores` as a leg ``[Q, N]``."""
  del key
  return tcfsr_basis_scores(
    ep.queries,
    ep.docs,
    ep.positions,
    **_leg_args(ep),
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    alpha=alpha,
    anchor=anchor,
    batch_size=batch_size,
  )


def tcfsr_gated_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  pool: int = _G['pool'],
  iterations: int = _G['iterations'],
  lam: float = _G['lam'],
  w: float = _G['w'],
  gamma: float = _G['gamma'],
  theta: float = _G['theta'],
  delta: float = _G['delta'],
  rho0: float = _G['rho0'],
  batch_size: int | None = _G['batch_size'],
) -> Array:
  """:func:`tcfsr_gated_scores` as a leg ``[Q, N]``."""
  del key
  return tcfsr_gated_scores(
    ep.queries,
    ep.docs,
    ep.positions,
    **_leg_args(ep),
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    gamma=gamma,
    theta=theta,
    delta=delta,
    rho0=rho0,
    batch_size=batch_size,
  )


def revision_gate(
  ep: EpisodeArrays,
  *,
  pool: int = _G['pool'],
  iterations: int = _G['iterations'],
  lam: float = _G['lam'],
  theta: float = _G['theta'],
  delta: float = _G['delta'],
  rho0: float = _G['rho0'],
) -> Array:
  """Per-question gate ``[Q]`` (1 where the revision detector opens), for analysis of the gated leg."""
  where = jnp.asarray(ep.where, bool)
  t_all = write_time(ep.positions, where)

  def one(q, d, wh, g):
    sol = solve_pool(q, d, wh, g, t_all, pool=pool, iterations=iterations, lam=lam, power_iterations=20)
    return (revision_signal(sol, theta=theta, delta=delta) >= rho0).astype(jnp.float32)

  return map_queries(one, ep.queries, ep.docs, where, episode_gram(ep.docs), batch_size=_G['batch_size'])


# ---- soft twins on precomputed pools (the fitter's rows) -------------------------------------------------


def pool_scores(
  b: Array,
  g: Array,
  t: Array,
  valid: Array,
  *,
  variant: str,
  lam: ArrayLike,
  w: ArrayLike,
  iterations: int,
  power_iterations: int = 20,
  gamma: ArrayLike = 0.0,
  alpha: ArrayLike = 0.0,
  anchor: ArrayLike = _B['anchor'],
  theta: ArrayLike = _G['theta'],
  delta: ArrayLike = _G['delta'],
  rho0: ArrayLike = _G['rho0'],
  temperature: ArrayLike | None = None,
) -> Array:
  """One variant's scores on gathered pools: ``b [B, P]`` pool cosines, ``g [B, P, P]`` pool Gram, ``t [B, P]``
  write-time fractions, ``valid [B, P]`` -> ``[B, P]`` (``-inf`` for invalid slots). The same computation as the
  hard operators after their pool step; ``temperature`` relaxes the gated variant's two steps (None = hard).
  The prior's ``gamma`` may be one value per row (``[B]``)."""
  per_row = variant == 'prior' and jnp.ndim(gamma) > 0

  def one(bi, gi, ti, vi, *gamma_b):
    gp, bb, tp = masked_pool(bi, gi, ti, vi)
    a2 = jnp.square(jnp.asarray(alpha if variant == 'basis' else 0.0, bb.dtype))
    a = nnls_ridge_pg(
      gp + a2 * tp[:, None] * tp[None, :],
      bb + a2 * jnp.asarray(anchor, bb.dtype) * tp,
      lam=lam,
      iterations=iterations,
      valid=vi,
      power_iterations=power_iterations,
    )
    sol = PoolSolve(jnp.zeros(bb.shape, jnp.int32), vi, a, bb, tp, gp)
    s = blend_pool(sol, w)
    if variant == 'prior':
      s = s + jnp.asarray(gamma_b[0] if per_row else gamma, s.dtype) * sol.t
    elif variant == 'gated':
      r = revision_signal(sol, theta=theta, delta=delta, temperature=temperature)
      x = r - jnp.asarray(rho0, r.dtype)
      gate = (x >= 0).astype(r.dtype) if temperature is None else jax.nn.sigmoid(x / temperature)
      s = s + jnp.asarray(gamma, s.dtype) * gate * sol.t
    return jnp.where(vi, s, -jnp.inf)

  return jax.vmap(one)(b, g, t, valid, *((jnp.broadcast_to(gamma, b.shape[:1]),) if per_row else ()))


def _rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options, settings) -> dict:
  del settings
  return pools.cosine_pool_rows(ep, n_questions, n_pad, options['pool'], times=True)


def _soft(variant: str):
  def scores(rows, values, ctx) -> Array:
    extra = {name: values[name] for name in ('gamma', 'alpha', 'anchor', 'theta', 'delta', 'rho0') if name in values}
    sp = pool_scores(
      rows['pool_cos'],
      rows['pool_gram'],
      rows['pool_t'],
      rows['pool_valid'],
      variant=variant,
      lam=values['lam'],
      w=values['w'],
      iterations=int(values['iterations']),
      temperature=ctx.temperatures.gate if variant == 'gated' else None,
      **extra,
    )
    return pools.scatter_rows(sp, rows['pool_idx'], ctx.where.shape[-1], -jnp.inf)

  return scores


TCFSR_PRIOR = register(
  Operator(
    name='tcfsr_prior',
    leg=tcfsr_prior_leg,
    doc='CFS-R + recency prior gamma * t in the blend',
    knobs=PRIOR_KNOBS,
    soft=SoftTwin(rows=_rows, scores=_soft('prior')),
  )
)
TCFSR_BASIS = register(
  Operator(
    name='tcfsr_basis',
    leg=tcfsr_basis_leg,
    doc='CFS-R over a time-augmented basis',
    knobs=BASIS_KNOBS,
    soft=SoftTwin(rows=_rows, scores=_soft('basis')),
  )
)
TCFSR_GATED = register(
  Operator(
    name='tcfsr_gated',
    leg=tcfsr_gated_leg,
    doc='CFS-R + recency gated by a revision detector',
    knobs=GATED_KNOBS,
    soft=SoftTwin(rows=_rows, scores=_soft('gated')),
  )
)
