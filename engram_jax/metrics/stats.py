"""Intervals and paired tests, batched and seeded explicitly.

The percentile bootstrap and the paired sign-flip permutation test are array code: one ``[R, Q]`` draw per call
(uint16 question indices; random bytes for the signs), shared by every row of a ``[M, Q]`` batch, each row reduced
on its own so that its numbers are bit for bit those of a call on it alone. Paired intervals are differences of
the rows' bootstrap replicates (:func:`bootstrap_means`), so a run's overall intervals and its paired deltas come
from one pass (:func:`engram_jax.metrics.report.summarize`). ``scipy.stats`` (``bootstrap``, ``permutation_test``) is the
reference in the tests, not the hot path. Wilson intervals and exact McNemar tests for 0/1 outcomes come from
statsmodels (imported where used: it costs ~1-2 s at start-up).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from engram_jax.core.errors import EngramError


@dataclasses.dataclass(frozen=True)
class Interval:
  mean: float
  lo: float
  hi: float

  def to_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PairedResult:
  delta: float  # mean(a - b)
  lo: float
  hi: float
  p: float
  n: int

  def to_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


def _check(values: np.ndarray) -> np.ndarray:
  values = np.asarray(values, np.float64)
  if values.ndim != 1:
    raise ValueError(f'Shape mismatch: expected [Q], got {values.shape}')
  if not np.all(np.isfinite(values)):
    raise ValueError('non-finite per-question values')
  return values


# Fewest bootstrap / sign-flip resamples accepted: a 95% percentile interval of R replicates rests on its 0.025 R
# most extreme ones in each tail, and a permutation p-value cannot fall below 2 / (R + 1); with a handful of
# resamples the "interval" can exclude its own estimate (1 resample: [x, x] around another mean, p 1).
MIN_RESAMPLES = 100


def check_resamples(n_resamples: Any, *, where: str = 'n_resamples') -> int:
  """``n_resamples`` as an int; a one-line :class:`EngramError` (a ValueError) naming ``where`` unless it is an
  integer >= :data:`MIN_RESAMPLES`.

  Example:
    >>> from engram_jax.metrics import stats
    >>> stats.check_resamples(2000)
    2000
    >>> try:
    ...   stats.check_resamples(1)
    ... except ValueError as e:
    ...   print(str(e)[:40])
    n_resamples must be an integer >= 100 (b
  """
  if (
    isinstance(n_resamples, (bool, np.bool_))
    or not isinstance(n_resamples, (int, np.integer))
    or n_resamples < MIN_RESAMPLES
  ):
    raise EngramError(
      f'{where} must be an integer >= {MIN_RESAMPLES} (bootstrap and sign-flip resamples: fewer give intervals '
      f'and p-values of a handful of draws), got {n_resamples!r}'
    )
  return int(n_resamples)


CHUNK = 1024  # most resamples drawn and reduced at a time
CHUNK_DRAWS = 1 << 17  # most indices drawn at a time: a step holds CHUNK_DRAWS x ~42 bytes (L2/L3-sized)
LANES = 8  # bootstrap rows reduced together: one gather of a [Q, LANES] float32 table (32 bytes) per drawn index
SIGN_LANES = 4  # sign-flip rows reduced together: one gather of a [256 Q/8, SIGN_LANES] float64 table per byte


def _as_matrix(values: np.ndarray) -> np.ndarray:
  v = np.asarray(values, np.float64)
  if v.ndim == 1:
    v = v[None]
  if v.ndim != 2:
    raise ValueError(f'Shape mismatch: expected [Q] or [M, Q], got {v.shape}')
  if not np.all(np.isfinite(v)):
    raise ValueError('non-finite per-question values')
  return v


def workers() -> int:
  """Threads for independent passes (:func:`run_tasks`): at most 2, since a run's passes are few and uneven (the
  all-question pass is about half of :func:`engram_jax.metrics.report.summarize`'s work)."""
  try:
    n = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    n = os.cpu_count() or 1
  return max(1, min(2, n))


def run_tasks(tasks: Sequence[Callable[[], Any]]) -> list[Any]:
  """Results of independent deterministic ``tasks`` (each seeded on its own), in order, on :func:`workers` threads
  (numpy lets go of the GIL in the passes' gathers and sums); the results do not depend on the scheduling."""
  if workers() == 1 or len(tasks) < 2:
    return [t() for t in tasks]
  with ThreadPoolExecutor(max_workers=workers()) as pool:
    return [f.result() for f in [pool.submit(t) for t in tasks]]


def chunk_size(q: int) -> int:
  """Resamples drawn per generator call for ``Q`` questions (a function of ``Q`` alone: part of the stream)."""
  return max(1, min(CHUNK, CHUNK_DRAWS // max(q, 1)))


def index_dtype(q: int) -> type[np.unsignedinteger]:
  """Smallest unsigned dtype that holds the indices ``[0, Q)`` (the draw's cost scales with its width)."""
  return np.uint16 if q <= 1 << 16 else np.uint32


def _tables(dev: np.ndarray) -> list[tuple[slice, np.ndarray]]:
  """``dev [M, Q]`` as ``[Q, W]`` float32 tables of up to ``W = min(LANES, M)`` rows each (zero-padded lanes).
  The width changes no number (each lane is summed on its own, in question order), only the bytes gathered: a
  2-metric run gathers 8 bytes per drawn index instead of 32."""
  m, q = dev.shape
  width = max(1, min(LANES, m))
  out = []
  for start in range(0, m, width):
    rows = slice(start, min(start + width, m))
    table = np.zeros((q, width), np.float32)
    table[:, : rows.stop - start] = dev[rows].T
    out.append((rows, table))
  return out


class _DrawCache:
  """Bootstrap index draws by ``(seed, Q, R)``, least recently used out beyond ``max_bytes``: the jobs of a sweep
  in one process (and the categories of one run) draw the same indices again and again, and drawing them is ~3/4 of
  a bootstrap pass."""

  def __init__(self, max_bytes: int):
    self.max_bytes, self.bytes = max_bytes, 0
    self.store: dict[tuple[int, int, int], tuple[np.ndarray, ...]] = {}

  def get(self, key: tuple[int, int, int], make) -> tuple[np.ndarray, ...]:
    if key in self.store:
      self.store[key] = self.store.pop(key)  # most recent last
      return self.store[key]
    value = make()
    size = sum(a.nbytes for a in value)
    if size <= self.max_bytes:
      while self.store and self.bytes + size > self.max_bytes:
        self.bytes -= sum(a.nbytes for a in self.store.pop(next(iter(self.store))))
      self.store[key] = value
      self.bytes += size
    return value


@functools.cache
def _draw_cache() -> _DrawCache:
  return _DrawCache(128 << 20)  # LoCoMo's 1,982 questions x 10,000 resamples: 40 MB (uint16), its categories 40 MB


def bootstrap_draws(seed: int, q: int, n_resamples: int) -> tuple[np.ndarray, ...]:
  """The index blocks of :func:`bootstrap_means`: ``rng = default_rng(seed)``, then per block of ``c =``
  :func:`chunk_size` ``(q)`` resamples (the last shorter) ``rng.integers(0, q, size=(q, c), dtype=index_dtype(q))``.
  Cached in the process by ``(seed, q, n_resamples)`` (read-only arrays, at most 128 MB in all)."""
  n_resamples = check_resamples(n_resamples)

  def make() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    c, dtype = chunk_size(q), index_dtype(q)
    out = []
    for start in range(0, n_resamples, c):
      a = rng.integers(0, q, size=(q, min(c, n_resamples - start)), dtype=dtype)
      a.flags.writeable = False
      out.append(a)
    return tuple(out)

  return _draw_cache().get((int(seed), int(q), int(n_resamples)), make)


def bootstrap_means(values: np.ndarray, *, seed: int, n_resamples: int = 10_000) -> np.ndarray:
  """Bootstrap replicates of the mean of each row of ``values [M, Q]``: ``[M, R]`` (NaN where ``Q == 0``).

  The draw: ``rng = numpy.random.default_rng(seed)``; for each successive block of ``c =`` :func:`chunk_size`
  ``(Q)`` resamples (the last one shorter), ``idx = rng.integers(0, Q, size=(Q, c), dtype=index_dtype(Q))``, column
  ``j`` being the question indices of one resample. It is shared by every row, so a row's replicates depend only
  on ``(seed, Q, R)`` and its values: bit for bit the same whether it is bootstrapped alone or in a batch (the
  paired-difference replicates of :func:`paired_tests` are differences of these). Each step gathers, per drawn
  index, one row of a ``[Q, min(LANES, M)]`` float32 table of deviations from a central value of each row (its value nearest
  its mean) and sums over the questions, each lane on its own in question order: replicate = center + sum / Q,
  accurate to ~1e-7 of the values' spread (exact sums for values on a coarse binary grid, e.g. 0, 1/2, 1).
  """
  n_resamples = check_resamples(n_resamples)
  v = _as_matrix(values)
  m, q = v.shape
  if q == 0 or m == 0:
    return np.full((m, n_resamples), np.nan)
  # deviations from the row's value nearest its mean: small (float32 keeps ~1e-7 of the spread) and exact for
  # values on a coarse binary grid (0, 1/2, 1, ...), whose replicates then come out as in float64
  centers = v[np.arange(m), np.argmin(np.abs(v - v.mean(axis=1, keepdims=True)), axis=1)]
  tables = _tables(v - centers[:, None])
  c = chunk_size(q)
  sums = np.empty((m, n_resamples), np.float64)
  gathered: dict[int, np.ndarray] = {}  # reused buffers (fresh pages cost more than the gather)
  for start, idx in zip(range(0, n_resamples, c), bootstrap_draws(seed, q, n_resamples)):
    r = idx.shape[1]
    g = gathered.get(r)
    if g is None:
      g = gathered[r] = np.empty((q, r, tables[0][1].shape[1]), np.float32)
    for rows, table in tables:
      np.take(table, idx, axis=0, out=g, mode='clip')  # indices are in range: 'clip' skips the check
      s = np.add.reduce(g, axis=0)  # [r, W]: sum over the questions
      sums[rows, start : start + r] = s[:, : rows.stop - rows.start].T
  return centers[:, None] + sums / q


def percentile_intervals(values: np.ndarray, replicates: np.ndarray, *, confidence: float = 0.95) -> list[Interval]:
  """Means of the rows of ``values [M, Q]`` with percentile intervals of their bootstrap ``replicates [M, R]``.

  A constant row (or ``Q == 1``) gets the degenerate interval ``[mean, mean]``; ``Q == 0`` gives NaNs.
  """
  v = _as_matrix(values)
  if v.shape[1] == 0:
    return [Interval(float('nan'), float('nan'), float('nan')) for _ in range(v.shape[0])]
  reps = np.asarray(replicates, np.float64)
  if reps.ndim != 2 or reps.shape[0] != v.shape[0]:
    raise ValueError(f'Shape mismatch: replicates {reps.shape} for values {v.shape}')
  means = v.mean(axis=1)
  alpha = (1 - confidence) / 2
  lo, hi = np.percentile(reps, [100 * alpha, 100 * (1 - alpha)], axis=1)
  constant = np.all(v == v[:, :1], axis=1)
  return [
    Interval(float(mu), float(mu), float(mu)) if c else Interval(float(mu), float(a), float(b))
    for mu, a, b, c in zip(means, lo, hi, constant)
  ]


def bootstrap_cis(
  values: np.ndarray, *, seed: int, n_resamples: int = 10_000, confidence: float = 0.95
) -> list[Interval]:
  """Means of the rows of ``values [M, Q]`` with percentile bootstrap intervals, all from one shared draw
  (:func:`bootstrap_means`, :func:`percentile_intervals`).

  Agrees with ``scipy.stats.bootstrap(..., method='percentile')`` within Monte-Carlo error (checked in the tests).
  """
  v = _as_matrix(values)
  return percentile_intervals(v, bootstrap_means(v, seed=seed, n_resamples=n_resamples), confidence=confidence)


def bootstrap_ci(values: np.ndarray, *, seed: int, n_resamples: int = 10_000, confidence: float = 0.95) -> Interval:
  """Mean of ``values [Q]`` with a percentile bootstrap interval (:func:`bootstrap_cis` of one row).

  Example:
    >>> import numpy as np
    >>> from engram_jax.metrics import bootstrap_ci
    >>> ci = bootstrap_ci(np.array([0.0, 1.0] * 50), seed=0, n_resamples=2000)
    >>> ci.mean, ci.lo < 0.5 < ci.hi
    (0.5, True)
  """
  return bootstrap_cis(_check(values)[None], seed=seed, n_resamples=n_resamples, confidence=confidence)[0]


def sign_table(d: np.ndarray) -> np.ndarray:
  """``[ceil(Q/8) * 256, P]`` float64: row ``256 b + v`` is ``sum_j (+-1) d[:, 8 b + j]``, sign + where bit ``j`` of
  the byte ``v`` is set (``d [P, Q]``; questions past ``Q`` count zero). Elementwise, each lane on its own."""
  p_rows, q = d.shape
  nb = -(-q // 8)
  bits = np.zeros((p_rows, nb * 8))
  bits[:, :q] = d
  bits = bits.reshape(p_rows, nb, 2, 4)  # [P, byte, nibble (low, high), bit]
  signs = ((np.arange(16)[:, None] >> np.arange(4)) & 1) * 2.0 - 1.0  # [16 nibble values, 4 bits]
  half = bits[..., 0, None] * signs[:, 0]
  for j in range(1, 4):
    half = half + bits[..., j, None] * signs[:, j]  # [P, byte, nibble, 16]
  table = half[:, :, 1, :, None] + half[:, :, 0, None, :]  # [P, byte, high, low]: v = 16 high + low
  return np.ascontiguousarray(table.reshape(p_rows, nb * 256).T)


def sign_flip_pvalues(diffs: np.ndarray, *, seed: int, n_resamples: int = 10_000) -> np.ndarray:
  """Two-sided paired sign-flip permutation p-values of ``mean(d) = 0`` for each row of ``diffs [P, Q]``: ``[P]``.

  The null distribution flips the sign of each question's difference with probability 1/2, from one shared draw
  of random bytes: ``rng = default_rng(seed)``; for each successive block of ``c =`` :func:`chunk_size`
  ``(ceil(Q/8))`` resamples, ``rng.integers(0, 256, size=(ceil(Q/8), c), dtype=uint8)``, bit ``j`` of byte ``b``
  of column ``i`` giving question ``8 b + j`` of one resample a + sign when set. The null sums are table lookups
  (:func:`sign_table`: one gather per byte, float64, each lane on its own, so a row's p-value is the same alone or
  in a batch). ``p = min(1, 2 min(P(T >= t), P(T <= t)))`` with the observed statistic counted once in each tail
  (``(count + 1) / (R + 1)``), as ``scipy.stats.permutation_test`` does for random permutations. A row of zeros
  (or ``Q == 0``) gets p = 1.
  """
  n_resamples = check_resamples(n_resamples)
  d = _as_matrix(diffs)
  p_rows, q = d.shape
  if q == 0 or p_rows == 0:
    return np.ones(p_rows)
  observed = d.mean(axis=1)
  nb = -(-q // 8)
  padded = np.zeros((-(-p_rows // SIGN_LANES) * SIGN_LANES, q))
  padded[:p_rows] = d
  tables = [
    (slice(s, min(s + SIGN_LANES, p_rows)), sign_table(padded[s : s + SIGN_LANES]))
    for s in range(0, p_rows, SIGN_LANES)
  ]
  offsets = 256 * np.arange(nb, dtype=np.intp)[:, None]
  rng = np.random.default_rng(seed)
  greater = np.zeros(p_rows, np.int64)
  less = np.zeros(p_rows, np.int64)
  tol = 1e-14 * np.maximum(np.abs(observed), 1.0)
  c = chunk_size(nb)
  gathered: dict[int, np.ndarray] = {}  # reused buffers, as in bootstrap_means
  for start in range(0, n_resamples, c):
    r = min(c, n_resamples - start)
    flat = rng.integers(0, 256, size=(nb, r), dtype=np.uint8) + offsets  # [nb, r]: rows of the tables
    g = gathered.get(r)
    if g is None:
      g = gathered[r] = np.empty((nb, r, SIGN_LANES))
    for rows, table in tables:
      np.take(table, flat, axis=0, out=g, mode='clip')
      null = np.add.reduce(g, axis=0)[:, : rows.stop - rows.start] / q  # [r, rows]
      greater[rows] += np.sum(null >= observed[rows] - tol[rows], axis=0)
      less[rows] += np.sum(null <= observed[rows] + tol[rows], axis=0)
  p = np.minimum(1.0, 2.0 * np.minimum((greater + 1) / (n_resamples + 1), (less + 1) / (n_resamples + 1)))
  return np.where(np.all(d == 0, axis=1), 1.0, p)


def paired_results(
  diffs: np.ndarray, replicates: np.ndarray, pvalues: np.ndarray, *, confidence: float = 0.95
) -> list[PairedResult]:
  """Paired comparisons from the differences ``diffs [P, Q]`` (``a - b``), bootstrap replicates of their means
  ``[P, R]`` (e.g. differences of :func:`bootstrap_means` rows of ``a`` and ``b``) and p-values ``[P]``.

  A row of zeros gets ``delta = lo = hi = 0, p = 1``; a constant row ``[delta, delta]``; no questions (``Q == 0``)
  NaN everywhere (an empty set has no difference, not a zero one).
  """
  d = _as_matrix(diffs)
  if d.shape[1] == 0:
    return [PairedResult(*(4 * [float('nan')]), 0) for _ in d]
  cis = percentile_intervals(d, replicates, confidence=confidence)
  return [
    PairedResult(0.0, 0.0, 0.0, 1.0, d.shape[1])
    if np.all(row == 0)
    else PairedResult(ci.mean, ci.lo, ci.hi, float(p), d.shape[1])
    for row, ci, p in zip(d, cis, np.asarray(pvalues, np.float64))
  ]


def paired_tests(
  a: np.ndarray, b: np.ndarray, *, seed: int, n_resamples: int = 10_000, confidence: float = 0.95
) -> list[PairedResult]:
  """Paired comparisons of the rows of ``a [P, Q]`` and ``b [P, Q]`` (same questions), in one batched pass.

  The interval is a percentile bootstrap of ``mean(a - b)`` over questions: replicates ``mean(a[idx]) -
  mean(b[idx])`` of one :func:`bootstrap_means` draw (seed ``seed``), i.e. the differences of the replicates that
  :func:`bootstrap_cis` uses for ``a`` and ``b``; the two-sided p-value is a paired sign-flip permutation test
  (:func:`sign_flip_pvalues`, seed ``seed + 1``).
  """
  a, b = _as_matrix(a), _as_matrix(b)
  if a.shape != b.shape:
    raise ValueError(f'Shape mismatch: paired arrays {a.shape} vs {b.shape}')
  reps = bootstrap_means(np.concatenate([a, b]), seed=seed, n_resamples=n_resamples)
  d = a - b
  ps = sign_flip_pvalues(d, seed=seed + 1, n_resamples=n_resamples)
  return paired_results(d, reps[: len(a)] - reps[len(a) :], ps, confidence=confidence)


def paired_test(
  a: np.ndarray, b: np.ndarray, *, seed: int, n_resamples: int = 10_000, confidence: float = 0.95
) -> PairedResult:
  """Paired comparison of two methods on the same questions ``a [Q]``, ``b [Q]`` (:func:`paired_tests` of one
  row).

  Example:
    >>> import numpy as np
    >>> from engram_jax.metrics import paired_test
    >>> a = np.linspace(0, 1, 40)
    >>> r = paired_test(a + 0.1, a, seed=0, n_resamples=2000)  # b is a minus 0.1 on every question
    >>> round(r.delta, 3), r.p < 0.01
    (0.1, True)
  """
  a, b = _check(a), _check(b)
  if a.shape != b.shape:
    raise ValueError(f'Shape mismatch: paired arrays {a.shape} vs {b.shape}')
  return paired_tests(a[None], b[None], seed=seed, n_resamples=n_resamples, confidence=confidence)[0]


def wilson_ci(successes: np.ndarray, *, confidence: float = 0.95) -> Interval:
  """Proportion of 0/1 ``successes [Q]`` with a Wilson interval (statsmodels)."""
  s = _check(successes)
  if not np.all((s == 0) | (s == 1)):
    raise ValueError('wilson_ci expects 0/1 outcomes')
  if len(s) == 0:
    return Interval(float('nan'), float('nan'), float('nan'))
  from statsmodels.stats.proportion import proportion_confint

  lo, hi = proportion_confint(int(s.sum()), len(s), alpha=1 - confidence, method='wilson')
  return Interval(float(s.mean()), float(lo), float(hi))


def mcnemar_test(a: np.ndarray, b: np.ndarray) -> float:
  """Exact McNemar p-value for paired 0/1 outcomes (statsmodels)."""
  a, b = _check(a).astype(bool), _check(b).astype(bool)
  from statsmodels.stats.contingency_tables import mcnemar

  table = [[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]]
  return float(mcnemar(table, exact=True).pvalue)
