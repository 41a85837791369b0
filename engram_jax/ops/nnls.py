"""Non-negative ridge regression by projected gradient: the CFS-R solve (:mod:`engram_jax.ops.cfsr`), on its own so
that the implicit-gradient wrapper (:mod:`engram_jax.ops.nnls_implicit`) and CFS-R both build on it without an import
circle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike


def _power_lmax(g: Array, valid: Array, iterations: int) -> Array:
  """Largest eigenvalue of the PSD pool Gram by power iteration from the (valid) all-ones vector.

  Returns the Rayleigh quotient :math:`v^\\top G v` of the last unit iterate, a lower bound that
  converges to :math:`\\lambda_{max}` (0 for an empty or all-zero pool).
  """
  v0 = valid.astype(g.dtype)
  tiny = jnp.finfo(g.dtype).tiny

  def body(_, v):
    v = g @ v
    return v / jnp.maximum(jnp.linalg.norm(v), tiny)

  v = jax.lax.fori_loop(0, iterations, body, v0 / jnp.maximum(jnp.linalg.norm(v0), tiny))
  return v @ (g @ v)


def nnls_ridge_pg(
  g: Array, b: Array, *, lam: ArrayLike, iterations: int, valid: Array | None = None, power_iterations: int = 20
) -> Array:
  r"""Non-negative ridge regression by projected gradient, on the normal equations.

  Definition (with :math:`G = C C^\top`, :math:`b = C z`):
    .. math::
      f(a) = \|z - C^\top a\|^2 + \lambda\|a\|^2, \quad \nabla f = 2((G + \lambda I) a - b)

      a_0 = 0, \quad a_{t+1} = \max\!\left(0,\; a_t - \tfrac{1}{L} \nabla f(a_t)\right),
      \quad L = 2(\hat\lambda_{max}(G) + \lambda)

    :math:`L` is the Lipschitz constant of :math:`\nabla f`; :math:`\hat\lambda_{max}` is the Rayleigh
    quotient after ``power_iterations`` power iterations on :math:`G` from the all-ones vector (the
    same rule in :mod:`engram_jax.testing.reference`). It converges to :math:`\lambda_{max}` from below; the
    iteration stays convergent for any estimate above :math:`\lambda_{max}/2` (step < 2/L).

  Args:
    g: ``[..., P, P]`` PSD Gram of the pool.
    b: ``[..., P]`` pool inner products with the target.
    lam: ridge weight; traced (differentiable).
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
  """

  def one(g, b, valid):
    lam_ = jnp.asarray(lam, g.dtype)
    g = jnp.where(valid[:, None] & valid[None, :], g, 0.0)
    b = jnp.where(valid, b, 0.0)
    half_l = jnp.maximum(_power_lmax(g, valid, power_iterations) + lam_, jnp.finfo(g.dtype).tiny)

    def body(_, a):
      grad_half = g @ a + lam_ * a - b  # = grad / 2
      return jnp.where(valid, jnp.maximum(a - grad_half / half_l, 0.0), 0.0)

    return jax.lax.fori_loop(0, iterations, body, jnp.zeros_like(b))

  g = jnp.asarray(g)
  b = jnp.asarray(b)
  valid = jnp.ones(b.shape, bool) if valid is None else jnp.asarray(valid, bool)
  batch = jnp.broadcast_shapes(g.shape[:-2], b.shape[:-1], valid.shape[:-1])
  p = b.shape[-1]
  g = jnp.broadcast_to(g, batch + (p, p)).reshape((-1, p, p))
  b = jnp.broadcast_to(b, batch + (p,)).reshape((-1, p))
  valid = jnp.broadcast_to(valid, batch + (p,)).reshape((-1, p))
  return jax.vmap(one)(g, b, valid).reshape(batch + (p,))
