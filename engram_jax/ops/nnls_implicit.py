r"""Implicit gradients of the non-negative ridge solution (CFS-R's NNLS) through its optimality conditions.

The forward pass is the projected-gradient solver (:func:`engram_jax.ops.nnls.nnls_ridge_pg`); the backward pass
does not unroll its iterations but differentiates the *converged* solution. At the minimiser of
:math:`f(a) = \|z - C^\top a\|^2 + \lambda\|a\|^2` over :math:`a \ge 0` the KKT conditions are, with the active
(support) set :math:`S = \{i : a_i > 0\}`,

.. math::
  (G_{SS} + \lambda I)\, a_S = b_S, \qquad a_{\bar S} = 0,

so (strict complementarity: the support does not move under a small perturbation)

.. math::
  da_S = (G_{SS} + \lambda I)^{-1} (db_S - dG_{SS}\, a_S - d\lambda\, a_S), \qquad da_{\bar S} = 0 .

The vector-Jacobian product with a cotangent :math:`\bar a` is one symmetric solve :math:`u = (G_{SS} + \lambda
I)^{-1} \bar a_S` (:math:`u_{\bar S} = 0`), and then :math:`\bar b = u`, :math:`\bar G = -u a^\top`,
:math:`\bar\lambda = -u^\top a`. Padded (invalid) pool entries are outside :math:`S`. The system is solved as one
``[P, P]`` matrix per problem: the rows and columns outside :math:`S` are replaced by the identity, so shapes never
depend on the support (Cholesky; the matrix is positive definite for :math:`\lambda > 0`).

The Cholesky factor and the two triangular solves are plain XLA loops (:func:`spd_solve`), not
``jax.scipy.linalg.cho_solve``: on CPU, jaxlib 0.10's LAPACK kernels split a batch of matrices across XLA's intra-op
thread pool and block a pool thread until the pieces are done, so two programs that reach such a kernel at the same
time (a cross-fit's folds on two CPU devices, one pool thread each) each hold a pool thread while waiting for work
queued behind the other: a deadlock (every thread asleep, seen in 8 of 10 two-device adapter fits). A program
without a LAPACK call cannot take part in it; :func:`engram_jax.fit.train.host_blocking_kernels` finds such calls in
a lowered program.

Cost: the forward solve plus one ``P x P`` Cholesky per pool; memory: the solution and the Gram (no stored
iterates), against unrolled reverse mode storing every one of ``iterations`` iterates. It equals the unrolled
gradient when the iterations have converged (the support is then exact); with few iterations it is the gradient of
the limit, not of the truncated iterate (tests check both against finite differences of a converged solve).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from engram_jax.ops.nnls import nnls_ridge_pg


def _forward(g: Array, b: Array, lam: Array, valid: Array, iterations: int, power_iterations: int) -> Array:
  return nnls_ridge_pg(g, b, lam=lam, iterations=iterations, valid=valid, power_iterations=power_iterations)


def spd_solve(m: Array, rhs: Array) -> Array:
  r"""``x = m^{-1} rhs`` for a symmetric positive definite ``m [P, P]`` and ``rhs [P]``: the Cholesky factor
  :math:`m = L L^\top` column by column, then :math:`L y = rhs` and :math:`L^\top x = y`, each a ``fori_loop`` of
  ``P`` steps in plain XLA ops (no LAPACK custom call, see the module docstring; ``vmap`` batches it).

  Cost: :math:`P^3 + 2 P^2` multiply-adds (a ``P x P`` matrix-vector product per column) against LAPACK's
  :math:`P^3 / 3`; for CFS-R's pools (the support of one solution, padded to the pool) that is small beside the
  forward solve's iterations.

  Example:
    >>> import numpy as np, jax.numpy as jnp
    >>> m = jnp.array([[4.0, 2.0], [2.0, 3.0]])
    >>> np.allclose(spd_solve(m, jnp.array([1.0, 2.0])), np.linalg.solve(np.asarray(m), [1.0, 2.0]))
    True
  """
  p = m.shape[-1]
  idx = jnp.arange(p)

  def column(j, l):  # column j of L; columns >= j of l are still zero, so l @ l[j] sums over k < j
    v = m[:, j] - l @ l[j]
    d = jnp.sqrt(v[j])
    return l.at[:, j].set(jnp.where(idx > j, v / d, jnp.where(idx == j, d, 0.0)))

  l = jax.lax.fori_loop(0, p, column, jnp.zeros_like(m))
  diag = jnp.diagonal(l)
  y = jax.lax.fori_loop(0, p, lambda j, y: y.at[j].set((rhs[j] - l[j] @ y) / diag[j]), jnp.zeros_like(rhs))

  def back(i, x):  # x[k] is set for k > j only, so l[:, j] @ x sums over k > j
    j = p - 1 - i
    return x.at[j].set((y[j] - l[:, j] @ x) / diag[j])

  return jax.lax.fori_loop(0, p, back, jnp.zeros_like(rhs))


def kkt_vjp(g: Array, a: Array, lam: Array, valid: Array, ct: Array) -> tuple[Array, Array, Array]:
  r"""The implicit VJP of one NNLS solution ``a [P]`` (of Gram ``g [P, P]``, ridge ``lam``) for cotangent ``ct [P]``.

  Returns:
    ``(d g [P, P], d b [P], d lam [])`` as in the module docstring (zero outside the support).
  """
  s = valid & (a > 0)
  both = s[:, None] & s[None, :]
  m = jnp.where(both, g, 0.0) + jnp.diag(jnp.where(s, lam, 1.0))
  rhs = jnp.where(s, ct, 0.0)
  u = jnp.where(s, spd_solve(m, rhs), 0.0)
  return -jnp.outer(u, a), u, -(u @ a)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def nnls_ridge_implicit_one(
  g: Array, b: Array, lam: Array, valid: Array, iterations: int, power_iterations: int
) -> Array:
  """One problem (``g [P, P]``, ``b [P]``, ``valid [P]``): the projected-gradient solution with an implicit VJP."""
  return _forward(g, b, lam, valid, iterations, power_iterations)


def _one_fwd(g, b, lam, valid, iterations, power_iterations):
  a = _forward(g, b, lam, valid, iterations, power_iterations)
  return a, (g, a, lam, valid)


def _one_bwd(iterations, power_iterations, res, ct):
  del iterations, power_iterations
  g, a, lam, valid = res
  gm = jnp.where(valid[:, None] & valid[None, :], g, 0.0)
  dg, db, dlam = kkt_vjp(gm, a, lam, valid, ct)
  return dg, db, jnp.reshape(dlam, jnp.shape(lam)).astype(jnp.result_type(lam)), None


nnls_ridge_implicit_one.defvjp(_one_fwd, _one_bwd)


def nnls_ridge_implicit(
  g: ArrayLike,
  b: ArrayLike,
  *,
  lam: ArrayLike,
  iterations: int,
  valid: ArrayLike | None = None,
  power_iterations: int = 20,
  batch_size: int | None = None,
) -> Array:
  r"""Non-negative ridge regression (the same solution as :func:`engram_jax.ops.nnls.nnls_ridge_pg`), differentiated
  implicitly through its KKT conditions in ``g``, ``b`` and ``lam``.

  Args:
    g: ``[..., P, P]`` PSD pool Grams; b: ``[..., P]``; lam: scalar ridge weight (traced);
    iterations, power_iterations: static, as in the projected-gradient solver;
    valid: ``[..., P]`` real pool entries; batch_size: static, solve that many problems at a time (``lax.map``;
      ``None`` = one ``vmap``).

  Returns:
    ``[..., P]`` non-negative coefficients.
  """
  b = jnp.asarray(b)
  g = jnp.asarray(g, b.dtype)
  valid = jnp.ones(b.shape, bool) if valid is None else jnp.asarray(valid, bool)
  batch = jnp.broadcast_shapes(g.shape[:-2], b.shape[:-1], valid.shape[:-1])
  p = b.shape[-1]
  fg = jnp.broadcast_to(g, batch + (p, p)).reshape((-1, p, p))
  fb = jnp.broadcast_to(b, batch + (p,)).reshape((-1, p))
  fv = jnp.broadcast_to(valid, batch + (p,)).reshape((-1, p))
  lam_ = jnp.asarray(lam, b.dtype)

  def one(args):
    gi, bi, vi = args
    return nnls_ridge_implicit_one(gi, bi, lam_, vi, iterations, power_iterations)

  if batch_size is None or fb.shape[0] <= 1:
    a = jax.vmap(one)((fg, fb, fv))
  else:
    a = jax.lax.map(one, (fg, fb, fv), batch_size=min(batch_size, fb.shape[0]))
  return a.reshape(batch + (p,))
