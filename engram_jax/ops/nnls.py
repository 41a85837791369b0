r"""Non-negative ridge regression by projected gradient: the CFS-R solve (:mod:`engram_jax.ops.cfsr`), on its own so
that the implicit-gradient wrapper (:mod:`engram_jax.ops.nnls_implicit`), CFS-R and operators built on it (the
time-aware variants, :mod:`engram_jax.ops.tcfsr`; docs/extending.md's recency-scaled ridge) share one solver.

Public pieces: :func:`nnls_ridge_pg` (the solve, scalar or per-item ridge), :func:`ridge_step` (its step rule: half
the Lipschitz constant of the gradient) and :func:`power_lmax` (the eigenvalue estimate the step rule uses).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike


def _power_one(g: Array, valid: Array, iterations: int) -> Array:
  """:func:`power_lmax` of one ``[P, P]`` Gram (``valid [P]``)."""
  v0 = valid.astype(g.dtype)
  tiny = jnp.finfo(g.dtype).tiny

  def body(_, v):
    v = g @ v
    return v / jnp.maximum(jnp.linalg.norm(v), tiny)

  v = jax.lax.fori_loop(0, iterations, body, v0 / jnp.maximum(jnp.linalg.norm(v0), tiny))
  return v @ (g @ v)


def power_lmax(g: ArrayLike, *, valid: ArrayLike | None = None, iterations: int = 20) -> Array:
  r"""Largest eigenvalue of a PSD pool Gram by power iteration from the (valid) all-ones vector.

  Definition:
    .. math::
      v_0 = \mathbb{1}_{valid} / \|\mathbb{1}_{valid}\|, \quad v_{t+1} = G v_t / \|G v_t\|, \quad
      \hat\lambda_{max} = v_T^\top G v_T

    a lower bound that converges to :math:`\lambda_{max}` (0 for an empty or all-zero pool).

  Args:
    g: ``[..., P, P]`` PSD Gram; rows and columns of invalid entries must be 0 (as :func:`nnls_ridge_pg` masks them).
    valid: ``[..., P]`` real pool entries (default: all).
    iterations: power iterations ``T``; static.

  Returns:
    ``[...]`` the Rayleigh quotient :math:`\hat\lambda_{max}`.

  >>> import jax.numpy as jnp
  >>> round(float(power_lmax(jnp.diag(jnp.array([3.0, 1.0])))), 4)
  3.0
  """
  g = jnp.asarray(g)
  valid = jnp.ones(g.shape[:-1], bool) if valid is None else jnp.asarray(valid, bool)
  one = lambda gi, vi: _power_one(gi, vi, iterations)
  return jnp.vectorize(one, signature='(p,p),(p)->()')(g, valid)


def _ridge_max(lam: Array, valid: Array) -> Array:
  """The largest ridge weight over the valid entries: ``lam`` itself when it is a scalar (bit for bit)."""
  return lam if lam.ndim == 0 else jnp.max(jnp.where(valid, lam, 0.0), axis=-1)


def ridge_step(g: ArrayLike, *, lam: ArrayLike, valid: ArrayLike | None = None, power_iterations: int = 20) -> Array:
  r"""The projected-gradient step rule of :func:`nnls_ridge_pg`: :math:`L / 2`, half the Lipschitz constant.

  Definition (:math:`\Lambda = \mathrm{diag}(\lambda)`, a scalar :math:`\lambda` meaning :math:`\lambda I`):
    .. math::
      \nabla f(a) = 2((G + \Lambda) a - b), \qquad
      L / 2 = \max(\hat\lambda_{max}(G) + \max_{i\ valid} \lambda_i,\ \text{tiny})

    with :math:`\hat\lambda_{max}` from :func:`power_lmax`. Since :math:`\lambda_{max}(G + \Lambda) \le
    \lambda_{max}(G) + \max_i \lambda_i`, the step :math:`1/L` keeps the iteration convergent (it is for any
    estimate above :math:`\lambda_{max}/2`).

  Args:
    g: ``[..., P, P]`` PSD Gram, invalid rows and columns 0; lam: scalar or ``[..., P]`` per-item ridge;
    valid: ``[..., P]``; power_iterations: static.

  Returns:
    ``[...]`` :math:`L / 2` (the solver's update is :math:`a - (\nabla f / 2) / (L / 2)`).
  """
  g = jnp.asarray(g)
  valid = jnp.ones(g.shape[:-1], bool) if valid is None else jnp.asarray(valid, bool)
  lam = jnp.asarray(lam, g.dtype)
  tiny = jnp.finfo(g.dtype).tiny
  return jnp.maximum(power_lmax(g, valid=valid, iterations=power_iterations) + _ridge_max(lam, valid), tiny)


def nnls_ridge_pg(
  g: Array, b: Array, *, lam: ArrayLike, iterations: int, valid: Array | None = None, power_iterations: int = 20
) -> Array:
  r"""Non-negative ridge regression by projected gradient, on the normal equations.

  Definition (with :math:`G = C C^\top`, :math:`b = C z`, :math:`\Lambda = \mathrm{diag}(\lambda_1..\lambda_P)`):
    .. math::
      f(a) = \|z - C^\top a\|^2 + \sum_i \lambda_i a_i^2, \quad \nabla f = 2((G + \Lambda) a - b)

      a_0 = 0, \quad a_{t+1} = \max\!\left(0,\; a_t - \tfrac{1}{L} \nabla f(a_t)\right),
      \quad L = 2(\hat\lambda_{max}(G) + \max_i \lambda_i)

    :math:`L` bounds the Lipschitz constant of :math:`\nabla f` (:func:`ridge_step`); :math:`\hat\lambda_{max}` is
    the Rayleigh quotient after ``power_iterations`` power iterations on :math:`G` from the all-ones vector
    (:func:`power_lmax`; the same rule in :mod:`engram_jax.testing.reference`). A scalar :math:`\lambda` is the
    ridge :math:`\lambda \|a\|^2` of CFS-R; a per-item :math:`\lambda_i` penalises some pool items more than others
    (e.g. older ones: docs/extending.md, "Building on CFS-R").

  Args:
    g: ``[..., P, P]`` PSD Gram of the pool.
    b: ``[..., P]`` pool inner products with the target.
    lam: ridge weight, a scalar or one per pool item ``[..., P]`` (broadcast against ``b``); traced
      (differentiable). A scalar gives the same bits as before per-item ridges existed.
    iterations: number of projected-gradient steps; static.
    valid: ``[..., P]`` real pool entries (others are held at 0).
    power_iterations: static.

  Returns:
    ``[..., P]`` non-negative coefficients after ``iterations`` steps (differentiable in ``lam``,
    ``g`` and ``b`` by unrolled reverse mode).

  Example:
    >>> import jax.numpy as jnp
    >>> from engram_jax import nnls_ridge_pg
    >>> g = jnp.eye(2)  # Gram of two orthonormal pool items
    >>> b = jnp.array([0.5, -0.2])  # their inner products with the target
    >>> print(nnls_ridge_pg(g, b, lam=0.0, iterations=50).round(3))  # the negative one is clipped to 0
    [0.5 0. ]
    >>> ridge = jnp.array([0.0, 1.0])  # a per-item ridge: a_i = b_i / (1 + lam_i) here
    >>> [round(float(x), 4) for x in nnls_ridge_pg(g, jnp.array([1.0, 1.0]), lam=ridge, iterations=50)]
    [1.0, 0.5]
  """

  def one(g, b, valid, lam_):
    g = jnp.where(valid[:, None] & valid[None, :], g, 0.0)
    b = jnp.where(valid, b, 0.0)
    half_l = jnp.maximum(_power_one(g, valid, power_iterations) + _ridge_max(lam_, valid), jnp.finfo(g.dtype).tiny)

    def body(_, a):
      grad_half = g @ a + lam_ * a - b  # = grad / 2
      return jnp.where(valid, jnp.maximum(a - grad_half / half_l, 0.0), 0.0)

    return jax.lax.fori_loop(0, iterations, body, jnp.zeros_like(b))

  g = jnp.asarray(g)
  b = jnp.asarray(b)
  lam = jnp.asarray(lam, g.dtype)
  valid = jnp.ones(b.shape, bool) if valid is None else jnp.asarray(valid, bool)
  per_item = lam.ndim > 0
  batch = jnp.broadcast_shapes(g.shape[:-2], b.shape[:-1], valid.shape[:-1], lam.shape[:-1] if per_item else ())
  p = b.shape[-1]
  if per_item and lam.shape[-1] not in (1, p):
    raise ValueError(f'Shape mismatch: a per-item ridge lam {lam.shape} must end in P = {p} (or be a scalar)')
  g = jnp.broadcast_to(g, batch + (p, p)).reshape((-1, p, p))
  b = jnp.broadcast_to(b, batch + (p,)).reshape((-1, p))
  valid = jnp.broadcast_to(valid, batch + (p,)).reshape((-1, p))
  if per_item:
    lam = jnp.broadcast_to(lam, batch + (p,)).reshape((-1, p))
    return jax.vmap(one)(g, b, valid, lam).reshape(batch + (p,))
  return jax.vmap(one, in_axes=(0, 0, 0, None))(g, b, valid, lam).reshape(batch + (p,))
