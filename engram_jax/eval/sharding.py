"""Episode-axis sharding: a 1-D device mesh over the episodes of a stacked group.

A stacked group (:func:`engram_jax.core.batch.stack_arrays`) has a leading episode axis ``E``. On ``n`` devices the axis
is padded to a multiple of ``n`` (:func:`pad_episodes`, repeating the last episode; the copies' results are dropped),
placed with ``NamedSharding(mesh, P('episodes'))`` (:func:`place_episodes`), and a per-episode map runs under
``shard_map`` (:func:`shard_episodes`): each device maps over its own ``E / n`` episodes only; everything that has no
episode axis (keys, knob values) is replicated. Each episode's computation is the same program on any device count,
so per-question results do not depend on it (tests/eval/test_sharding.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = 'episodes'
T = TypeVar('T')


def n_devices(devices: int | None) -> int:
  """The number of devices to shard over: ``devices`` (``None``: every available one).

  Raises:
    ValueError: if ``devices`` is below 1 or exceeds ``jax.device_count()``.
  """
  available = jax.device_count()
  if devices is None:
    return available
  if int(devices) != devices or devices < 1:
    raise ValueError(f'devices must be an integer >= 1 or None (all), got {devices!r}')
  if devices > available:
    raise ValueError(
      f'devices={devices} but only {available} {jax.default_backend()} device(s) are available '
      f'(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count={devices} fakes more)'
    )
  return int(devices)


def episode_mesh(devices: int | None = None) -> Mesh:
  """A 1-D mesh named ``'episodes'`` over the first ``n_devices(devices)`` devices (one device: the trivial mesh)."""
  return Mesh(np.asarray(jax.devices()[: n_devices(devices)]), (AXIS,))


def padded_size(n: int, multiple: int) -> int:
  """The smallest multiple of ``multiple`` that is ``>= n`` (``n >= 1``)."""
  return -(-n // multiple) * multiple


def pad_episodes(tree: T, multiple: int) -> T:
  """Every leaf ``[E, ...]`` of ``tree`` padded on its leading axis to :func:`padded_size` ``(E, multiple)`` rows by
  repeating its last row (a real episode, so the padding runs the same program on valid inputs; callers keep the
  first ``E`` results only). NumPy in, NumPy out; unchanged when ``E`` is already a multiple."""

  def pad(x):
    x = np.asarray(x)
    extra = padded_size(x.shape[0], multiple) - x.shape[0]
    return x if extra == 0 else np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])

  return jax.tree_util.tree_map(pad, tree)


def place_episodes(tree: T, mesh: Mesh) -> T:
  """``tree``'s leaves ``[E, ...]`` on ``mesh``, split on the leading (episode) axis, the other axes whole.
  ``E`` must be a multiple of the mesh size (:func:`pad_episodes`)."""
  return jax.device_put(tree, NamedSharding(mesh, P(AXIS)))


def shard_episodes(fn: Callable[..., Any], mesh: Mesh, *, episode_args: Sequence[bool]) -> Callable[..., Any]:
  """``fn`` jitted and run under ``shard_map`` on ``mesh``: positional argument ``i`` is split on its leading axis
  when ``episode_args[i]``, else replicated; the output is split on its leading axis.

  ``fn`` sees one device's block (``E / n`` episodes) and must map over it episode by episode (``lax.map``), so a
  device computes its own episodes only.
  """
  in_specs = tuple(P(AXIS) if split else P() for split in episode_args)
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=P(AXIS), check_vma=False))
