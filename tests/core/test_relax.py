"""Relaxed ranking primitives: equal to rax where rax defines them, hard as temperature -> 0, check_grads, and finite
values and gradients on all-masked rows through every soft twin. The operators' own soft twins are tested beside
them (tests/ops/)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rax
from jax.test_util import check_grads

from engram_jax.core import ranking, relax
from engram_jax.metrics import labels as metrics
from engram_jax.ops import cfs, cfsr, mmr, rrf
from engram_jax.testing import reference as ref

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
    return (
      relax.soft_ranks(s, temperature=0.3),
      rax.utils.approx_ranks(s, step_fn=step),
      relax.soft_ranks(s, temperature=0.3, at=at),
      relax.soft_ranks(s, temperature=np.array([0.1, 0.3, 1.0])),
      relax.soft_ranks(s2, where=where, temperature=0.3),
      relax.soft_ranks(s[0, keep], temperature=0.3),
    )

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
    out = [
      rax.ndcg_metric(s, jnp.asarray(y, s.dtype), rank_fn=rank_fn, reduce_fn=None),
      relax.approx_ndcg(s, y, k=None, temperature=0.5),
    ]
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
    return (
      relax.soft_ranks(s, temperature=COLD),
      ranking.ranks(s),
      relax.soft_top_k(s, k=5, temperature=COLD, cutoff_temperature=COLD),
      ranking.top_k(s, k=10)[0],
      relax.approx_ndcg(s, y, k=10, temperature=COLD, max_gold=8),
    )

  soft_r, hard_r, soft_top, top10, approx = cold(s)
  np.testing.assert_allclose(soft_r, hard_r, atol=1e-6)
  top = np.zeros_like(s)
  np.put_along_axis(top, np.asarray(top10)[:, :5], 1.0, -1)
  np.testing.assert_allclose(soft_top, top, atol=1e-6)
  np.testing.assert_allclose(approx, metrics.ndcg_at_k(np.asarray(top10), y, k=10), atol=1e-6)


# ---- gradients -----------------------------------------------------------------------------------------


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_check_grads_relax():
  s, y = _lists(b=2, n=8)
  at = np.array([[0, 3], [1, 2]])
  grads_ok(
    lambda x, t: (
      relax.soft_ranks(x, temperature=t),
      relax.soft_ranks(x, temperature=t, at=at),
      relax.soft_cutoff(x * 3 + 4, k=3, temperature=t),
      relax.soft_top_k(x, k=3, temperature=t),
    ),
    (s, 0.4),
  )
  grads_ok(
    lambda x, t: (
      relax.approx_ndcg(x, y, k=3, temperature=t, cutoff_temperature=0.7),
      relax.approx_ndcg(x, y, k=3, temperature=t, max_gold=8),
    ),
    (s, 0.5),
  )


# ---- all-masked rows: finite values and gradients --------------------------------------------------------


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_all_masked_rows_are_finite():
  s, y = _lists(b=2, n=10)
  where = np.ones_like(s, bool)
  where[1] = False
  docs, qs = _episode(n=10, d=4, q=2)
  none = np.zeros(10, bool)
  finite_sum = lambda x: jnp.sum(jnp.where(jnp.isfinite(x), x, 0.0))

  def everything(x, t, w, k0, lam):
    out = relax.approx_ndcg(x, y, k=3, where=where, temperature=t, max_gold=4).sum()
    out += finite_sum(
      rrf.soft_rrf_fuse([x, x[::-1]], weights=w, depths=[3, 3], where=where, k0=k0, temperature=[t, None], candidates=5)
    )
    out += jnp.sum(relax.soft_ranks(jnp.full_like(x, -jnp.inf) + x, temperature=t))  # a leg that ranks nothing
    out += jnp.sum(mmr.soft_mmr_select(qs, docs, k=3, where=none, lam=lam, temperature=t).probs)
    out += jnp.sum(cfs.soft_cfs_select(qs, docs, k=3, where=none, beta=lam, temperature=t).probs)
    out += finite_sum(
      cfsr.cfsr_pool_scores(
        jnp.zeros((1, 4)),
        jnp.zeros((1, 4, 4)),
        valid=np.zeros((1, 4), bool),
        lam=lam,
        w=w[0],
        iterations=5,
        lam_grad='forward',
      )
    )
    return out

  assert relax.approx_ndcg(s, y, k=3, where=where, temperature=0.5)[1] == 0.0
  sel = jax.jit(functools.partial(cfs.soft_cfs_select, k=3))(qs, docs, where=none, temperature=0.1)
  assert np.all(sel.probs == 0) and np.all(np.isneginf(sel.scores))
  grads = jax.jit(jax.grad(everything, argnums=(0, 1, 2, 3, 4)))(s, 0.5, np.ones(2), 10.0, 0.3)
  for g in grads:
    assert np.all(np.isfinite(g))
