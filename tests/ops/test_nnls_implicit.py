"""Implicit (KKT) gradients of CFS-R's NNLS: against central finite differences of an exact NNLS reference
(scipy.optimize.nnls), against reverse mode unrolled to convergence, on random problems; the CFS-R twin with
``lam_grad='implicit'`` has the same forward values and the converged gradient."""

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
from hypothesis import assume, given

from engram_jax.fit import Settings
from engram_jax.ops import cfsr, nnls_implicit

CONVERGED = 4000  # projected-gradient steps: converged to ~1e-12 on these problems (lam >= 0.1, P <= 8: kappa <= 90)
P = 8  # one padded shape (smaller problems mask entries), so each test compiles once


def nnls_ref(g: np.ndarray, b: np.ndarray, lam: float) -> np.ndarray:
  """Exact minimiser of a^T (G + lam I) a - 2 b^T a over a >= 0 (NumPy/SciPy): with G + lam I = L L^T it is
  min ||L^T a - L^{-1} b||^2, an ordinary NNLS (active-set, exact support)."""
  l = np.linalg.cholesky(g + lam * np.eye(len(b)))
  return scipy.optimize.nnls(l.T, scipy.linalg.solve_triangular(l, b, lower=True), maxiter=50 * len(b))[0]


@st.composite
def problems(draw):
  p = draw(st.integers(2, P))
  d = draw(st.sampled_from((3, 16)))
  seed = draw(st.integers(0, 2**31 - 1))
  lam = draw(st.floats(0.1, 0.5))
  rng = np.random.default_rng(seed)
  c = rng.normal(size=(p, d))
  c /= np.linalg.norm(c, axis=1, keepdims=True)
  z = rng.normal(size=d)
  z /= np.linalg.norm(z)
  ct = rng.normal(size=p)
  dg = rng.normal(size=(p, p))
  return c @ c.T, c @ z, lam, ct, dg + dg.T, rng.normal(size=p)


def padded(g, b, *more):
  """Pad a P-entry problem to :data:`P` entries (masked), with its valid mask."""
  p = len(b)
  gp = np.zeros((P, P))
  gp[:p, :p] = g
  pad = lambda x: np.concatenate([x, np.zeros(P - p)])
  return (gp, pad(b), np.arange(P) < p) + tuple(pad(x) for x in more)


def strictly_complementary(g, b, lam, a, tol=1e-6) -> bool:
  """Active entries clearly positive and inactive ones with a clearly positive multiplier (FD is then smooth)."""
  grad = (g + lam * np.eye(len(b))) @ a - b
  act = a > 0
  return bool(act.any() and np.all(a[act] > tol) and np.all(grad[~act] > tol))


@jax.jit
def _implicit_grads(g, b, valid, lam, ct):
  f = lambda g, b, lam: jnp.dot(ct, nnls_implicit.nnls_ridge_implicit(g, b, lam=lam, iterations=CONVERGED, valid=valid))
  return jax.grad(f, argnums=(0, 1, 2))(g, b, lam), nnls_implicit.nnls_ridge_implicit(
    g, b, lam=lam, iterations=CONVERGED, valid=valid
  )


@jax.jit
def _unrolled_grads(g, b, valid, lam, ct):
  f = lambda g, b, lam: jnp.dot(ct, cfsr.nnls_ridge_pg(g, b, lam=lam, iterations=CONVERGED, valid=valid))
  return jax.grad(f, argnums=(0, 1, 2))(g, b, lam)


def implicit_grads(g, b, lam, ct):
  """(d g, d b, d lam) of ct . a and the solution a, unpadded."""
  p = len(b)
  gp, bp, valid, ctp = padded(g, b, ct)
  (gg, gb, gl), a = _implicit_grads(gp, bp, valid, lam, ctp)
  return (np.asarray(gg)[:p, :p], np.asarray(gb)[:p], float(gl)), np.asarray(a)[:p]


def rel_err(x, y):
  return float(np.linalg.norm(np.ravel(x) - np.ravel(y)) / max(np.linalg.norm(np.ravel(y)), 1e-12))


@given(problems())
def test_implicit_matches_finite_differences_of_exact_nnls(prob):
  g, b, lam, ct, dg_dir, db_dir = prob
  a = nnls_ref(g, b, lam)
  assume(strictly_complementary(g, b, lam, a))
  (gg, gb, gl), a_pg = implicit_grads(g, b, lam, ct)
  np.testing.assert_allclose(a_pg, a, atol=1e-9)
  h = 1e-6
  fd = lambda f: (f(h) - f(-h)) / (2 * h)
  want_lam = fd(lambda e: ct @ nnls_ref(g, b, lam + e))
  want_b = fd(lambda e: ct @ nnls_ref(g, b + e * db_dir, lam))
  want_g = fd(lambda e: ct @ nnls_ref(g + e * dg_dir, b, lam))
  assert abs(float(gl) - want_lam) <= 1e-5 * max(1.0, abs(want_lam))
  assert abs(float(np.dot(gb, db_dir)) - want_b) <= 1e-5 * max(1.0, abs(want_b))
  assert abs(float(np.sum(gg * dg_dir)) - want_g) <= 1e-5 * max(1.0, abs(want_g))


@given(problems())
def test_implicit_matches_unrolled_to_convergence(prob):
  g, b, lam, ct, _, _ = prob
  a = nnls_ref(g, b, lam)
  assume(strictly_complementary(g, b, lam, a))
  p = len(b)
  gp, bp, valid, ctp = padded(g, b, ct)
  ug, ub, ul = _unrolled_grads(gp, bp, valid, lam, ctp)
  (gg, gb, gl), _ = implicit_grads(g, b, lam, ct)
  assert rel_err(gb, np.asarray(ub)[:p]) < 1e-6
  assert rel_err(gl, ul) < 1e-6
  # d G: the unrolled gradient also runs through the step size (power iteration on G), which does not move the
  # converged point; it vanishes only to the convergence tolerance
  assert rel_err(gg, np.asarray(ug)[:p, :p]) < 1e-5


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_masked_entries_get_no_gradient_and_batches_agree():
  rng = np.random.default_rng(3)
  c = rng.normal(size=(4, 7, 9))
  c /= np.linalg.norm(c, axis=-1, keepdims=True)
  z = rng.normal(size=(4, 9))
  g, b = c @ np.swapaxes(c, -1, -2), np.einsum('qpd,qd->qp', c, z)
  valid = np.ones((4, 7), bool)
  valid[1, 5:] = False
  ct = rng.normal(size=(4, 7))

  def loss(g, b, lam, batch_size):
    a = nnls_implicit.nnls_ridge_implicit(g, b, lam=lam, iterations=3000, valid=valid, batch_size=batch_size)
    return jnp.sum(ct * a)

  full = jax.grad(loss, argnums=(0, 1, 2))(g, b, 0.1, None)
  chunked = jax.grad(loss, argnums=(0, 1, 2))(g, b, 0.1, 3)
  for x, y in zip(full, chunked):
    np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
  assert np.all(full[1][1, 5:] == 0) and np.all(full[0][1, 5:, :] == 0) and np.all(full[0][1, :, 5:] == 0)


@pytest.mark.slow  # heavy compile: the fast tier keeps this module's lighter tests and test_registry_twins
def test_cfsr_pool_scores_implicit_same_values_and_converged_grads():
  rng = np.random.default_rng(7)
  c = rng.normal(size=(3, 8, 12))
  c /= np.linalg.norm(c, axis=-1, keepdims=True)
  z = rng.normal(size=(3, 12))
  z /= np.linalg.norm(z, axis=-1, keepdims=True)
  g, b = c @ np.swapaxes(c, -1, -2), np.einsum('qpd,qd->qp', c, z)
  weights = np.arange(8.0)

  def loss(lam, w, b, mode, iterations):
    return jnp.sum(cfsr.cfsr_pool_scores(b, g, lam=lam, w=w, iterations=iterations, lam_grad=mode) * weights)

  for iterations in (80, CONVERGED):
    vals = {m: loss(0.05, 0.7, b, m, iterations) for m in cfsr.LAM_GRADS}
    assert vals['implicit'] == vals['reverse'] == vals['forward']
  grads = {
    m: jax.jit(jax.grad(functools.partial(loss, mode=m, iterations=CONVERGED), argnums=(0, 1, 2)))(0.05, 0.7, b)
    for m in ('reverse', 'implicit')
  }
  for x, y in zip(grads['implicit'], grads['reverse']):
    assert rel_err(x, y) < 1e-6


def test_settings_reject_unknown_grad():
  with pytest.raises(ValueError, match='fit.cfsr_grad must be one of'):
    Settings(cfsr_grad='adjoint')
