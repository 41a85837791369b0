"""Soft twins: equal to rax where rax defines them, hard as temperature -> 0, check_grads, finite on masks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rax
from jax.test_util import check_grads

import reference_ops as ref
from engram_jax import diversity, fusion, lexical, metrics, ranking, recency, reconstruction, relax

COLD = 1e-7  # a temperature at which every soft op must equal its hard twin (inputs without ties)


def grads_ok(f, args, order=1, modes=('fwd', 'rev')):
  """``check_grads`` on the jitted ``f`` (eager op-by-op dispatch is what makes these tests slow)."""
  check_grads(jax.jit(f), args, order=order, modes=list(modes))


def _lists(b=3, n=12, seed=0):
  rng = np.random.default_rng(seed)
  s = rng.normal(size=(b, n))
  y = rng.random((b, n)) < 0.3
  y[:, 0] = True
  return s, y


def _episode(n=30, d=8, q=3, seed=1):
  rng = np.random.default_rng(seed)
  return ref.unit_vectors(rng, n, d), ref.unit_vectors(rng, q, d)


# ---- equal to rax -----------------------------------------------------------------------------------

def test_soft_ranks_equal_rax_and_subset():
  s, _ = _lists()
  at = np.argsort(-s, axis=-1)[:, :5]
  s2 = s.copy()
  s2[0, 3] = -np.inf
  where = np.ones_like(s, bool)
  where[0, 4] = False
  keep = [i for i in range(s.shape[1]) if i not in (3, 4)]

  @jax.jit
  def all_ranks(s, s2):
    step = lambda d: jax.nn.sigmoid(d / 0.3)
    return (relax.soft_ranks(s, temperature=0.3), rax.utils.approx_ranks(s, step_fn=step),
            relax.soft_ranks(s, temperature=0.3, at=at), relax.soft_ranks(s, temperature=np.array([0.1, 0.3, 1.0])),
            relax.soft_ranks(s2, where=where, temperature=0.3), relax.soft_ranks(s[0, keep], temperature=0.3))

  r, r_rax, r_at, r_t, r2, r_keep = all_ranks(s, s2)
  np.testing.assert_allclose(r, r_rax, rtol=1e-12)
  np.testing.assert_allclose(r_at, np.take_along_axis(r, at, -1), rtol=1e-12)
  np.testing.assert_allclose(r_t[1], r[1], rtol=1e-12)  # per-list temperatures broadcast over the list axis
  # masked and -inf items are left out and rank after every real item
  np.testing.assert_allclose(r2[0, keep], r_keep, rtol=1e-12)
  assert r2[0, 3] == r2[0, 4] == len(keep) + 1


def test_approx_ndcg_equals_rax_without_cutoff():
  s, y = _lists()

  @jax.jit
  def values(s):
    rank_fn = functools.partial(rax.utils.approx_ranks, step_fn=lambda d: jax.nn.sigmoid(d / 0.5))
    out = [rax.ndcg_metric(s, jnp.asarray(y, s.dtype), rank_fn=rank_fn, reduce_fn=None),
           relax.approx_ndcg(s, y, k=None, temperature=0.5)]
    # gold-only soft ranks (O(G N)) equal the full computation, with and without a cutoff
    for k in (None, 3):
      out += [relax.approx_ndcg(s, y, k=k, temperature=0.5, max_gold=12), relax.approx_ndcg(s, y, k=k, temperature=0.5)]
    return out

  expected, got, *pairs = values(s)
  np.testing.assert_allclose(got, expected, rtol=1e-10)
  for a, b in zip(pairs[::2], pairs[1::2]):
    np.testing.assert_allclose(a, b, rtol=1e-12)


# ---- soft -> hard as temperature -> 0 -----------------------------------------------------------------

def test_relax_tends_to_hard():
  s, y = _lists(b=4, n=20)

  @jax.jit
  def cold(s):
    return (relax.soft_ranks(s, temperature=COLD), ranking.ranks(s),
            relax.soft_top_k(s, k=5, temperature=COLD, cutoff_temperature=COLD), ranking.top_k(s, k=10)[0],
            relax.approx_ndcg(s, y, k=10, temperature=COLD, max_gold=8))

  soft_r, hard_r, soft_top, top10, approx = cold(s)
  np.testing.assert_allclose(soft_r, hard_r, atol=1e-6)
  top = np.zeros_like(s)
  np.put_along_axis(top, np.asarray(top10)[:, :5], 1.0, -1)
  np.testing.assert_allclose(soft_top, top, atol=1e-6)
  np.testing.assert_allclose(approx, metrics.ndcg_at_k(np.asarray(top10), y, k=10), atol=1e-6)


@pytest.mark.parametrize('candidates', [None, 8])
def test_soft_rrf_tends_to_rrf(candidates):
  rng = np.random.default_rng(2)
  legs = rng.normal(size=(3, 2, 25))
  legs[2, :, 10:] = -np.inf  # a leg that ranks only some items
  where = np.ones((2, 25), bool)
  where[:, -3:] = False
  docs, qs = _episode(n=25, q=2)

  @jax.jit
  def both(legs, weights):
    kw = dict(weights=weights, depths=[5, 4, 6], where=where, k0=10.0)
    out = [fusion.rrf_fuse(legs, **kw)]
    for temps in (COLD, [None, COLD, None]):
      out.append(fusion.soft_rrf_fuse(legs, temperature=temps, depth_temperature=COLD, candidates=candidates, **kw))
    # a relaxed greedy leg at a cold temperature is its hard twin (picks ranked 1..K)
    picks = diversity.selection_scores(diversity.cfs_select(qs, docs, k=6, where=where[0]), n=25)
    soft_sel = diversity.soft_cfs_select(qs, docs, k=6, temperature=COLD, where=where[0])
    kw = dict(weights=weights[:2], depths=[5, 4], where=where, k0=10.0)
    out.append(fusion.rrf_fuse(jnp.stack([legs[0], picks]), **kw))
    out.append(fusion.soft_rrf_fuse([legs[0], soft_sel], temperature=[COLD, None], depth_temperature=COLD,
                                    candidates=candidates, **kw))
    return out

  hard, soft1, soft2, hard_sel, soft_sel = both(legs, np.array([1.0, 0.5, 3.0]))
  np.testing.assert_allclose(soft1, hard, atol=1e-9)
  np.testing.assert_allclose(soft2, hard, atol=1e-9)
  np.testing.assert_allclose(soft_sel, hard_sel, atol=1e-9)


@pytest.mark.parametrize('op', ['mmr', 'cfs'])
def test_soft_greedy_tends_to_hard(op):
  docs, qs = _episode(n=30, q=3)
  where = np.ones(30, bool)
  where[[3, 17]] = False
  hard_fn, soft_fn = ((diversity.mmr_select, diversity.soft_mmr_select) if op == 'mmr'
                      else (diversity.cfs_select, diversity.soft_cfs_select))
  kw = dict(lam=0.6) if op == 'mmr' else dict(beta=0.5, sigma=0.5)

  @jax.jit
  def run(qs, docs):
    return [(hard_fn(qs, docs, k=8, where=where, pool=pool, **kw),
             soft_fn(qs, docs, k=8, where=where, pool=pool, temperature=COLD, **kw),
             soft_fn(qs, docs, k=8, where=where, pool=pool, temperature=0.05, **kw)) for pool in (None, 12)]

  for hard, soft, warm in run(qs, docs):
    np.testing.assert_array_equal(np.argmax(soft.probs, -1), hard.indices)
    np.testing.assert_allclose(np.max(soft.probs, -1), 1.0, atol=1e-9)
    np.testing.assert_allclose(soft.scores, hard.scores, atol=1e-9)
    # warm: a distribution per pick, masked items never picked
    np.testing.assert_allclose(np.sum(warm.probs, -1), 1.0, atol=1e-9)
    assert np.all(warm.probs[..., ~where] == 0)


def test_cfsr_pool_scores_equal_cfsr_scores():
  docs, qs = _episode(n=40, d=10, q=4)
  where = np.arange(40) < 37
  cos = qs @ docs.T
  idx = np.asarray(ranking.top_k(cos, k=12, where=where)[0])
  g = (docs @ docs.T)[idx[:, :, None], idx[:, None, :]]

  @jax.jit
  def both(lam, w):
    full = reconstruction.cfsr_scores(qs, docs, where=where, pool=12, iterations=30, lam=lam, w=w)
    return [full] + [reconstruction.cfsr_pool_scores(np.take_along_axis(cos, idx, -1), g, valid=where[idx], lam=lam,
                                                     w=w, iterations=30, batch_size=bs, lam_grad=mode)
                     for mode, bs in (('reverse', None), ('forward', 3))]

  full, *pooled = both(0.02, 0.7)
  for p in pooled:
    np.testing.assert_allclose(p, np.take_along_axis(np.asarray(full), idx, -1), rtol=1e-10)


# ---- gradients -----------------------------------------------------------------------------------------

def test_check_grads_relax():
  s, y = _lists(b=2, n=8)
  at = np.array([[0, 3], [1, 2]])
  grads_ok(lambda x, t: (relax.soft_ranks(x, temperature=t), relax.soft_ranks(x, temperature=t, at=at),
                         relax.soft_cutoff(x * 3 + 4, k=3, temperature=t), relax.soft_top_k(x, k=3, temperature=t)),
           (s, 0.4))
  grads_ok(lambda x, t: (relax.approx_ndcg(x, y, k=3, temperature=t, cutoff_temperature=0.7),
                         relax.approx_ndcg(x, y, k=3, temperature=t, max_gold=8)), (s, 0.5))


def test_check_grads_soft_rrf():
  rng = np.random.default_rng(3)
  legs = rng.normal(size=(2, 2, 15))
  const = rng.normal(size=(2, 15))

  def f(scores, w, k0):
    return fusion.soft_rrf_fuse([scores[0], scores[1], const], weights=w, depths=[4, 6, 5], k0=k0,
                                temperature=[0.3, 0.5, None], depth_temperature=0.5, candidates=10)

  def g(scores, w, k0):  # plus the dense path (no candidates)
    return f(scores, w, k0), fusion.soft_rrf_fuse(scores, weights=w[:2], depths=[4, 6], k0=k0, temperature=0.3)

  grads_ok(g, (legs, np.array([1.0, 2.0, 0.5]), 7.0))


@pytest.mark.parametrize('op', ['mmr', 'cfs'])
def test_check_grads_soft_greedy(op):
  docs, qs = _episode(n=14, d=6, q=2, seed=4)
  if op == 'mmr':
    f = lambda lam, t: diversity.soft_mmr_select(qs, docs, k=4, lam=lam, temperature=t).probs
    args = (0.6, 0.05)
  else:
    f = lambda beta, sigma: diversity.soft_cfs_select(qs, docs, k=4, beta=beta, sigma=sigma, temperature=0.3).probs
    args = (0.5, 0.4)
  grads_ok(f, args, order=1, modes=['fwd', 'rev'])


def test_check_grads_cfsr_tide_bm25():
  docs, qs = _episode(n=20, d=6, q=2, seed=5)
  cos = qs @ docs.T
  idx = np.asarray(ranking.top_k(cos, k=8)[0])
  b, g = np.take_along_axis(cos, idx, -1), (docs @ docs.T)[idx[:, :, None], idx[:, None, :]]

  def cfsr(lam, w, mode='reverse'):
    s = reconstruction.cfsr_pool_scores(b, g, lam=lam, w=w, iterations=15, lam_grad=mode)
    return jnp.sum(s * np.arange(8))

  grads_ok(cfsr, (0.05, 0.7), modes=['rev'])
  grads_ok(functools.partial(cfsr, mode='forward'), (0.05, 0.7), modes=['rev'])
  np.testing.assert_allclose(jax.jit(jax.grad(functools.partial(cfsr, mode='forward')))(0.05, 0.7),
                             jax.jit(jax.grad(cfsr))(0.05, 0.7), rtol=1e-9)
  grads_ok(lambda w: recency.tide_scores(cos, np.arange(20), weight=w, depth=6), (0.2,), modes=['rev'])
  toks = [lexical.tokenize(t) for t in ['a cat ran', 'the dog', 'a blue cat cat', 'x y', '']]
  vocab = lexical.build_vocab(toks)
  dtf = lexical.term_counts(toks, vocab).astype(np.float64)
  qtf = lexical.term_counts([['cat', 'a'], ['dog', 'x']], vocab).astype(np.float64)
  grads_ok(lambda k1, bb: lexical.bm25_scores(qtf, dtf, k1=k1, b=bb), (1.2, 0.6), modes=['rev'])


# ---- all-masked rows: finite values and gradients --------------------------------------------------------

def test_all_masked_rows_are_finite():
  s, y = _lists(b=2, n=10)
  where = np.ones_like(s, bool)
  where[1] = False
  docs, qs = _episode(n=10, d=4, q=2)
  none = np.zeros(10, bool)
  finite_sum = lambda x: jnp.sum(jnp.where(jnp.isfinite(x), x, 0.0))

  def everything(x, t, w, k0, lam):
    out = relax.approx_ndcg(x, y, k=3, where=where, temperature=t, max_gold=4).sum()
    out += finite_sum(fusion.soft_rrf_fuse([x, x[::-1]], weights=w, depths=[3, 3], where=where, k0=k0,
                                           temperature=[t, None], candidates=5))
    out += jnp.sum(relax.soft_ranks(jnp.full_like(x, -jnp.inf) + x, temperature=t))  # a leg that ranks nothing
    out += jnp.sum(diversity.soft_mmr_select(qs, docs, k=3, where=none, lam=lam, temperature=t).probs)
    out += jnp.sum(diversity.soft_cfs_select(qs, docs, k=3, where=none, beta=lam, temperature=t).probs)
    out += finite_sum(reconstruction.cfsr_pool_scores(jnp.zeros((1, 4)), jnp.zeros((1, 4, 4)),
                                                      valid=np.zeros((1, 4), bool), lam=lam, w=w[0], iterations=5,
                                                      lam_grad='forward'))
    return out

  assert relax.approx_ndcg(s, y, k=3, where=where, temperature=0.5)[1] == 0.0
  sel = jax.jit(functools.partial(diversity.soft_cfs_select, k=3))(qs, docs, where=none, temperature=0.1)
  assert np.all(sel.probs == 0) and np.all(np.isneginf(sel.scores))
  grads = jax.jit(jax.grad(everything, argnums=(0, 1, 2, 3, 4)))(s, 0.5, np.ones(2), 10.0, 0.3)
  for g in grads:
    assert np.all(np.isfinite(g))


def test_soft_greedy_gradients_finite_when_cold(dtype=np.float32):
  """Regression: logits / T far beyond exp's range (cold steps) once gave inf * 0 = NaN gradients."""
  rng = np.random.default_rng(0)
  rel = rng.random((2, 30)).astype(dtype)
  x = rng.normal(size=(2, 30, 8))
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  g = np.einsum('bpd,brd->bpr', x, x).astype(dtype)

  @jax.jit
  def grads(beta, sigma, lam):
    cfs = lambda b, s: jnp.sum(diversity.soft_cfs_select_gram(rel, g, k=10, beta=b, sigma=s, temperature=1e-5).probs
                               * jnp.arange(30))
    mmr = lambda l: jnp.sum(diversity.soft_mmr_select_gram(rel, g, k=10, lam=l, temperature=1e-5).probs
                            * jnp.arange(30))
    return jax.grad(cfs, argnums=(0, 1))(beta, sigma) + (jax.grad(mmr)(lam),)

  assert all(np.isfinite(v) for v in grads(0.2, 0.4, 0.5))
