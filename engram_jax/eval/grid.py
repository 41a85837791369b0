"""A grid of knob values of one pipeline, evaluated in one process: each leg once per distinct value of its own knobs,
the fusion batched over grid points.

:func:`evaluate_grid` takes a pipeline and ``{knob path: [values]}`` (paths as :func:`engram_jax.eval.pipeline.
split_path` reads them: ``k0``, ``legs.<leg>.weight``, ``legs.<leg>.<knob>``) and scores every point of their
cartesian product on every question:

* **static knobs** (a leg's ``depth``, knobs its operator declares static, non-numeric ones) group the points by
  structure (:func:`engram_jax.eval.pipeline.structure_key`); each group is one base pipeline;
* within a group, an RRF pipeline's **legs** run once per distinct combination of their own traced knobs
  (:func:`engram_jax.eval.evaluation.leg_top_d`, the same programs and keys as a cached :func:`evaluate` run; a
  staged leg's first part once per group);
* the **fusion** (leg weights, ``k0``, and which value of each leg's knobs) is one jitted program ``vmap``-ped over
  ``chunk`` points at a time, over each question's candidates only (the items some leg ranks and the last ``k``
  that none ranks: ``M = sum(depths) + k`` instead of ``N``; the same floats and tie rule), so memory stays at
  about ``chunk`` x ``[E, Q, M]`` float32 whatever the grid's size (:attr:`GridResult.info` reports it), and the
  point axis can be split over devices (``devices``);
* a combination of leg values that at most :data:`FUSE_ALONE` points take (a tune over one leg's knob: every point)
  is fused point by point as ``evaluate`` fuses it, without the candidates;
* a one-leg pipeline (``fusion='none'``) runs whole once per point (its knobs are all the leg's own).

Label metrics are computed on the host in float64 for a chunk of points at once (from the gains at the top-k); a
dataset's own metrics (``episode_metrics``, e.g. FactConsolidation's ``answer@k``: ``fn(episode, question, ranked
indices, k)``) are read from each chunk's top-k too, called once per question and distinct top-k list over the whole
grid (:func:`episode_metric_scores`), never through one ``evaluate`` per point. So every point's per-question scores
and top-k equal a separate :func:`engram_jax.eval.evaluation.evaluate` run at those values (tested).
:func:`rank_points` ranks the points with 95% intervals and the paired plateau against the best.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core.batch import EpisodeArrays, episode_arrays, stack_arrays, stack_groups
from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode
from engram_jax.eval import legcache, sharding
from engram_jax.eval.evaluation import EpisodeMetric, leg_top_d, stacked_fusion, stacked_topk
from engram_jax.eval.legcache import LegCache
from engram_jax.eval.pipeline import Pipeline, build_options, knob_value, split_path, traced_values, with_values
from engram_jax.eval.timing import RunTimer
from engram_jax.metrics import labels as metrics_lib
from engram_jax.metrics import stats


@dataclasses.dataclass
class GridResult:
  """Per-point, per-question scores of a grid (point ``p``, question ``q`` in the questions' order).

  Attributes:
    pipeline: the pipeline's name.
    paths: the swept knob paths, in the grid's order.
    points: path -> ``[P]`` the (canonical) value of that knob at each point; the last path varies fastest.
    question_ids, episode_ids, categories: ``[Q]``, as in :class:`engram_jax.eval.evaluation.EvalResult`.
    scores: metric -> ``[P, Q]`` float64.
    retrieved: point -> per-question top-k item ids, for the points asked for (``keep_topk``).
    k: the ranking depth.
    info: structures, legs computed, fusion chunk and its memory, times.

  Example:
    >>> import numpy as np
    >>> from engram_jax import Episode, Item, Question, evaluate_grid, make_pipeline
    >>> items = tuple(Item(f'i{j}', t, 'S1', j) for j, t in enumerate(['dog adopted', 'invoice overdue', 'hike']))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('i0',), ('S1',), 1),))
    >>> emb = (np.eye(3, 8, dtype=np.float32), np.eye(1, 8, dtype=np.float32))
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, fusion='rrf')
    >>> res = evaluate_grid([ep], [emb], pipe, {'k0': [1, 60]}, k=2, metrics=['recall@2'], seed=0)
    >>> res.points['k0'].tolist(), res.scores['recall@2'].tolist()
    ([1.0, 60.0], [[1.0], [1.0]])
  """

  pipeline: str
  paths: list[str]
  points: dict[str, np.ndarray]
  question_ids: list[str]
  episode_ids: list[str]
  categories: list[Any]
  scores: dict[str, np.ndarray]
  retrieved: dict[int, list[list[str]]]
  k: int
  info: dict[str, Any]

  @property
  def n_points(self) -> int:
    return len(next(iter(self.points.values()))) if self.points else 1

  def means(self, metric: str) -> np.ndarray:
    """``[P]`` the mean of ``metric`` over questions at each point."""
    return self.scores[metric].mean(axis=1)

  def point(self, p: int) -> dict[str, Any]:
    """The knob values of point ``p`` (path -> Python value)."""
    return {path: self.points[path][p].item() for path in self.paths}


def flatten_grid(node: Mapping[str, Any], prefix: str = '') -> dict[str, list[Any]]:
  """``{knob path: [values]}`` from a grid written flat (``{'legs.cos.weight': [1, 2]}``) or nested
  (``{legs: {cos: {weight: [1, 2]}}, k0: [20, 60]}``, as Hydra's ``+grid.legs.cos.weight=[1,2]`` builds it); a
  scalar is a one-value axis.

  Raises:
    EngramError: on an empty list of values, or a knob written twice (flat and nested).
  """
  out: dict[str, list[Any]] = {}

  def add(path: str, values: list[Any]) -> None:
    if path in out:
      raise EngramError(f'grid knob {path} is given twice ({out[path]} and {values}); list its values once')
    out[path] = values

  for key, value in node.items():
    path = f'{prefix}{key}'
    if isinstance(value, Mapping):
      for p, v in flatten_grid(value, f'{path}.').items():
        add(p, v)
      continue
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
      raise EngramError(f'grid knob {path}: no values (an empty list gives an empty grid); give at least one')
    add(path, values)
  return out


def n_grid_points(grid: Mapping[str, Sequence[Any]]) -> int:
  """The number of points of ``grid``'s cartesian product (1 for an empty grid), without building them."""
  return int(np.prod([len(v) for v in grid.values()], dtype=object)) if grid else 1


def grid_points(pipe: Pipeline, grid: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
  """Every point of the cartesian product of ``grid`` (path -> values; the last path varies fastest), each value
  canonicalised as the pipeline stores it (``lam=1`` is ``1.0``; validated by :func:`grid_axes`)."""
  canon = grid_axes(pipe, grid)
  rows = list(itertools.product(*canon.values())) if canon else [()]
  return {path: np.asarray([r[i] for r in rows]) for i, path in enumerate(canon)}


def grid_axes(pipe: Pipeline, grid: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
  """Each knob's values of ``grid`` canonicalised as the pipeline stores them (``lam=1`` is ``1.0``), without
  building the points.

  Raises:
    EngramError: a bad path or value (the one-line error of :func:`engram_jax.eval.pipeline.with_values`), a string,
      bool or null for a numeric knob, or a value listed twice (``[20, 20.0]``: the same points scored twice).
  """
  canon: dict[str, list[Any]] = {}
  for path, values in grid.items():
    split_path(pipe, path)
    now = knob_value(pipe, path)
    numeric = isinstance(now, (int, float)) and not isinstance(now, bool)
    canon[path] = []
    for v in values:
      if numeric and (isinstance(v, (str, bool)) or v is None):
        raise EngramError(
          f'grid knob {path}: value {v!r} is not a number (the knob is numeric, {now!r} in pipeline {pipe.name}); '
          'write numbers, e.g. [0.5, 1, 2]'
        )
      try:
        canon[path].append(knob_value(with_values(pipe, {path: v}), path))
      except EngramError:
        raise
      except (TypeError, ValueError) as e:
        raise EngramError(f'grid knob {path}: value {v!r} is not valid ({e})') from None
    seen: dict[str, Any] = {}
    for v, c in zip(values, canon[path]):
      if repr(c) in seen:
        raise EngramError(
          f'grid knob {path} lists {c!r} twice ({seen[repr(c)]!r} and {v!r}): the grid would score the same points '
          'twice; list each value once'
        )
      seen[repr(c)] = v
  return canon


def _is_static(pipe: Pipeline, path: str) -> bool:
  """True when ``path`` sets the structure (a depth, a static or non-numeric knob), so points group by it."""
  return split_path(pipe, path)[1] == 'depth' or path not in traced_values(pipe)


# a combination of leg values taken by at most this many points is fused point by point as evaluate fuses it
# (stacked_fusion over every item): cheaper than gathering its candidates first (a tune grid over one leg's knob has
# one point per combination); the results are the same (test_candidate_fusion_equals_rrf_fusion)
FUSE_ALONE = 2


def _value_array(v: Any) -> np.ndarray:
  return np.asarray(v, np.int32 if isinstance(v, (int, np.integer)) else np.float32)


def grid_candidates(k: int):
  """``(legs' top-D indices [E, Q, D_l], ranked [E, Q, D_l], where [E, N]) -> (candidates [E, Q, M], ranks
  [E, L, Q, M])``, jitted: per question, every item that can reach an RRF top-``k`` whatever the leg weights and
  ``k0`` are: the items any leg ranks, and the last ``k`` real items that no leg ranks (their fused score is 0, and
  among equal scores the later item wins), so ``M = sum(D_l) + k``. Deduplicated and sorted by item index, largest first
  (-1 pads the end); ``ranks[:, l]`` is each candidate's 1-based rank in leg ``l`` (0: not ranked there)."""

  def one(a):
    idx, ranked, wh = a
    q, n = idx[0].shape[0], wh.shape[-1]
    items = jnp.concatenate([jnp.where(r, i, -1) for i, r in zip(idx, ranked)], axis=-1)  # [Q, S]
    rows = jnp.arange(q)[:, None]
    ranked_any = jnp.zeros((q, n + 1), bool).at[rows, jnp.where(items >= 0, items, n)].set(True)[:, :n]
    last, _ = jax.lax.top_k(jnp.where(wh & ~ranked_any, jnp.arange(n), -1), min(n, k))  # [Q, k] unranked, latest
    pool = jnp.concatenate([items, last], axis=-1)  # [Q, M]
    m = pool.shape[-1]
    earlier = jnp.tril(jnp.ones((m, m), bool), -1)  # [j, j']: j' before j
    dup = jnp.any((pool[:, :, None] == pool[:, None, :]) & earlier, axis=-1)
    pool = jnp.where(dup, -1, pool)
    cand = -jnp.sort(-pool, axis=-1)  # largest item index first, -1 last
    ranks = [
      jnp.max(
        jnp.where(
          (cand[:, :, None] == i[:, None, :]) & r[:, None, :] & (cand[:, :, None] >= 0),
          jnp.arange(1, i.shape[-1] + 1, dtype=jnp.int32),
          0,
        ),
        axis=-1,
      )
      for i, r in zip(idx, ranked)
    ]
    return cand, jnp.stack(ranks)

  return jax.jit(lambda idx, ranked, where: jax.lax.map(one, (idx, ranked, where)))


def grid_fusion(k: int):
  """``(candidates [E, Q, M], ranks [E, L, Q, M], weights [B, L], k0 [B]) -> top-k [B, E, Q, k]`` (-1 where
  unranked), ``vmap``-ped over ``B`` points, jitted. The fused score of each candidate is
  :func:`engram_jax.eval.legcache.rrf_from_top`'s, added leg by leg from 0 in the same order (so the same floats),
  and the top-``k`` among candidates sorted by item index, largest first, keeps the shared tie rule (the later
  item first); items outside the candidates score 0 and are never needed (see :func:`grid_candidates`)."""

  def one_point(cand, ranks, w, k0):
    fused = jnp.zeros(cand.shape, jnp.float32)
    for l in range(ranks.shape[1]):
      r = ranks[:, l]
      fused = fused + jnp.where(r > 0, w[l] / (k0 + r.astype(jnp.float32)), 0.0)
    fused = jnp.where(cand >= 0, fused, -jnp.inf)
    vals, pos = jax.lax.top_k(fused, k)
    return jnp.where(jnp.isneginf(vals), -1, jnp.take_along_axis(cand, pos, axis=-1))

  return jax.jit(jax.vmap(one_point, in_axes=(None, None, 0, 0)))


def as_gains(tops: np.ndarray, labels_flat: np.ndarray, n_gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Top-k ``[B, E, Q, k]`` and the flat labels ``[E * Q * N]`` as a label metric's ``(topk, labels)`` of the same
  value, small: ``topk' [B, E, Q, k]`` = the positions ``0..k-1`` (-1 where empty) and ``labels' [B, E, Q, k + G]``
  = the gains at those positions followed by as many gold items as the top-k misses (``G`` = the most gold of a
  question). Every label metric reads only the gains at the top-k and the number of gold items
  (:mod:`engram_jax.metrics.labels`), so the values are the same floats, without gathering from ``[B, E, Q, N]``."""
  b, e, q, k = tops.shape
  n = labels_flat.size // (e * q)
  offsets = (np.arange(e * q, dtype=np.int64) * n).reshape(1, e, q, 1)
  gains = labels_flat[offsets + np.maximum(tops, 0)] & (tops >= 0)  # [B, E, Q, k]
  missed = n_gold[None] - gains.sum(axis=-1)  # [B, E, Q]
  extra = np.arange(max(int(n_gold.max(initial=0)), 1)) < missed[..., None]
  positions = np.where(tops >= 0, np.arange(k, dtype=np.int32), -1)
  return positions, np.concatenate([gains, extra], axis=-1)


def episode_metric_scores(
  fn: EpisodeMetric, episode: Episode, tops: np.ndarray, cut: int, memo: dict[tuple[int, bytes], float] | None = None
) -> np.ndarray:
  """A dataset's own metric (``fn(episode, question, ranked indices, k)``, as :func:`engram_jax.eval.evaluation.
  evaluate` calls it) of ``B`` points at once: ``tops [B, Q, k]`` (the episode's questions, each point's top-k item
  indices) -> ``[B, Q]`` float64. ``fn`` is called once per question and distinct top-k list (points that rank the
  same items for a question share the call; ``memo``, ``(question index, top-k bytes) -> value``, shares them across
  calls: chunks and structures of one grid), with the list as ``evaluate`` passes it, so the values are ``evaluate``'s.

  Example:
    >>> import numpy as np
    >>> from engram_jax import Episode, Item, Question
    >>> ep = Episode('e', tuple(Item(f'i{j}', t, 'S1', j) for j, t in enumerate(['a', 'b'])), (Question('q', '?', ('i1',), ('S1',), 1),))
    >>> calls = []
    >>> def first_is_gold(ep, q, ranked, k):
    ...   calls.append(ranked)
    ...   return float(ep.items[ranked[0]].id in q.gold)
    >>> episode_metric_scores(first_is_gold, ep, np.array([[[1, 0]], [[0, 1]], [[1, 0]]]), 1).tolist(), len(calls)
    ([[1.0], [0.0], [1.0]], 2)
  """
  memo = {} if memo is None else memo
  tops = np.ascontiguousarray(tops, np.int32)
  out = np.empty(tops.shape[:2], np.float64)
  for qi, question in enumerate(episode.questions[: tops.shape[1]]):
    for b in range(tops.shape[0]):
      row = tops[b, qi]
      key = (qi, row.tobytes())
      value = memo.get(key)
      if value is None:
        value = memo[key] = float(np.asarray(fn(episode, question, row.tolist(), cut), np.float64))
      out[b, qi] = value
  return out


def evaluate_grid(
  episodes: Sequence[Episode],
  embeddings: Sequence[tuple[np.ndarray, np.ndarray]],
  pipe: Pipeline,
  grid: Mapping[str, Sequence[Any]],
  *,
  k: int,
  metrics: Sequence[str],
  seed: int,
  episode_metrics: Mapping[str, EpisodeMetric] | None = None,
  chunk: int = 64,
  keep_topk: Sequence[int] = (),
  arrays: Sequence[EpisodeArrays] | None = None,
  max_waste: float = 2.0,
  leg_cache: LegCache | None = None,
  timer: RunTimer | None = None,
  devices: int | None = 1,
) -> GridResult:
  """Score every point of ``grid`` (``{knob path: [values]}``) of ``pipe`` on every question, in one process.

  Args:
    episodes, embeddings: as :func:`engram_jax.eval.evaluation.evaluate` takes them.
    pipe: the base pipeline; knobs not in ``grid`` keep its values.
    grid: knob path -> values (:func:`grid_points`).
    k, metrics, seed: as ``evaluate``; ``metrics`` are label metrics (:data:`engram_jax.metrics.labels.METRICS`) or
      the dataset-owned metrics of ``episode_metrics``.
    episode_metrics: as ``evaluate`` takes them (name -> ``fn(episode, question, ranked indices, k)``, a dataset
      module's ``METRICS``): scored from every point's top-k by :func:`episode_metric_scores`.
    chunk: grid points fused at once (memory: about ``chunk`` x ``[E, Q, M]`` float32 and a few temporaries, ``M``
      = the legs' depths + ``k``; :attr:`GridResult.info` ``fusion_bytes_per_chunk``).
    keep_topk: points whose per-question top-k item ids are kept in ``retrieved``.
    arrays: padded episode arrays when the caller has them (else built here).
    leg_cache: legs' outputs and programs shared with other calls (default: a private one, legs only).
    devices: devices the legs and the fusion are split over (``None``: every device of ``jax.devices()``; 1: the
      default device), one block per device (:func:`engram_jax.eval.sharding.split_run`): the legs' and the
      candidates' episodes, and each fusion chunk's points (a chunk rounded up to a multiple of the device count),
      the candidates given whole to each; the results do not depend on it (tested with fake CPU devices).

  Returns:
    A :class:`GridResult`; point ``p`` equals ``evaluate`` of ``with_values(pipe, result.point(p))``.

  Raises:
    ValueError: on a bad path or value, a metric that is neither a label metric nor one of ``episode_metrics`` or
      whose cutoff exceeds ``k``, ``k`` larger than an episode, or ``chunk < 1``.

  Example:
    >>> import numpy as np
    >>> from engram_jax import Episode, Item, Question, evaluate_grid, make_pipeline
    >>> texts = ['dog adopted', 'invoice overdue', 'hike in the alps', 'a dog show']
    >>> items = tuple(Item(f'i{j}', t, 'S1', j) for j, t in enumerate(texts))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('i0',), ('S1',), 1),))
    >>> emb = (np.eye(4, 8, dtype=np.float32), np.eye(1, 8, dtype=np.float32))
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, fusion='rrf')
    >>> res = evaluate_grid([ep], [emb], pipe, {'legs.cos.weight': [0.5, 2.0], 'k0': [1, 60]}, k=2, metrics=['ndcg@2'], seed=0)
    >>> res.paths, res.scores['ndcg@2'].shape  # [P points, Q questions]
    (['legs.cos.weight', 'k0'], (4, 1))
  """
  t_start = time.perf_counter()
  if chunk < 1:
    raise ValueError(f'chunk must be >= 1, got {chunk}')
  episode_metrics = dict(episode_metrics or {})
  parsed = []
  for m in metrics:
    base, cut = metrics_lib.parse_metric(m, tuple(episode_metrics))
    if cut > k:
      raise ValueError(f'Metric {m} needs {cut} results but pipelines return k={k}')
    parsed.append((m, base, cut))
  for ep in episodes:
    if ep.n_items < k:
      raise ValueError(f'k={k} is larger than episode {ep.id} ({ep.n_items} items)')
  points = grid_points(pipe, grid)
  paths = list(points)
  n_points = len(points[paths[0]]) if paths else 1
  static_paths = [p for p in paths if _is_static(pipe, p)]
  traced_paths = [p for p in paths if p not in static_paths]
  # points grouped by the values of their static knobs: one base pipeline (one structure) each
  structures: dict[tuple, list[int]] = {}
  for p in range(n_points):
    structures.setdefault(tuple(points[s][p].item() for s in static_paths), []).append(p)
  bases = {key: with_values(pipe, dict(zip(static_paths, key))) for key in structures}
  t0 = time.perf_counter()
  if arrays is None:
    options = build_options(bases.values())
    arrays = [episode_arrays(ep, d, q, **options) for ep, (d, q) in zip(episodes, embeddings)]
  if timer is not None:
    timer.add('arrays', time.perf_counter() - t0)
  n_q = [len(ep.questions) for ep in episodes]
  offsets = np.concatenate([[0], np.cumsum(n_q)]).astype(np.int64)
  q_total = int(offsets[-1])
  scores = {m: np.full((n_points, q_total), np.nan) for m, _, _ in parsed}
  keep = sorted({int(p) for p in keep_topk})
  for p in keep:
    if not 0 <= p < n_points:
      raise ValueError(f'keep_topk: point {p} is not in the grid (0..{n_points - 1})')
  kept_topk: dict[int, dict[int, np.ndarray]] = {p: {} for p in keep}
  memos: dict[tuple[str, int], dict] = {}  # (metric, episode) -> episode_metric_scores' memo, over the whole grid
  cache = leg_cache if leg_cache is not None else LegCache(max_bytes=8 << 30)
  base_key = jax.random.key(seed)
  n_dev = sharding.n_devices(devices)
  devs = jax.devices()[:n_dev]
  groups = stack_groups(arrays, max_waste=max_waste) if episodes else []
  info: dict[str, Any] = {
    'points': n_points,
    'structures': len(structures),
    'static_knobs': static_paths,
    'traced_knobs': traced_paths,
    'legs_computed': 0,
    'chunk': chunk,
    'devices': n_dev,
    'episode_groups': len(groups),
    'fusion_bytes_per_chunk': 0,
    'fused_alone': 0,
  }
  t_retrieve = t_score = t_legs = 0.0
  for group in groups:
    index = np.asarray(group, np.int32)
    stack = stack_arrays([arrays[e] for e in group])
    group_key = (legcache.fingerprint(stack, index), seed)
    labels = np.asarray(stack.labels)  # [E, Q_pad, N]
    q_pad = labels.shape[1]
    labels_flat, n_gold = labels.reshape(-1), labels.sum(axis=-1)
    # real questions of the group, flat in [E * Q_pad], and where they go in the questions' order
    src = np.concatenate([i * q_pad + np.arange(n_q[e]) for i, e in enumerate(group)]).astype(np.int64)
    dst = np.concatenate([offsets[e] + np.arange(n_q[e]) for e in group]).astype(np.int64)
    for key, pts in structures.items():
      base = bases[key]
      defaults = {path: _value_array(v) for path, v in traced_values(base).items()}
      pts_arr = np.asarray(pts)

      def finish(tops: np.ndarray, chosen: np.ndarray) -> None:
        """Top-k ``[B, E, Q_pad, k]`` of points ``chosen``: scores, the equal-k check and kept ids."""
        nonlocal t_score
        t1 = time.perf_counter()
        real = tops.reshape(len(chosen), -1, k)[:, src]
        if np.any(real < 0):
          raise AssertionError(f'Pipeline {pipe.name} returned fewer than k={k} items at a grid point')
        if any(b not in episode_metrics for _, b, _ in parsed):
          top_pos, gold = as_gains(tops, labels_flat, n_gold)
        for m, b, cut in parsed:
          if b in episode_metrics:  # the dataset's own metric, from each point's top-k ids
            for i, e in enumerate(group):
              vals = episode_metric_scores(
                episode_metrics[b], episodes[e], tops[:, i, : n_q[e]], cut, memos.setdefault((m, e), {})
              )
              scores[m][chosen[:, None], offsets[e] + np.arange(n_q[e])[None]] = vals
            continue
          vals = metrics_lib.METRICS[b](top_pos, gold, k=cut)  # [B, E, Q_pad] float64
          scores[m][chosen[:, None], dst[None]] = vals.reshape(len(chosen), -1)[:, src]
        for j, p in enumerate(chosen.tolist()):
          if p in kept_topk:
            for i, e in enumerate(group):
              kept_topk[p][e] = tops[j, i, : n_q[e]]
        t_score += time.perf_counter() - t1

      t1 = time.perf_counter()
      if base.fusion != 'rrf':  # one leg: every traced knob is the leg's own, so the pipeline runs once per point
        run = cache.program(('grid_topk', id(base), k), functools.partial(stacked_topk, base, k))
        for p in pts:
          vals = {**defaults, **{t: _value_array(points[t][p].item()) for t in traced_paths}}
          out = np.asarray(run(stack, base_key, index, vals))
          t_retrieve += time.perf_counter() - t1
          finish(out[None], np.asarray([p]))
          t1 = time.perf_counter()
        info['legs_computed'] += len(pts)
        continue
      n_legs = len(base.legs)
      combo = np.zeros((len(pts), n_legs), np.int32)
      idx_stacks, ranked_stacks = [], []
      for pos, spec in enumerate(base.legs):
        prefix = f'legs.{spec.name}.'
        own = [t for t in traced_paths if t.startswith(prefix) and t != f'{prefix}weight']
        rows = [tuple(points[t][p].item() for t in own) for p in pts]
        distinct = list(dict.fromkeys(rows))
        where = {r: i for i, r in enumerate(distinct)}
        combo[:, pos] = [where[r] for r in rows]
        tops = []
        for r in distinct:
          mine = {
            path[len(prefix) :]: v
            for path, v in defaults.items()
            if path.startswith(prefix) and path != f'{prefix}weight'
          }
          mine.update({t[len(prefix) :]: _value_array(v) for t, v in zip(own, r)})
          t2 = time.perf_counter()
          # a staged leg's first part is kept for its second part's other values only when there are some
          tops.append(
            leg_top_d(cache, spec, pos, n_legs, mine, stack, base_key, index, group_key, devs, len(distinct) > 1)
          )
          t_legs += time.perf_counter() - t2
        info['legs_computed'] += len(distinct)
        idx_stacks.append(np.stack([t[0] for t in tops]))
        ranked_stacks.append(np.stack([t[1] for t in tops]))
      weights = np.stack(
        [
          points[f'legs.{s.name}.weight'][pts_arr].astype(np.float32)
          if f'legs.{s.name}.weight' in traced_paths
          else np.full(len(pts), defaults[f'legs.{s.name}.weight'], np.float32)
          for s in base.legs
        ],
        axis=1,
      )
      k0 = (
        points['k0'][pts_arr].astype(np.float32)
        if 'k0' in traced_paths
        else np.full(len(pts), defaults['k0'], np.float32)
      )
      by_legs: dict[tuple, list[int]] = {}  # points grouped by which value of each leg's knobs they take
      for j, row in enumerate(map(tuple, combo.tolist())):
        by_legs.setdefault(row, []).append(j)
      most = max(len(js) for js in by_legs.values())
      b = sharding.padded_size(-(-most // -(-most // chunk)), n_dev)  # <= chunk, as few padded points as can be
      widths = tuple(int(x.shape[-1]) for x in idx_stacks)
      candidates = cache.program(('grid_candidates', widths, k), functools.partial(grid_candidates, k))
      fuse = cache.program(('grid_fusion', widths, n_legs, k, b), functools.partial(grid_fusion, k))
      t_retrieve += time.perf_counter() - t1
      alone = cache.program(('rrf_topk', widths, n_legs, k), functools.partial(stacked_fusion, k))  # evaluate's
      for row, js in by_legs.items():
        t1 = time.perf_counter()
        leg_idx, leg_ranked = [x[c] for x, c in zip(idx_stacks, row)], [x[c] for x, c in zip(ranked_stacks, row)]
        if len(js) <= FUSE_ALONE:  # few points on these legs' values: fused as evaluate fuses, no candidates
          for j in js:
            w = [np.asarray(x, np.float32) for x in weights[j]]
            out = np.asarray(alone(leg_idx, leg_ranked, stack.where, w, np.asarray(k0[j], np.float32)))
            t_retrieve += time.perf_counter() - t1
            finish(out[None], pts_arr[[j]])
            t1 = time.perf_counter()
          info['fused_alone'] += len(js)
          continue
        cand, ranks = sharding.split_run(
          candidates, (leg_idx, leg_ranked, stack.where), episode_args=(True, True, True), devices=devs
        )
        info['fusion_bytes_per_chunk'] = max(info['fusion_bytes_per_chunk'], b * int(np.prod(cand.shape)) * 4)
        js = np.asarray(js)
        t_retrieve += time.perf_counter() - t1
        for start in range(0, len(js), b):
          t1 = time.perf_counter()
          sl = js[np.arange(start, start + b).clip(max=len(js) - 1)]  # the last chunk padded with its last point
          out = sharding.split_run(  # the points one block per device, the candidates given to each
            fuse, (cand, ranks, weights[sl], k0[sl]), episode_args=(False, False, True, True), devices=devs
          )
          out = np.asarray(out)
          n_real = min(b, len(js) - start)
          t_retrieve += time.perf_counter() - t1
          finish(out[:n_real], pts_arr[sl[:n_real]])
  if timer is not None:
    timer.add('retrieve', t_retrieve)
    timer.add('score', t_score)
  retrieved = {}
  for p in keep:
    rows: list[list[str]] = []
    for e, ep in enumerate(episodes):
      ids = np.array([it.id for it in ep.items], dtype=object)
      rows.extend(ids[kept_topk[p][e]].tolist())
    retrieved[p] = rows
  info.update(
    retrieve_s=round(t_retrieve, 3),
    legs_s=round(t_legs, 3),
    score_s=round(t_score, 3),
    total_s=round(time.perf_counter() - t_start, 3),
  )
  return GridResult(
    pipeline=pipe.name,
    paths=paths,
    points=points,
    question_ids=[q.id for ep in episodes for q in ep.questions],
    episode_ids=[ep.id for ep in episodes for _ in ep.questions],
    categories=[q.category for ep in episodes for q in ep.questions],
    scores=scores,
    retrieved=retrieved,
    k=k,
    info=info,
  )


def rank_points(
  result: GridResult,
  metric: str,
  *,
  seed: int,
  n_resamples: int = 10_000,
  top: int | None = None,
  batch: int = 25,
) -> list[dict[str, Any]]:
  """The leading points by mean ``metric``, best first: each with its 95% bootstrap interval and its paired
  difference from the best point on the same questions (bootstrap CI of the mean difference from one draw, sign-flip
  p: the numbers of :func:`engram_jax.metrics.stats.bootstrap_ci` and :func:`~engram_jax.metrics.stats.paired_test`
  on that row alone). ``on_plateau``: the paired CI contains 0.

  ``top``: how many leading points to test; ``None`` (default): ``batch`` at a time, until a batch holds no point
  on the plateau but the best (every point of the grid at most), so that the plateau is complete without testing
  every point of a large grid. Untested points are not returned.

  Returns:
    ``[{point, rank, params (path -> value), mean, ci [lo, hi], vs_best {delta, lo, hi, p, n}, on_plateau}]``.
  """
  values = result.scores[metric]
  means = values.mean(axis=1)
  order = np.argsort(-means, kind='stable')
  limit = len(order) if top is None else max(1, min(top, len(order)))
  step = limit if top is not None else max(1, batch)
  best_reps = None
  out: list[dict[str, Any]] = []
  for start in range(0, limit, step):
    chosen = order[start : min(start + step, limit)]
    rows = values[chosen]  # [M, Q]
    diffs = rows - values[order[0]]
    # [M, R]: each row as if alone; the two passes are independent (on two threads)
    reps, pvalues = stats.run_tasks(
      [
        lambda: stats.bootstrap_means(rows, seed=seed, n_resamples=n_resamples),
        lambda: stats.sign_flip_pvalues(diffs, seed=seed + 1, n_resamples=n_resamples),
      ]
    )
    if best_reps is None:
      best_reps = reps[0]
    cis = stats.percentile_intervals(rows, reps)
    paired = stats.paired_results(diffs, reps - best_reps, pvalues)
    for p, ci, d in zip(chosen.tolist(), cis, paired):
      vs = d.to_dict()
      out.append(
        {
          'point': p,
          'rank': len(out) + 1,
          'params': result.point(p),
          'mean': float(means[p]),
          'ci': [ci.lo, ci.hi],
          'vs_best': vs,
          'on_plateau': bool(vs['lo'] <= 0.0 <= vs['hi']),
        }
      )
    if top is None and not any(r['on_plateau'] and r['rank'] > 1 for r in out[-len(chosen) :]):
      break
  return out


def save_npz(result: GridResult, path) -> None:
  """One compressed file: the knob values per point (``knob/<path>``), per-point means (``mean/<metric>``), the
  per-question scores ``[P, Q]`` (``scores/<metric>``, float64) and the questions' ids, episodes and categories."""
  arrays = {f'knob/{p}': v for p, v in result.points.items()}
  arrays.update({f'mean/{m}': v.mean(axis=1) for m, v in result.scores.items()})
  arrays.update({f'scores/{m}': v for m, v in result.scores.items()})
  arrays['question_ids'] = np.asarray(result.question_ids)
  arrays['episode_ids'] = np.asarray(result.episode_ids)
  arrays['categories'] = np.asarray([str(c) for c in result.categories])
  arrays['meta'] = np.asarray(repr({'pipeline': result.pipeline, 'paths': result.paths, 'k': result.k}))
  np.savez_compressed(path, **arrays)


def load_npz(path) -> GridResult:
  """A :class:`GridResult` from :func:`save_npz` (no top-k ids, no info)."""
  import ast

  with np.load(path, allow_pickle=False) as z:
    meta = ast.literal_eval(str(z['meta']))
    return GridResult(
      pipeline=meta['pipeline'],
      paths=list(meta['paths']),
      points={p: z[f'knob/{p}'] for p in meta['paths']},
      question_ids=z['question_ids'].tolist(),
      episode_ids=z['episode_ids'].tolist(),
      categories=z['categories'].tolist(),
      scores={n[len('scores/') :]: z[n] for n in z.files if n.startswith('scores/')},
      retrieved={},
      k=int(meta['k']),
      info={},
    )


__all__ = [
  'GridResult',
  'episode_metric_scores',
  'evaluate_grid',
  'flatten_grid',
  'grid_points',
  'load_npz',
  'rank_points',
  'save_npz',
]
