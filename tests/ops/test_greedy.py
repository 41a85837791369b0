"""Shared machinery of the greedy pickers (engram_jax.ops.greedy): a precomputed Gram gives the same picks, picks
become leg scores, and the relaxed greedy loop's gradients stay finite when cold."""

import jax
import jax.numpy as jnp
import numpy as np
import ops_testing
import pytest
from hypothesis import given

from engram_jax.ops import cfs, greedy, mmr
from engram_jax.testing import reference as ref

N_PAD, Q = ops_testing.N_PAD, ops_testing.Q


@given(ops_testing.greedy_episodes())
def test_gram_and_selection_scores(ep):
  docs, queries, where = ep
  clean = np.where(where[:, None], docs, 0.0)  # a gram with NaN rows would still be fine, but keep it simple
  gram = clean @ clean.T
  for fn in (ops_testing.mmr_jit, ops_testing.cfs_jit):
    a = fn(queries, clean, **ops_testing.hyper(fn, k=45, where=where, pool=6))
    b = fn(queries, clean, **ops_testing.hyper(fn, k=45, where=where, pool=6, gram=gram))
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-9, atol=1e-12)
    leg = np.asarray(greedy.selection_scores(a, n=N_PAD))
    for qi in range(Q):
      np.testing.assert_array_equal(leg[qi], ref.selection_scores_ref(np.asarray(a.indices[qi]), N_PAD))


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_soft_greedy_gradients_finite_when_cold(dtype=np.float32):
  """Regression: logits / T far beyond exp's range (cold steps) once gave inf * 0 = NaN gradients."""
  rng = np.random.default_rng(0)
  rel = rng.random((2, 30)).astype(dtype)
  x = rng.normal(size=(2, 30, 8))
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  g = np.einsum('bpd,brd->bpr', x, x).astype(dtype)

  @jax.jit
  def grads(beta, sigma, lam):
    cfs_loss = lambda b, s: jnp.sum(
      cfs.soft_cfs_select_gram(rel, g, k=10, beta=b, sigma=s, temperature=1e-5).probs * jnp.arange(30)
    )
    mmr_loss = lambda l: jnp.sum(mmr.soft_mmr_select_gram(rel, g, k=10, lam=l, temperature=1e-5).probs * jnp.arange(30))
    return jax.grad(cfs_loss, argnums=(0, 1))(beta, sigma) + (jax.grad(mmr_loss)(lam),)

  assert all(np.isfinite(v) for v in grads(0.2, 0.4, 0.5))
