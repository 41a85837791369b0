"""The CFS-R solve (:mod:`engram_jax.ops.nnls`): per-item ridge, the public step rule and power iteration.

A scalar ridge and the same value given per item give the same bits; a per-item ridge equals the float64 NumPy
reference (:func:`engram_jax.testing.reference.nnls_ridge_ref`) and, run long, scipy's NNLS of the same problem.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from engram_jax.ops import nnls
from engram_jax.testing import reference as ref

solve = jax.jit(nnls.nnls_ridge_pg, static_argnames=('iterations', 'power_iterations'))


def _problems(seed, batch=(3, 4), p=12, d=8):
  rng = np.random.default_rng(seed)
  c = np.stack([ref.unit_vectors(rng, p, d) for _ in range(int(np.prod(batch)))]).reshape(batch + (p, d))
  z = np.stack([ref.unit_vectors(rng, 1, d)[0] for _ in range(int(np.prod(batch)))]).reshape(batch + (d,))
  valid = rng.random(batch + (p,)) < 0.8
  return c, z, valid


def _gram(c, z):
  return np.einsum('...pd,...qd->...pq', c, c).astype(np.float32), np.einsum('...pd,...d->...p', c, z).astype(
    np.float32
  )


def test_a_scalar_ridge_and_the_same_ridge_per_item_give_the_same_bits():
  c, z, valid = _problems(0)
  g, b = _gram(c, z)
  scalar = np.asarray(solve(g, b, lam=0.005, iterations=80, valid=valid))
  per_item = np.asarray(solve(g, b, lam=np.full(b.shape, 0.005, np.float32), iterations=80, valid=valid))
  row = np.asarray(solve(g, b, lam=np.full(b.shape[-1:], 0.005, np.float32), iterations=80, valid=valid))  # [P]
  np.testing.assert_array_equal(scalar, per_item)
  np.testing.assert_array_equal(scalar, row)


@pytest.mark.parametrize('iterations', [5, 80])
def test_a_per_item_ridge_equals_the_float64_reference(iterations):
  c, z, valid = _problems(1)
  g, b = _gram(c, z)
  rng = np.random.default_rng(2)
  lam = np.exp(rng.uniform(np.log(1e-3), np.log(0.5), size=b.shape)).astype(np.float32)
  got = np.asarray(solve(g, b, lam=lam, iterations=iterations, valid=valid))
  for i in np.ndindex(b.shape[:-1]):
    keep = valid[i]
    want = ref.nnls_ridge_ref(c[i][keep], z[i], lam=lam[i][keep], iterations=iterations)
    np.testing.assert_allclose(got[i][keep], want, rtol=1e-4, atol=1e-5)
    assert (got[i][~keep] == 0).all()


def test_a_per_item_ridge_reaches_the_nnls_optimum():
  """Run long, the solve is the NNLS of ``[C^T; diag(sqrt(lam))] a ~ [z; 0]`` (scipy), and a larger ridge on an
  item shrinks that item's coefficient."""
  rng = np.random.default_rng(3)
  c = ref.unit_vectors(rng, 12, 6)
  z = ref.unit_vectors(rng, 1, 6)[0]
  lam = np.linspace(0.01, 0.3, 12)
  a = np.asarray(nnls.nnls_ridge_pg(c @ c.T, c @ z, lam=jnp.asarray(lam, jnp.float32), iterations=5000))
  want, _ = scipy.optimize.nnls(np.vstack([c.T, np.diag(np.sqrt(lam))]), np.concatenate([z, np.zeros(12)]))
  np.testing.assert_allclose(a, want, atol=1e-5)
  uniform = np.asarray(nnls.nnls_ridge_pg(c @ c.T, c @ z, lam=float(lam.min()), iterations=5000))
  assert not np.allclose(a, uniform, atol=1e-3)  # the per-item weights change the solution


def test_a_per_item_ridge_of_the_wrong_length_is_refused():
  with pytest.raises(ValueError, match=r'Shape mismatch: a per-item ridge lam \(5,\) must end in P = 4'):
    nnls.nnls_ridge_pg(jnp.eye(4), jnp.ones(4), lam=jnp.ones(5), iterations=3)


def test_power_lmax_and_the_step_rule():
  c, z, valid = _problems(4)
  g, _ = _gram(c, z)
  g = np.where(valid[..., :, None] & valid[..., None, :], g, 0.0)
  got = np.asarray(nnls.power_lmax(g, valid=valid, iterations=500))
  np.testing.assert_allclose(got, np.linalg.eigvalsh(g)[..., -1], rtol=1e-4)
  lam = np.full(valid.shape, 0.1, np.float32)
  lam[..., 0] = 0.7  # the largest ridge sets the step, where its entry is valid
  step = np.asarray(nnls.ridge_step(g, lam=lam, valid=valid, power_iterations=500))
  np.testing.assert_allclose(step, got + np.where(valid[..., 0], 0.7, 0.1), rtol=1e-5)
  assert np.asarray(nnls.ridge_step(g, lam=0.1, power_iterations=500)).shape == valid.shape[:-1]


def test_gradients_in_a_per_item_ridge_are_finite():
  c, z, valid = _problems(5, batch=(2,))
  g, b = _gram(c, z)
  f = functools.partial(nnls.nnls_ridge_pg, g, b, iterations=20, valid=valid)
  grad = jax.grad(lambda lam: jnp.sum(f(lam=lam) ** 2))(jnp.full(b.shape, 0.05))
  assert np.isfinite(np.asarray(grad)).all() and (np.asarray(grad)[valid] <= 0).all()
