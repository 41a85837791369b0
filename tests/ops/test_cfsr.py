"""CFS-R: JAX equals the loop reference, the solver is a real NNLS solver, degenerate pools, jit / vmap / chunks,
grads; its soft twin on gathered pools equals it and has correct gradients; its registry declaration."""

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import ops_testing
import pytest
import scipy.optimize
import strategies
from hypothesis import given

from engram_jax import ops
from engram_jax.core import batch, ranking
from engram_jax.ops import cfsr, greedy
from engram_jax.testing import reference as ref

N_PAD, D_PAD, Q = 40, 16, 3
POOLS = (5, 150)  # a real prefilter, and P > N (the pool is every real item)

cfsr_jit = jax.jit(cfsr.cfsr_scores, static_argnames=('pool', 'iterations', 'power_iterations', 'batch_size'))


episodes = functools.partial(strategies.padded_episodes, n_pad=N_PAD, d_pad=D_PAD, q=Q)


@given(episodes(), st.sampled_from(POOLS), st.floats(0.0, 0.1), st.floats(0.0, 1.0))
def test_cfsr_matches_reference(ep, pool, lam, w):
  docs, queries, where = ep
  got = np.asarray(cfsr_jit(queries, docs, where=where, pool=pool, lam=lam, w=w))
  assert not np.isnan(got).any()
  for qi, q in enumerate(queries):
    want = ref.cfsr_scores_ref(q, docs, where=where, pool=pool, lam=lam, w=w)
    np.testing.assert_array_equal(np.isneginf(got[qi]), np.isneginf(want))
    np.testing.assert_allclose(got[qi], want, rtol=1e-7, atol=1e-9)
  n_real = int(where.sum())
  assert (np.isfinite(got).sum(-1) == min(pool, n_real)).all()
  # The precomputed episode Gram gives the same scores.
  clean = np.where(where[:, None], docs, 0.0)
  a = cfsr_jit(queries, clean, where=where, pool=pool, lam=lam, w=w)
  b = cfsr_jit(queries, clean, where=where, pool=pool, lam=lam, w=w, gram=clean @ clean.T)
  np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_solver_reaches_the_nnls_optimum():
  rng = np.random.default_rng(3)
  c = ref.unit_vectors(rng, 12, 6)
  z = ref.unit_vectors(rng, 1, 6)[0]
  lam = 0.05
  a = np.asarray(cfsr.nnls_ridge_pg(c @ c.T, c @ z, lam=lam, iterations=5000))
  # scipy: min ||[C^T; sqrt(lam) I] a - [z; 0]||, a >= 0 -- the same problem.
  want, _ = scipy.optimize.nnls(np.vstack([c.T, np.sqrt(lam) * np.eye(12)]), np.concatenate([z, np.zeros(12)]))
  np.testing.assert_allclose(a, want, atol=1e-6)
  grad = 2 * (c @ (c.T @ a - z) + lam * a)  # KKT: grad >= 0 at 0, grad = 0 where a > 0
  assert (a >= 0).all() and (grad > -1e-6).all() and np.abs(grad[a > 1e-9]).max() < 1e-6


def _run(query, docs, where=None, **kw):
  """cfsr_jit at the hypothesis shapes (cached compilations); returns the first query's [n] scores."""
  n, d = docs.shape
  wh = np.zeros(N_PAD, bool)
  wh[:n] = True if where is None else where
  qs = ref.pad(np.repeat(np.atleast_2d(query), Q, 0), Q, D_PAD)
  kw = {'lam': 0.005, 'w': 0.9, **kw}  # given explicitly, as in the hypothesis test: shared jit cache
  return np.asarray(cfsr_jit(qs, ref.pad(docs, N_PAD, D_PAD), where=wh, **kw))[0, :n]


@pytest.mark.parametrize('pool', POOLS)
def test_degenerate_pools(pool):
  rng = np.random.default_rng(4)
  docs = ref.unit_vectors(rng, 6, 4)
  q = ref.unit_vectors(rng, 1, 4)[0]
  none = _run(q, docs, where=np.zeros(6, bool), pool=pool)
  assert np.isneginf(none).all()
  one = _run(q, docs, where=np.eye(6, dtype=bool)[3], pool=pool)  # a one-item pool: min-max is 0
  assert one[3] == 0.0 and np.isneginf(np.delete(one, 3)).all()
  two = _run(q, docs[:2], pool=pool)
  np.testing.assert_allclose(two, ref.cfsr_scores_ref(q, docs[:2], pool=pool), atol=1e-12)
  assert np.isfinite(two).all()


def test_pool_boundary_tie_later_item_wins():
  # Items 0 and 5 are identical and tie for the last of 5 pool slots; the later one (5) enters.
  q = np.array([1.0, 0, 0])
  e = lambda x, y: np.array([x, y, np.sqrt(1 - x * x - y * y)])
  docs = np.stack([e(0.5, 0.1), e(0.9, 0.0), e(0.8, 0.2), e(0.7, -0.3), e(0.6, 0.3), e(0.5, 0.1), e(0.1, 0.1)])
  s = _run(q, docs, pool=5)
  assert np.isneginf(s[[0, 6]]).all() and np.isfinite(s[1:6]).all()
  np.testing.assert_allclose(s, ref.cfsr_scores_ref(q, docs, pool=5), atol=1e-12)


@pytest.mark.slow
def test_jit_eager_vmap_loop_and_grads():
  rng = np.random.default_rng(5)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, 10), N_PAD, D_PAD)
  qs = ref.pad(ref.unit_vectors(rng, Q, 10), Q, D_PAD)
  where = rng.random(N_PAD) < 0.9
  kw = dict(pool=5, lam=0.005, w=0.9)
  jitted = cfsr_jit(qs, docs, where=where, **kw)
  eager = cfsr.cfsr_scores(qs, docs, where=where, **kw)
  np.testing.assert_allclose(eager, jitted, rtol=1e-12)
  vmapped = jax.vmap(lambda q: cfsr_jit(q, docs, where=where, **kw))(qs)
  loop = np.stack([cfsr_jit(q, docs, where=where, **kw) for q in qs])
  np.testing.assert_allclose(vmapped, loop, rtol=1e-12)
  np.testing.assert_allclose(vmapped, jitted, rtol=1e-12)
  chunked = cfsr_jit(qs, docs, where=where, batch_size=2, **kw)  # lax.map over chunks of 2 (+ remainder)
  np.testing.assert_allclose(chunked, jitted, rtol=1e-12)
  batched = cfsr_jit(
    np.stack([qs, qs]), np.stack([docs, docs[::-1]])[:, None], where=np.stack([where, where[::-1]])[:, None], **kw
  )
  np.testing.assert_allclose(batched[0], jitted, rtol=1e-12)
  np.testing.assert_allclose(batched[1], cfsr_jit(qs, docs[::-1], where=where[::-1], **kw), rtol=1e-12)

  # lam and w are traced: gradients exist, are finite, and changing them does not recompile.
  def loss(lam, w):
    s = cfsr.cfsr_scores(qs, docs, where=where, pool=5, lam=lam, w=w, iterations=20)
    return jnp.sum(jnp.where(jnp.isfinite(s), s * jnp.arange(N_PAD), 0.0))

  g_lam, g_w = jax.jit(jax.grad(loss, argnums=(0, 1)))(0.005, 0.9)
  assert np.isfinite(g_lam) and np.isfinite(g_w) and g_w != 0.0 and g_lam != 0.0
  before = cfsr_jit._cache_size()
  cfsr_jit(qs, docs, where=where, pool=5, lam=0.01, w=0.5)
  assert cfsr_jit._cache_size() == before


# ---- soft twin: the same operator on pools gathered once -------------------------------------------------------


def test_cfsr_pool_scores_equal_cfsr_scores():
  docs, qs = ops_testing.unit_episode(n=40, d=10, q=4)
  where = np.arange(40) < 37
  cos = qs @ docs.T
  idx = np.asarray(ranking.top_k(cos, k=12, where=where)[0])
  g = (docs @ docs.T)[idx[:, :, None], idx[:, None, :]]

  @jax.jit
  def both(lam, w):
    full = cfsr.cfsr_scores(qs, docs, where=where, pool=12, iterations=30, lam=lam, w=w)
    return [full] + [
      cfsr.cfsr_pool_scores(
        np.take_along_axis(cos, idx, -1), g, valid=where[idx], lam=lam, w=w, iterations=30, batch_size=bs, lam_grad=mode
      )
      for mode, bs in (('reverse', None), ('forward', 3))
    ]

  full, *pooled = both(0.02, 0.7)
  for p in pooled:
    np.testing.assert_allclose(p, np.take_along_axis(np.asarray(full), idx, -1), rtol=1e-10)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_check_grads_cfsr_pool_scores():
  docs, qs = ops_testing.unit_episode(n=20, d=6, q=2, seed=5)
  cos = qs @ docs.T
  idx = np.asarray(ranking.top_k(cos, k=8)[0])
  b, g = np.take_along_axis(cos, idx, -1), (docs @ docs.T)[idx[:, :, None], idx[:, None, :]]

  def loss(lam, w, mode='reverse'):
    s = cfsr.cfsr_pool_scores(b, g, lam=lam, w=w, iterations=15, lam_grad=mode)
    return jnp.sum(s * np.arange(8))

  ops_testing.grads_ok(loss, (0.05, 0.7), modes=['rev'])
  ops_testing.grads_ok(functools.partial(loss, mode='forward'), (0.05, 0.7), modes=['rev'])
  np.testing.assert_allclose(
    jax.jit(jax.grad(functools.partial(loss, mode='forward')))(0.05, 0.7), jax.jit(jax.grad(loss))(0.05, 0.7), rtol=1e-9
  )


# ---- large episodes: no N x N Gram above GRAM_ITEMS -------------------------------------------------------------


def largest_intermediate(jaxpr) -> int:
  """The most elements of any value computed in ``jaxpr`` (ClosedJaxpr or Jaxpr), sub-computations included."""
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  most = 0
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      most = max(most, int(np.prod(getattr(v.aval, 'shape', ()), dtype=np.int64)))
    for p in eqn.params.values():
      for sub in p if isinstance(p, (tuple, list)) else (p,):
        if hasattr(getattr(sub, 'jaxpr', sub), 'eqns'):
          most = max(most, largest_intermediate(sub))
  return most


def test_episode_gram_up_to_the_threshold():
  docs = np.random.default_rng(0).normal(size=(2, 6, 3))
  np.testing.assert_allclose(greedy.episode_gram(docs, max_items=6), docs @ docs.transpose(0, 2, 1), rtol=1e-12)
  assert greedy.episode_gram(docs, max_items=5) is None
  assert greedy.episode_gram(np.zeros((greedy.GRAM_ITEMS + 1, 2))) is None
  assert greedy.GRAM_ITEMS >= 1024  # LoCoMo (<= 690 items) and LongMemEval_S (<= 616 turns) keep the Gram path


@pytest.mark.parametrize('name', ['cfsr', 'cfs', 'mmr'])
def test_pool_legs_above_the_gram_threshold(name):
  """Padded past GRAM_ITEMS (masked items), a pool operator's leg computes its blocks from the pooled rows: the same
  scores as the Gram path at small padding, and nothing N x N in the computation."""
  ep, docs, queries = ops_testing.small_episode()
  small = batch.episode_arrays(ep, docs, queries, n_multiple=16, q_multiple=4)
  n_big = greedy.GRAM_ITEMS + 16
  pad = lambda x: np.pad(np.asarray(x), [(0, n_big - x.shape[0])] + [(0, 0)] * (x.ndim - 1))
  big = small.replace(docs=pad(small.docs), where=pad(small.where), positions=np.arange(n_big, dtype=np.int32))
  n, q = ep.n_items, len(ep.questions)  # (these legs read the embeddings and masks only, not the term statistics)
  op = ops.get(name)
  leg = functools.partial(op.leg, **op.defaults)
  key = jax.random.key(0)
  want = np.asarray(jax.jit(leg)(small, key))[:q, :n]
  got = np.asarray(jax.jit(leg)(big, key))[:q, :n]
  np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert largest_intermediate(jax.make_jaxpr(leg)(big, key)) < n_big**2
  assert largest_intermediate(jax.make_jaxpr(leg)(small, key)) >= small.docs.shape[0] ** 2  # the Gram


@pytest.mark.slow
def test_declaration():
  ops_testing.check_declaration('cfsr')


def test_chunks_of_padded_questions_are_skipped_and_live_rows_keep_their_bits():
  """``query_where``: a chunk of ``batch_size`` padded questions is not solved (its rows are -inf); every chunk with
  a real question is solved as without it, bit for bit (the leg, its stages, and the tcfsr variants)."""
  from engram_jax.ops import tcfsr

  rng = np.random.default_rng(7)
  docs = ref.unit_vectors(rng, 30, 8).astype(np.float32)
  queries = ref.unit_vectors(rng, 12, 8).astype(np.float32)
  live = np.arange(12) < 5  # chunks of 4: [0-3] live, [4-7] one live, [8-11] padded only
  kw = dict(pool=6, iterations=10, batch_size=4)
  plain = np.asarray(jax.jit(lambda q, d: cfsr.cfsr_scores(q, d, **kw))(queries, docs))
  skip = np.asarray(jax.jit(lambda q, d, lv: cfsr.cfsr_scores(q, d, query_where=lv, **kw))(queries, docs, live))
  np.testing.assert_array_equal(skip[:8], plain[:8])
  assert np.isneginf(skip[8:]).all() and np.isfinite(plain[8:]).any()
  t = np.arange(30)
  for fn in (tcfsr.tcfsr_prior_scores, tcfsr.tcfsr_basis_scores, tcfsr.tcfsr_gated_scores):
    a = np.asarray(jax.jit(lambda q, d, fn=fn: fn(q, d, t, **kw))(queries, docs))
    b = np.asarray(jax.jit(lambda q, d, lv, fn=fn: fn(q, d, t, query_where=lv, **kw))(queries, docs, live))
    np.testing.assert_array_equal(b[:8], a[:8])
    assert np.isneginf(b[8:]).all()
