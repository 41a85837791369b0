"""Episode-axis parallelism: the episodes of a stacked group split over devices, one block per device.

A stacked group (:func:`engram_jax.core.batch.stack_arrays`) has a leading episode axis ``E``. On ``n`` devices
:func:`split_run` pads the axis to a multiple of ``n`` (:func:`pad_episodes`, repeating the last episode; the copies'
results are dropped), cuts it into ``n`` equal contiguous blocks, commits block ``i`` to device ``i`` and calls the
same jitted per-episode map on each block: JAX dispatches the calls asynchronously, so the devices (on CPU, the
cores: ``jax_num_cpu_devices``) compute their blocks at the same time. Every device runs the program that one device
runs, on fewer episodes, so each episode's result is the one-device result bit for bit (tests/eval/test_sharding.py,
with exact score ties that a ``shard_map`` program broke differently: XLA compiled its dot products apart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np

T = TypeVar('T')


def n_devices(devices: int | None) -> int:
  """The number of devices to split over: ``devices`` (``None``: every available one).

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
      f'(on CPU, eval.cpu_devices or XLA_FLAGS=--xla_force_host_platform_device_count={devices} gives more)'
    )
  return int(devices)


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


@dataclasses.dataclass(frozen=True)
class Blocks:
  """An episode-axis tree held as :func:`split_run` left it: ``parts[i]`` on device ``i`` (each ``E_pad / n``
  episodes), ``size`` the real ``E``. Passed back to :func:`split_run` as an episode argument on the same devices,
  it is used where it lies (no copy through the host)."""

  parts: tuple[Any, ...]
  size: int

  def gather(self) -> Any:
    """The tree ``[E, ...]`` on the host (NumPy), padding dropped."""
    return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs])[: self.size], *self.parts)


jax.tree_util.register_dataclass(Blocks, data_fields=['parts'], meta_fields=['size'])


def split_run(
  fn: Callable[..., Any],
  args: Sequence[Any],
  *,
  episode_args: Sequence[bool],
  devices: Sequence[Any],
  gather: bool = True,
) -> Any:
  """``fn(*args)`` with the episode axis split over ``devices``.

  Args:
    fn: a jitted function that maps over the leading (episode) axis of its episode arguments, each episode on its own
      (``lax.map``), and returns a tree with that leading axis.
    args: its arguments; argument ``i`` is split on its leading axis ``E`` when ``episode_args[i]`` (NumPy or JAX
      arrays, or :class:`Blocks` from an earlier call on the same devices), else given whole to every device.
    devices: where to run; with one device (or one episode) this is ``fn(*args)``, untouched.
    gather: return the result on the host, ``[E, ...]`` NumPy; else as :class:`Blocks`.

  Returns:
    ``fn``'s result ``[E, ...]``, equal bit for bit to ``fn(*args)`` on one device.
  """
  sizes = {
    a.size if isinstance(a, Blocks) else int(jax.tree_util.tree_leaves(a)[0].shape[0])
    for a, s in zip(args, episode_args)
    if s
  }
  if len(sizes) != 1:
    raise ValueError(f'split_run: the episode arguments disagree on their leading axis: {sorted(sizes)}')
  (size,) = sizes
  n = min(len(devices), size)
  if n <= 1 and not any(isinstance(a, Blocks) for a in args):
    return fn(*args)
  devices = list(devices)[:n]
  per = padded_size(size, n) // n

  def block(a, split: bool, i: int):
    if not split:
      return jax.device_put(a, devices[i])
    if isinstance(a, Blocks):
      if len(a.parts) != n:
        raise ValueError(f'split_run: Blocks over {len(a.parts)} devices given to a run over {n}')
      return a.parts[i]
    return jax.device_put(
      jax.tree_util.tree_map(lambda x: np.asarray(x)[i * per : (i + 1) * per], padded[id(a)]), devices[i]
    )

  padded = {id(a): pad_episodes(a, n) for a, s in zip(args, episode_args) if s and not isinstance(a, Blocks)}
  parts = tuple(fn(*[block(a, s, i) for a, s in zip(args, episode_args)]) for i in range(n))
  out = Blocks(parts, size)
  return out.gather() if gather else out
