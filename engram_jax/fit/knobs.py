"""Fitted knobs: unconstrained values and the transforms that map them to their constrained values.

``log`` for positive scales (k1, lambda, sigma, beta, k0), ``logit`` for [0, 1] weights (b, w, MMR lambda),
``softplus`` for fusion weights, ``identity`` for signed weights (Tide's recency). Each operator's declaration
(:class:`engram_jax.ops.registry.Knob`) names the transform of each fittable knob.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array

FORWARD: dict[str, Callable[[Array], Array]] = {
  'softplus': jax.nn.softplus,
  'log': jnp.exp,
  'logit': jax.nn.sigmoid,
  'identity': lambda x: x,
}


def inverse(kind: str, value: float) -> float:
  """The unconstrained value whose :data:`FORWARD` image is ``value`` (clipped into the transform's range)."""
  if kind == 'softplus':
    value = max(value, 1e-6)
    return float(value + np.log(-np.expm1(-value)))
  if kind == 'log':
    return float(np.log(max(value, 1e-12)))
  if kind == 'logit':
    v = min(max(value, 1e-4), 1 - 1e-4)
    return float(np.log(v) - np.log1p(-v))
  if kind == 'identity':
    return float(value)
  raise ValueError(f'unknown transform {kind!r}; known: {sorted(FORWARD)}')


@struct.dataclass
class Knobs:
  """The fitted knobs: unconstrained values (traced) and how each maps to its constrained value (static)."""

  raw: dict[str, Array]
  transforms: tuple[tuple[str, str], ...] = struct.field(pytree_node=False)

  def values(self) -> dict[str, Array]:
    """Constrained values by config path."""
    kinds = dict(self.transforms)
    return {p: FORWARD[kinds[p]](v) for p, v in self.raw.items()}
