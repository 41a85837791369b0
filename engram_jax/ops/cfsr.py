r"""Conditional Field Reconstruction (CFS-R): rank candidates by their share of a non-negative
reconstruction of the query.

Per query: a cosine top-P pool :math:`C` (P x D, rows = pool embeddings), the non-negative ridge
problem

.. math:: \min_{a \ge 0} \|z_q - C^\top a\|^2 + \lambda \|a\|^2

solved by projected gradient, and a blend of the min-max normalised coefficients with the min-max
normalised cosine. Everything the solver needs is the pool Gram :math:`G = C C^\top` (P x P) and
:math:`b = C z_q` (the pool cosines), so an episode's Gram :math:`E E^\top` (N x N) can be computed
once and the P x P blocks gathered per query (``gram=``).

Building blocks, public so that a variant reuses them instead of copying them (docs/extending.md, "Building on
CFS-R"): :func:`cosine_pool` (one query's pool and Gram block), :func:`nnls_ridge_pg` (the solve, scalar or per-item
ridge, with its step rule :func:`ridge_step` and :func:`power_lmax`), :func:`cfsr_blend` (the blend),
:func:`scatter_pool` (pool scores back to items), and for soft twins :func:`engram_jax.ops.pools.cosine_pool_rows`
and :func:`engram_jax.ops.pools.scatter_rows`.

Hard: :func:`cfsr_scores` (what is scored). Soft twin: CFS-R is differentiable in ``lam`` and ``w`` as it stands
(the cosine pool cut moves with neither), so the twin is :func:`cfsr_pool_scores` on pools gathered once before
training (forward-mode gradient in ``lam``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core import ranking, validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.ops import nnls_implicit, pools
from engram_jax.ops.greedy import episode_gram, map_queries
from engram_jax.ops.nnls import nnls_ridge_pg, power_lmax, ridge_step  # noqa: F401  (re-exported: the CFS-R solve)
from engram_jax.ops.registry import Knob, Operator, SoftTwin, Stages, check_knobs, knob_defaults, register

# The declaration of CFS-R's knobs: the one place their defaults are written (signatures below read _D; the
# time-aware variants in engram_jax.ops.tcfsr reuse the first four).
KNOBS = (
  Knob('pool', 150, static=True, check='int>=1', doc='cosine pool P'),
  Knob('iterations', 80, static=True, check='int>=0', doc='projected-gradient steps'),
  Knob('lam', 0.005, transform='log', check='>0', doc='ridge strength'),
  Knob('w', 0.90, transform='logit', check='[0,1]', doc='blend weight'),
  Knob('batch_size', 8, static=True, check=None, doc='queries solved at a time (None = all)'),
)
_D = knob_defaults(KNOBS)


def minmax(x: Array, valid: Array) -> Array:
  """``(x - min) / (max - min)`` over the ``valid`` entries of each list ``[..., P]`` (last axis); 0 where
  ``max == min`` or nothing is valid."""
  lo = jnp.min(jnp.where(valid, x, jnp.inf), axis=-1, keepdims=True)
  hi = jnp.max(jnp.where(valid, x, -jnp.inf), axis=-1, keepdims=True)
  span = hi - lo
  ok = valid & (span > 0)
  return jnp.where(ok, (x - jnp.where(ok, lo, 0.0)) / jnp.where(ok, span, 1.0), 0.0)


def cosine_pool(q: Array, d: Array, wh: Array, g: Array | None, *, pool: int) -> tuple[Array, Array, Array, Array]:
  """One query's cosine top-``pool`` and its Gram block.

  Args:
    q: ``[D]`` query; d: ``[N, D]`` items; wh: ``[N]`` real items; g: optional precomputed ``[N, N]`` Gram.

  Returns:
    ``(cos [N], idx [P], valid [P], block [P, P])``, ``P = min(pool, N)``; the block is gathered from ``g``
    when given, else computed from the pooled rows.
  """
  cos = d @ q
  idx, _ = ranking.top_k(cos, k=min(pool, d.shape[0]), where=wh)
  if g is not None:
    gp = g[idx[:, None], idx[None, :]]
  else:
    c = d[idx]
    gp = c @ c.T
  return cos, idx, wh[idx], gp


def cfsr_blend(a: Array, cos: Array, valid: Array, *, w: ArrayLike) -> Array:
  r"""CFS-R's blend on a pool: :math:`w\,\mathrm{mm}(a) + (1 - w)\,\mathrm{mm}(\cos)` over the ``valid`` entries
  (:func:`minmax`), ``-inf`` elsewhere.

  Args:
    a: ``[..., P]`` solve coefficients (:func:`nnls_ridge_pg`); cos: ``[..., P]`` pool cosines; valid: ``[..., P]``;
    w: blend weight (traced).

  Returns:
    ``[..., P]`` scores in [0, 1] on valid entries, ``-inf`` elsewhere.
  """
  w_ = jnp.asarray(w, cos.dtype)
  s = w_ * minmax(a, valid) + (1.0 - w_) * minmax(cos, valid)
  return jnp.where(valid, s, -jnp.inf)


def scatter_pool(s: Array, idx: Array, n: int) -> Array:
  """One query's pool scores ``s [P]`` at item indices ``idx [P]`` (distinct) in an ``[n]`` row of ``-inf``."""
  return jnp.full((n,), -jnp.inf, s.dtype).at[idx].set(s, unique_indices=True)


def _skipped(like):
  """What a skipped chunk returns: ``-inf`` for floats (unranked), False / 0 otherwise, in ``like``'s shapes."""
  fill = lambda x: jnp.full(x.shape, -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else 0, x.dtype)
  return jax.tree_util.tree_map(fill, like)


def map_live_queries(
  fn, query: Array, docs: Array, where: Array | None, gram: Array | None, *, live, batch_size, per_query=()
):
  """:func:`engram_jax.ops.greedy.map_queries` for queries ``[Q, D]`` of one shared corpus, in chunks of
  ``batch_size``, where a chunk with no live query (``live [Q]`` False: padded questions) is not computed: its rows
  are ``-inf`` (False / 0 for non-float outputs). Live rows equal ``map_queries`` bit for bit (the same chunks).
  Without ``live`` or ``batch_size``, with batch axes, or with a remainder chunk, it is ``map_queries``.
  ``per_query``: ``[Q]`` values passed to ``fn`` after ``gram``, as in ``map_queries``.

  A padded episode's question axis is rounded up to a bucket (a multiple of 64), so on LoCoMo about one chunk in
  six is padding: skipping it saves that share of CFS-R's pool and solve.
  """
  query = jnp.asarray(query)
  per_query = tuple(jnp.asarray(x) for x in per_query)
  plain = lambda: map_queries(fn, query, docs, where, gram, batch_size=batch_size, per_query=per_query)
  if live is None or batch_size is None or query.ndim != 2 or jnp.ndim(docs) != 2 or query.shape[0] <= 1:
    return plain()
  if any(x.shape != query.shape[:1] for x in per_query):
    return plain()
  q = query.shape[0]
  bs = min(int(batch_size), q)
  if q % bs:  # lax.map's remainder chunk differs in size: keep map_queries' chunks (and bits)
    return plain()
  docs = jnp.asarray(docs)
  where = jnp.ones(docs.shape[:1], bool) if where is None else jnp.asarray(where, bool)
  chunks = tuple(x.reshape((q // bs, bs) + x.shape[1:]) for x in (query, *per_query))
  alive = jnp.asarray(live, bool).reshape((q // bs, bs))

  def chunk(args):
    xs, lc = args
    run = lambda xs: jax.vmap(lambda qi, *pi: fn(qi, docs, where, gram, *pi))(*xs)
    return jax.lax.cond(jnp.any(lc), run, lambda xs: _skipped(jax.eval_shape(run, xs)), xs)

  out = jax.lax.map(chunk, (chunks, alive))
  return jax.tree_util.tree_map(lambda y: y.reshape((q,) + y.shape[2:]), out)


def cfsr_scores(
  query: Array,
  docs: Array,
  *,
  where: Array | None = None,
  gram: Array | None = None,
  pool: int = _D['pool'],
  iterations: int = _D['iterations'],
  lam: ArrayLike = _D['lam'],
  w: ArrayLike = _D['w'],
  power_iterations: int = 20,
  batch_size: int | None = None,
  query_where: Array | None = None,
) -> Array:
  r"""CFS-R scores: non-negative reconstruction share blended with cosine, over a cosine pool.

  Definition:
    .. math::
      \mathcal{P} = \text{cosine top-}P, \quad
      a^\star = \arg\min_{a \ge 0} \|z_q - C_{\mathcal P}^\top a\|^2 + \lambda \|a\|^2

      s_i = w\, \mathrm{mm}(a^\star)_i + (1 - w)\, \mathrm{mm}(\cos(q, \cdot))_i
      \;\; (i \in \mathcal P), \qquad s_i = -\infty \;\; (i \notin \mathcal P)

    where :math:`\mathrm{mm}(x) = (x - \min x) / (\max x - \min x)` over the pool (0 when
    :math:`\max = \min`, e.g. a one-item pool), and :math:`a^\star` is approximated by
    ``iterations`` projected-gradient steps (:func:`nnls_ridge_pg`: :math:`a_0 = 0`, step
    :math:`1/L`, :math:`L = 2(\hat\lambda_{max}(C C^\top) + \lambda)` by power iteration).

  The pool is the cosine top-``pool`` real items under the shared tie rule; with fewer real items
  than ``pool`` it is all real items (so ``pool > N`` and tiny episodes work).

  Args:
    query: ``[..., D]`` unit-norm queries; leading axes are batch.
    docs: ``[N, D]`` or ``[..., N, D]`` unit-norm items.
    where: ``[N]`` or ``[..., N]`` True for real items.
    gram: optional ``[N, N]`` (or ``[..., N, N]``) precomputed ``docs @ docs.T``: compute it once per
      episode and each query gathers its P x P block instead of multiplying P x D by D x P.
    pool: P, static (default: the ``pool`` knob).
    iterations: projected-gradient steps, static (the ``iterations`` knob).
    lam: ridge weight :math:`\lambda` (the ``lam`` knob); traced, differentiable.
    w: blend weight (the ``w`` knob); traced, differentiable.
    power_iterations: static (20).
    batch_size: static; if set, queries are solved ``batch_size`` at a time (``lax.map`` over
      chunks, ``vmap`` inside) so that each chunk's P x P Grams stay in cache across the
      iterations; ``None`` solves every query at once (``vmap``). Same result either way. On CPU a
      chunk of 8 queries (the knob's default) is several times faster for a LoCoMo episode (~200 queries):
      its eight 150 x 150 float32 blocks (0.7 MB) stay in a core's 1 MB L2 cache; 16 (1.4 MB) do not.
    query_where: optional ``[Q]`` real queries (queries ``[Q, D]`` of one corpus, with ``batch_size``): a chunk of
      padded queries only is skipped (its rows ``-inf``), :func:`map_live_queries`.

  Returns:
    ``[..., N]`` scores in [0, 1] for pool items, ``-inf`` elsewhere (outside the pool or masked).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from engram_jax import cfsr_scores
    >>> docs = jax.random.normal(jax.random.key(0), (20, 8))
    >>> docs = docs / jnp.linalg.norm(docs, axis=-1, keepdims=True)
    >>> query = docs[3] + docs[7]
    >>> query = query / jnp.linalg.norm(query)
    >>> s = cfsr_scores(query, docs, pool=5)  # only the cosine top-5 are scored
    >>> int(jnp.isfinite(s).sum()), sorted(jnp.argsort(-s)[:2].tolist())
    (5, [3, 7])
  """
  validation.check_embeddings('cfsr_scores', query, docs)
  check_knobs('cfsr', 'cfsr_scores', pool=pool, iterations=iterations, lam=lam, w=w)

  def one(q, d, wh, g):
    n = d.shape[0]
    cos, idx, valid, gp = cosine_pool(q, d, wh, g, pool=pool)
    b = cos[idx]
    a = nnls_ridge_pg(gp, b, lam=lam, iterations=iterations, valid=valid, power_iterations=power_iterations)
    return scatter_pool(cfsr_blend(a, b, valid, w=w), idx, n)

  return map_live_queries(one, query, docs, where, gram, live=query_where, batch_size=batch_size)


def _solve_pools(lam, b, g, valid, iterations, power_iterations, batch_size, tangent):
  """NNLS of every pool (flattened ``[B, P]``), ``batch_size`` at a time; with ``tangent`` also d a / d lam
  by forward mode (one extra tangent per solve, no stored iterates)."""

  def one(args):
    bi, gi, vi = args
    f = lambda l: nnls_ridge_pg(gi, bi, lam=l, iterations=iterations, valid=vi, power_iterations=power_iterations)
    if tangent:
      return jax.jvp(f, (lam,), (jnp.ones_like(lam),))
    return f(lam)

  if batch_size is None or b.shape[0] <= 1:
    return jax.vmap(one)((b, g, valid))
  return jax.lax.map(one, (b, g, valid), batch_size=min(batch_size, b.shape[0]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _solve_pools_lam(lam, b, g, valid, iterations, power_iterations, batch_size):
  return _solve_pools(lam, b, g, valid, iterations, power_iterations, batch_size, False)


def _solve_pools_lam_fwd(lam, b, g, valid, iterations, power_iterations, batch_size):
  return _solve_pools(lam, b, g, valid, iterations, power_iterations, batch_size, True)


def _solve_pools_lam_bwd(iterations, power_iterations, batch_size, da_dlam, ct):
  del iterations, power_iterations, batch_size
  return jnp.sum(ct * da_dlam), None, None, None


_solve_pools_lam.defvjp(_solve_pools_lam_fwd, _solve_pools_lam_bwd)


LAM_GRADS = ('reverse', 'forward', 'implicit')


def cfsr_pool_scores(
  b: Array,
  g: Array,
  *,
  valid: Array | None = None,
  lam: ArrayLike = _D['lam'],
  w: ArrayLike = _D['w'],
  iterations: int = _D['iterations'],
  power_iterations: int = 20,
  batch_size: int | None = None,
  lam_grad: str = 'reverse',
) -> Array:
  r"""CFS-R scores on a pool that is already gathered: ``b [..., P]`` pool cosines, ``g [..., P, P]`` pool Gram.

  The same computation as :func:`cfsr_scores` after its pool step (tested equal), for callers that
  gather the pools once and re-solve them many times (fitting ``lam`` and ``w``: the pool is the cosine
  top-P, which does not depend on either). With ``batch_size`` the pools are solved that many at a time
  (``lax.map``), so that each chunk's Grams stay in cache across the iterations (several times faster
  on CPU).

  Gradients (``lam_grad``, static):

  * ``'reverse'``: unrolled reverse mode through the projected-gradient iterations
    (:func:`nnls_ridge_pg`), in every input; stores every iterate.
  * ``'forward'``: :math:`\partial a / \partial \lambda` by forward mode inside each chunk (about twice a
    plain solve, nothing stored), handed to reverse mode by a ``custom_vjp``. The same gradient in
    ``lam`` and ``w``, several times cheaper on CPU; **no gradient flows to ``b`` or ``g``** (constants
    when fitting ``lam`` and ``w``).
  * ``'implicit'``: the converged solution differentiated through its KKT conditions
    (:mod:`engram_jax.ops.nnls_implicit`: one ``P x P`` solve per pool, nothing stored), in ``lam``, ``b`` and
    ``g``; equal to ``'reverse'`` once the iterations have converged.

  Returns:
    ``[..., P]`` scores in [0, 1] for valid pool entries, ``-inf`` elsewhere.
  """
  b = jnp.asarray(b)
  valid = jnp.ones(b.shape, bool) if valid is None else jnp.broadcast_to(jnp.asarray(valid, bool), b.shape)
  batch = b.shape[:-1]
  p = b.shape[-1]
  fb = b.reshape(-1, p)
  fg = jnp.broadcast_to(jnp.asarray(g, b.dtype), batch + (p, p)).reshape(-1, p, p)
  fv = valid.reshape(-1, p)
  lam_ = jnp.asarray(lam, b.dtype)
  if lam_grad == 'reverse':
    a = _solve_pools(lam_, fb, fg, fv, iterations, power_iterations, batch_size, False)
  elif lam_grad == 'forward':
    a = _solve_pools_lam(
      lam_, jax.lax.stop_gradient(fb), jax.lax.stop_gradient(fg), fv, iterations, power_iterations, batch_size
    )
  elif lam_grad == 'implicit':
    a = nnls_implicit.nnls_ridge_implicit(
      fg, fb, lam=lam_, iterations=iterations, valid=fv, power_iterations=power_iterations, batch_size=batch_size
    )
  else:
    raise ValueError(f'lam_grad must be one of {LAM_GRADS}, got {lam_grad!r}')
  return cfsr_blend(a, fb, fv, w=w).reshape(batch + (p,))


def cfsr_leg(
  ep: EpisodeArrays,
  key: Array,
  *,
  pool: int = _D['pool'],
  iterations: int = _D['iterations'],
  lam: float = _D['lam'],
  w: float = _D['w'],
  batch_size: int | None = _D['batch_size'],
) -> Array:
  """CFS-R scores ``[Q, N]`` (``-inf`` outside the cosine pool); queries solved in chunks of ``batch_size``
  (about 3x faster than one vmap over all queries on CPU; ``None`` = all at once, likely better on GPU).

  Pool blocks are gathered from the episode Gram up to :data:`engram_jax.ops.greedy.GRAM_ITEMS` items, and computed
  per query from the pooled rows above it (:func:`engram_jax.ops.greedy.episode_gram`): memory O(N D + Q P^2), never
  N x N."""
  del key
  return cfsr_scores(
    ep.queries,
    ep.docs,
    where=ep.where,
    gram=episode_gram(ep.docs),
    pool=pool,
    iterations=iterations,
    lam=lam,
    w=w,
    batch_size=batch_size,
    query_where=ep.query_where,
  )


def cfsr_prepare(ep: EpisodeArrays, key: Array, *, pool: int, batch_size: int | None) -> dict[str, Array]:
  """The part of :func:`cfsr_leg` that ``lam`` and ``w`` do not change: each query's cosine pool
  (:func:`cosine_pool`), as ``{'b': [Q, P] pool cosines, 'idx': [Q, P], 'valid': [Q, P], 'gram': [Q, P, P]}``."""
  del key

  def one(q, d, wh, g):
    cos, idx, valid, gp = cosine_pool(q, d, wh, g, pool=pool)
    return {'b': cos[idx], 'idx': idx, 'valid': valid, 'gram': gp}

  gram = episode_gram(ep.docs)
  return map_live_queries(one, ep.queries, ep.docs, ep.where, gram, live=ep.query_where, batch_size=batch_size)


def cfsr_finish(
  ep: EpisodeArrays,
  prepared: dict[str, Array],
  key: Array,
  *,
  pool: int,
  iterations: int,
  lam: ArrayLike,
  w: ArrayLike,
  batch_size: int | None,
) -> Array:
  """:func:`cfsr_leg` from :func:`cfsr_prepare`'s pools: the solve, the blend and the scatter (equal bit for bit,
  checked by ``check_operator``)."""
  del key, pool
  n = ep.docs.shape[-2]

  def one(b, idx, valid, gp):
    a = nnls_ridge_pg(gp, b, lam=lam, iterations=iterations, valid=valid, power_iterations=20)
    return scatter_pool(cfsr_blend(a, b, valid, w=w), idx, n)

  args = (prepared['b'], prepared['idx'], prepared['valid'], prepared['gram'])
  q = args[0].shape[0]
  if batch_size is None or q <= 1:  # as map_queries chunks cfsr_scores's queries
    return jax.vmap(one)(*args)
  bs = min(int(batch_size), q)
  if q % bs:
    return jax.lax.map(lambda a: one(*a), args, batch_size=bs)
  # as map_live_queries: chunks of padded questions only are skipped (rows -inf)
  chunks = jax.tree_util.tree_map(lambda x: x.reshape((q // bs, bs) + x.shape[1:]), args)
  alive = jnp.asarray(ep.query_where, bool).reshape((q // bs, bs))

  def chunk(xs):
    c, lc = xs
    run = lambda c: jax.vmap(one)(*c)
    return jax.lax.cond(jnp.any(lc), run, lambda c: _skipped(jax.eval_shape(run, c)), c)

  return jax.lax.map(chunk, (chunks, alive)).reshape((q, n))


def _rows(ep: EpisodeArrays, n_questions: int, n_pad: int, options, settings) -> dict:
  del settings
  return pools.cosine_pool_rows(ep, n_questions, n_pad, options['pool'])


def _soft(rows, values, ctx) -> Array:
  sp = cfsr_pool_scores(
    rows['pool_cos'],
    rows['pool_gram'],
    valid=rows['pool_valid'],
    lam=values['lam'],
    w=values['w'],
    iterations=int(values['iterations']),
    batch_size=ctx.settings.solve_batch,
    lam_grad=getattr(ctx.settings, 'cfsr_grad', 'forward'),
  )
  return pools.scatter_rows(sp, rows['pool_idx'], ctx.where.shape[-1], -jnp.inf)


CFSR = register(
  Operator(
    name='cfsr',
    leg=cfsr_leg,
    doc='Conditional Field Reconstruction: NNLS share of the query over a cosine pool',
    knobs=KNOBS,
    soft=SoftTwin(rows=_rows, scores=_soft),
    stages=Stages(prepare=cfsr_prepare, finish=cfsr_finish, by=('pool', 'batch_size')),
  )
)
