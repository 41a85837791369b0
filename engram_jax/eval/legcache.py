"""Each leg computed once per sweep within a process: a bounded cache of legs' hard outputs and of compiled programs.

A sweep over fusion knobs (leg weights, ``k0``) changes none of the legs, and a sweep over one leg's knobs changes
only that leg; yet every job of a multirun used to recompute every leg. :func:`engram_jax.eval.evaluation.evaluate`
given a :class:`LegCache` runs an RRF pipeline as two kinds of jitted programs per stacked episode group:

* one per leg: the leg's scores and its top-``depth`` (indices and whether each is ranked, under the shared tie
  rule), keyed by everything they depend on: the operator, every knob value, the depth, the leg's position and the
  number of legs (its random key is ``split(fold_in(seed, e), L)[position]``), the seed, and a fingerprint of the
  group's padded arrays (their bytes: embeddings, term statistics, masks, labels) and episode indices;
* one for the fusion (:func:`rrf_from_top`, the same arithmetic as :func:`engram_jax.ops.rrf.rrf_fuse`) and the
  final top-k, which is all a fusion-only change recomputes.
* for a staged leg (:class:`engram_jax.ops.registry.Stages`, e.g. CFS-R), its first part (CFS-R's cosine pools and
  their Grams) is stored per group and per value of the static knobs it reads, so that a sweep over the other knobs
  (CFS-R's ``lam`` and ``w``) runs only the second part (the solve).

A one-leg pipeline (``fusion='none'``) is cached whole, by its structure, traced knob values, ``k``, seed and
group. The padded arrays of a dataset are cached too (by the episodes' content, the embeddings' bytes and the build
options), and the jitted programs by their structure, so a job of a multirun in the same process neither rebuilds
nor retraces them. Entries are evicted least recently used beyond ``max_bytes``; :meth:`LegCache.report` counts
hits, misses, bytes and evictions. Results equal an uncached run's bit for bit (tested; the evaluation's per-question
results do not depend on what was cached).
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from engram_jax.core import ranking


class LegCache:
  """A bounded LRU store of arrays (legs' top-D, one-leg pipelines' top-k, padded episode arrays) and an unbounded
  store of jitted programs (small: one per structure), with counters."""

  def __init__(self, max_bytes: int = 2 << 30):
    if max_bytes < 0:
      raise ValueError(f'max_bytes must be >= 0, got {max_bytes}')
    self.max_bytes = int(max_bytes)
    self._data: collections.OrderedDict[Hashable, tuple[Any, int]] = collections.OrderedDict()
    self._programs: dict[Hashable, Callable] = {}
    self._by_object: dict[tuple[str, int], tuple[Any, Any, tuple]] = {}
    self.bytes = 0
    self.counts: collections.Counter = collections.Counter()
    self._lock = threading.RLock()

  def get(self, kind: str, key: Hashable, make: Callable[[], Any]) -> Any:
    """The cached value of ``(kind, key)``, or ``make()`` stored (when it fits) and returned. Thread-safe (the folds
    of a parallel cross-fit share a cache); ``make`` runs outside the lock, so two threads may both make a value
    that neither had (the same value: the cache's keys determine it)."""
    full = (kind, key)
    with self._lock:
      if full in self._data:
        self._data.move_to_end(full)
        self.counts[f'{kind}_hits'] += 1
        return self._data[full][0]
      self.counts[f'{kind}_misses'] += 1
    value = make()
    size = _nbytes(value)
    with self._lock:
      if size <= self.max_bytes and full not in self._data:
        self._data[full] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
          _, (_, s) = self._data.popitem(last=False)
          self.bytes -= s
          self.counts['evictions'] += 1
    return value

  def of_object(self, kind: str, obj: Any, make: Callable[[], Any]) -> Any:
    """``make()`` memoised on the identity of ``obj`` (e.g. a fingerprint of a process-memoised dataset, taken once
    instead of once per job). ``obj`` itself is held beside the value, so its id cannot be reused by another object
    while the entry lives, and so are its members' ids (a list refilled in place misses); the objects must not be
    mutated in place otherwise (as with the arrays JAX is given). A few entries per process (one per dataset and
    embedder), not counted in ``max_bytes`` (their values are hashes)."""
    key = (kind, id(obj))
    members = tuple(map(id, obj)) if isinstance(obj, (list, tuple)) else ()  # a list refilled in place is another
    with self._lock:
      held = self._by_object.get(key)
      if held is not None and held[0] is obj and held[2] == members:
        self.counts[f'{kind}_hits'] += 1
        return held[1]
      self.counts[f'{kind}_misses'] += 1
    value = make()
    with self._lock:
      self._by_object[key] = (obj, value, members)
    return value

  def program(self, key: Hashable, make: Callable[[], Callable]) -> Callable:
    """A jitted program by its structure key (kept for the process: a later job does not retrace)."""
    with self._lock:
      if key not in self._programs:
        self._programs[key] = make()
      return self._programs[key]

  def report(self) -> dict[str, Any]:
    return {
      'entries': len(self._data),
      'bytes': self.bytes,
      'max_bytes': self.max_bytes,
      'programs': len(self._programs),
      **dict(sorted(self.counts.items())),
    }


def _nbytes(value: Any) -> int:
  return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(value)))


def fingerprint(*trees: Any) -> str:
  """sha256 of every leaf of ``trees`` (shape, dtype and bytes, in tree order) and of the tree structures."""
  h = hashlib.sha256()
  for tree in trees:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    h.update(str(treedef).encode())
    for leaf in leaves:
      a = np.ascontiguousarray(np.asarray(leaf))
      h.update(f'{a.shape}{a.dtype}'.encode())
      h.update(a.tobytes())
  return h.hexdigest()


def rrf_from_top(
  idx: Sequence[Array], ranked: Sequence[Array], *, weights: Array, k0: Array, where: Array, n: int
) -> Array:
  """:func:`engram_jax.ops.rrf.rrf_fuse` from each leg's top-D: ``idx[l] [..., D_l]`` item indices and
  ``ranked[l] [..., D_l]`` (False where the leg ranked fewer real items than ``D_l``), ``weights [L]``, ``where
  [N]`` or ``[..., N]``. The same operations in the same order as ``rrf_fuse``, so the same floats."""
  dtype = jnp.float32
  weights = jnp.broadcast_to(jnp.asarray(weights, dtype), (len(idx),))
  batch = idx[0].shape[:-1]
  real = jnp.broadcast_to(where, batch + (n,))
  real2 = real.reshape(-1, n)
  rows = jnp.arange(real2.shape[0])[:, None]
  fused = jnp.zeros(real2.shape, dtype)
  for l, (i, r) in enumerate(zip(idx, ranked)):
    d = i.shape[-1]
    contrib = jnp.where(r.reshape(-1, d), weights[l] / (k0 + jnp.arange(1, d + 1, dtype=dtype)), 0.0)
    fused = fused.at[rows, i.reshape(-1, d)].add(contrib)
  fused = fused.reshape(batch + (n,))
  return jnp.where(real, fused, -jnp.inf)


def leg_top(scores: Array, where: Array, depth: int) -> tuple[Array, Array]:
  """A leg's top-``depth`` as RRF reads it: ``(indices [..., d], ranked [..., d])`` with ``d = min(depth, N)``
  (``rrf_fuse``'s ``ranking.top_k(s, k=d, where=real & isfinite(s))``)."""
  n = scores.shape[-1]
  d = min(int(depth), n)
  real = jnp.broadcast_to(where, scores.shape)
  i, vals = ranking.top_k(scores, k=d, where=real & jnp.isfinite(scores))
  return i, jnp.isfinite(vals)
