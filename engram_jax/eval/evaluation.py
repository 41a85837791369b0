"""Run pipelines over episodes and collect per-question metrics."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from engram_jax.core import ranking
from engram_jax.core.batch import EpisodeArrays, episode_arrays, stack_arrays, stack_groups
from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, Question
from engram_jax.data import splits
from engram_jax.eval import legcache, sharding
from engram_jax.eval.legcache import LegCache
from engram_jax.eval.pipeline import Pipeline, build_options, check_equal_k, pipeline_topk, structure_key, traced_values
from engram_jax.eval.timing import RunTimer
from engram_jax.metrics import labels as metrics_lib


@dataclasses.dataclass
class EvalResult:
  """Per-question outcomes of several pipelines on the same questions (row i is the same question).

  Example:
    >>> import numpy as np
    >>> from engram_jax import Episode, Item, Question, evaluate, make_pipeline
    >>> items = (Item('a', 'dog adopted', 'S1', 0), Item('b', 'invoice overdue', 'S1', 1))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('a',), ('S1',), 1),))
    >>> emb = (np.eye(2, 4, dtype=np.float32), np.eye(1, 4, dtype=np.float32))
    >>> res = evaluate([ep], [emb], {'cos': make_pipeline(legs={'cos': {'op': 'cosine'}})}, k=1, metrics=['ndcg@1'], seed=0, progress=False)
    >>> res.k, res.episode_ids, res.retrieved['cos']
    (1, ['e'], [['a']])
  """

  question_ids: list[str]
  episode_ids: list[str]
  categories: list[int | str]
  n_gold: list[int]
  scores: dict[str, dict[str, np.ndarray]]  # pipeline -> metric -> [Q_total]
  retrieved: dict[str, list[list[str]]]  # pipeline -> per question top-k item ids
  k: int


EpisodeMetric = Callable[[Episode, Question, list[int], int], float]


def embed_episodes(
  episodes: Sequence[Episode], embed: Callable[[list[str]], np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
  """Embed every item and question text once; returns ``[(docs [N, D], queries [Q, D])]`` per episode. When
  ``embed`` has a ``queries`` attribute (an encoder with a query prompt), the questions are embedded by it and the
  items by ``embed``; when it has a ``by_id`` attribute (vectors read from a file, :mod:`engram_jax.data.vectors`),
  ``embed.by_id(episodes)`` gives the vectors, matched by the episodes' ids, and no text is embedded."""
  by_id = getattr(embed, 'by_id', None)
  if by_id is not None:
    return by_id(episodes)
  queries = getattr(embed, 'queries', None)
  if queries is not None:
    docs = embed([it.text for ep in episodes for it in ep.items])
    qs = queries([q.text for ep in episodes for q in ep.questions])
    out, a, b = [], 0, 0
    for ep in episodes:
      out.append((docs[a : a + ep.n_items], qs[b : b + len(ep.questions)]))
      a, b = a + ep.n_items, b + len(ep.questions)
    return out
  texts: list[str] = []
  for ep in episodes:
    texts.extend(it.text for it in ep.items)
    texts.extend(q.text for q in ep.questions)
  vecs = embed(texts)
  out, at = [], 0
  for ep in episodes:
    n, q = ep.n_items, len(ep.questions)
    out.append((vecs[at : at + n], vecs[at + n : at + n + q]))
    at += n + q
  return out


def evaluate(
  episodes: Sequence[Episode],
  embeddings: Sequence[tuple[np.ndarray, np.ndarray]],
  pipelines: Mapping[str, Pipeline],
  *,
  k: int,
  metrics: Sequence[str],
  seed: int,
  progress: bool = True,
  arrays: Sequence[EpisodeArrays] | None = None,
  only: Mapping[str, set[str]] | None = None,
  episode_metrics: Mapping[str, EpisodeMetric] | None = None,
  timer: RunTimer | None = None,
  stacked: bool = True,
  max_waste: float = 2.0,
  devices: int | None = 1,
  leg_cache: LegCache | None = None,
  unit_norm: bool = True,
) -> EvalResult:
  """Run each pipeline on each episode, assert equal ``k``, and score every question.

  ``metrics`` are label metrics (:data:`engram_jax.metrics.labels.METRICS`) or the dataset-owned metrics of
  ``episode_metrics`` (name -> ``fn(episode, question, ranked indices, k)``, declared by the dataset module as its
  ``METRICS``: ``answer@k``, ``newest_first@k``, ``parent_recall@k``, ...).

  ``timer`` (optional) receives the time of the jitted retrieval calls (phase ``retrieve``, compilation included)
  and of the metric computation (phase ``score``), and the time spent building and stacking the padded arrays
  (phase ``arrays``: tokenising, term statistics, padding).

  ``stacked`` (default): episodes are grouped by size (:func:`engram_jax.core.batch.stack_groups`, padding at most
  ``max_waste`` x), each group padded to common shapes and stacked, and each pipeline runs as one jitted
  ``lax.map`` over a group's episodes, the label metrics as one jitted call: a run compiles once per pipeline and
  group, whatever the number of episodes. Per-episode keys are the same as unstacked (``fold_in(seed, episode
  index)``) and every operator's result is independent of the padding (cos2 draws its noise per (question,
  item)), so the per-question results equal the unstacked ones (tested). ``stacked=False`` runs one jitted call
  per episode (one compilation per shape bucket).

  ``devices`` (stacked only): the number of devices each group's episodes are split over (``None``: all of
  ``jax.devices()``; 1, the default: the default device), one contiguous block of episodes per device, each running
  the one-device program (:func:`engram_jax.eval.sharding.split_run`); episode ``e`` keeps the key ``fold_in(seed,
  e)``, so the results equal the one-device results bit for bit (tested, exact score ties included). The label
  metrics stay NumPy on the host.

  ``leg_cache`` (stacked; :mod:`engram_jax.eval.legcache`): legs' hard outputs, one-leg pipelines' top-k,
  the padded arrays and the jitted programs are looked up there and stored, so that the jobs of a sweep in one
  process compute each leg once per episode group (a fusion-only change recomputes only the fusion). The results
  equal an uncached run's (tested).

  ``only[name]`` restricts pipeline ``name`` to those episode ids (its other questions get NaN scores and
  no retrieved ids; used for per-episode fitted variants, see :func:`merge_by_episode`).

  ``unit_norm`` (default True): item and question embeddings must be finite and unit-norm
  (:func:`engram_jax.core.batch.episode_arrays`; rows off by more than ``NORM_TOL`` are counted and refused), as
  every embedder of :mod:`engram_jax.data.embed` returns them; False for embeddings meant unnormalised.

  Raises:
    ValueError: if ``k`` exceeds an episode's number of items, a metric's cutoff exceeds ``k``, or an embedding is
      NaN/inf or (``unit_norm``) not of unit norm.

  Example:
    >>> import numpy as np
    >>> from engram_jax import Episode, Item, Question, evaluate, make_pipeline
    >>> items = tuple(Item(f'i{j}', t, 'S1', j) for j, t in enumerate(['dog adopted', 'invoice overdue', 'hike in the alps']))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('i0',), ('S1',), 1),))
    >>> emb = (np.eye(3, 4, dtype=np.float32), np.eye(1, 4, dtype=np.float32))  # (items, questions) embeddings
    >>> res = evaluate([ep], [emb], {'bm25': make_pipeline(legs={'bm25': {'op': 'bm25'}})}, k=2, metrics=['recall@2'], seed=0, progress=False)
    >>> res.question_ids, res.scores['bm25']['recall@2'].tolist(), res.retrieved['bm25'][0][0]
    (['q'], [1.0], 'i0')
  """
  episode_metrics = dict(episode_metrics or {})
  parsed = [(m, *metrics_lib.parse_metric(m, tuple(episode_metrics))) for m in metrics]
  for m, _, cut in parsed:
    if cut > k:
      raise ValueError(f'Metric {m} needs {cut} results but pipelines return k={k}')
  for ep in episodes:
    if ep.n_items < k:
      raise ValueError(f'k={k} is larger than episode {ep.id} ({ep.n_items} items)')
  arrays_key = None  # the arrays' content key in leg_cache, when built here
  if arrays is None:
    t0 = time.perf_counter()
    options = build_options(pipelines.values())  # e.g. the term counts of every BM25 tokenizer a leg asks for

    def build():
      return [episode_arrays(ep, d, q, **options, unit_norm=unit_norm) for ep, (d, q) in zip(episodes, embeddings)]

    if leg_cache is None:
      arrays = build()
    else:  # keyed by everything the arrays are built from: the episodes' content, the embeddings, the options
      # (content hashes taken once per process-memoised episodes / embeddings object, not once per job)
      content = (
        leg_cache.of_object('episodes_key', episodes, lambda: _episodes_key(episodes)),
        leg_cache.of_object('embeddings_key', embeddings, lambda: legcache.fingerprint(list(embeddings))),
      )
      arrays_key = content + (repr(sorted(options.items())),)
      arrays = leg_cache.get('arrays', arrays_key, build)
    if timer is not None:
      timer.add('arrays', time.perf_counter() - t0)
  result = EvalResult(
    question_ids=[q.id for ep in episodes for q in ep.questions],
    episode_ids=[ep.id for ep in episodes for _ in ep.questions],
    categories=[q.category for ep in episodes for q in ep.questions],
    n_gold=[len(q.gold) for ep in episodes for q in ep.questions],
    scores={name: {m: [] for m, _, _ in parsed} for name in pipelines},
    retrieved={name: [] for name in pipelines},
    k=k,
  )
  base_key = jax.random.key(seed)
  label_metrics = {(base, cut) for _, base, cut in parsed if base not in episode_metrics}
  # per (pipeline, episode): top-k [Q_real, k] and each label metric [Q_real]
  topks: dict[tuple[str, int], np.ndarray] = {}
  values: dict[tuple[str, int, str, int], np.ndarray] = {}
  if stacked:
    groups = stack_groups(arrays, max_waste=max_waste) if episodes else []
    devs = jax.devices()[: sharding.n_devices(devices)]
    by_structure: dict[tuple, Callable] = {}  # pipelines differing only in traced knobs share one program
    cached = leg_cache is not None
    runs = {
      name: (
        leg_cache.program(('topk', structure_key(p), k), functools.partial(stacked_topk, p, k))
        if cached
        else by_structure.setdefault(structure_key(p), stacked_topk(p, k))
      )
      for name, p in pipelines.items()
    }
    values = {
      name: {
        path: np.asarray(v, np.int32 if isinstance(v, int) else np.float32) for path, v in traced_values(p).items()
      }
      for name, p in pipelines.items()
    }
    metric_fns = {(base, cut): _batched_metric(base, cut) for base, cut in label_metrics}
    for group in tqdm(groups, desc='episode groups', disable=not progress or len(groups) < 2):
      t0 = time.perf_counter()
      index = np.asarray(group, np.int32)  # episode e's key is fold_in(base_key, e), folded inside the jit
      if cached and arrays_key is not None:  # the stacked group and its fingerprint once per sweep (cached arrays)
        stack, fp = leg_cache.get(
          'stack',
          (arrays_key, tuple(group), max_waste),
          lambda group=group, index=index: (lambda st: (st, legcache.fingerprint(st, index)))(
            stack_arrays([arrays[e] for e in group])
          ),
        )
        group_key = (fp, seed)
      elif cached:  # arrays given by the caller: fingerprint them here
        stack = stack_arrays([arrays[e] for e in group])
        group_key = (legcache.fingerprint(stack, index), seed)
      else:
        stack, group_key = stack_arrays([arrays[e] for e in group]), None
      inputs = (stack, index)
      if timer is not None:
        timer.add('arrays', time.perf_counter() - t0)
      for name, pipe in pipelines.items():
        t0 = time.perf_counter()
        if cached:
          out = _cached_topk(leg_cache, pipe, k, inputs, base_key, values[name], group_key, runs[name], devs)
        else:
          out = sharding.split_run(
            runs[name], (stack, base_key, index, values[name]), episode_args=(True, False, True, False), devices=devs
          )
        out = np.asarray(out)
        t1 = time.perf_counter()
        vals = {mk: fn(out, np.asarray(stack.labels)) for mk, fn in metric_fns.items()}
        for i, e in enumerate(group):
          nq = len(episodes[e].questions)
          topks[name, e] = out[i, :nq]
          for (base, cut), v in vals.items():
            values[name, e, base, cut] = v[i, :nq]
        if timer is not None:
          timer.add('retrieve', t1 - t0)
          timer.add('score', time.perf_counter() - t1)
  else:
    fns = {name: jax.jit(functools.partial(pipeline_topk, p, k=k)) for name, p in pipelines.items()}
    for name, e in tqdm(
      [(n, e) for n in pipelines for e in range(len(episodes))], desc='pipelines x episodes', disable=not progress
    ):
      t0 = time.perf_counter()
      topk = np.asarray(fns[name](arrays[e], jax.random.fold_in(base_key, e)))
      t1 = time.perf_counter()
      nq = len(episodes[e].questions)
      topks[name, e] = topk[:nq]
      for base, cut in label_metrics:
        values[name, e, base, cut] = metrics_lib.METRICS[base](topk, np.asarray(arrays[e].labels), k=cut)[:nq]
      if timer is not None:
        timer.add('retrieve', t1 - t0)
        timer.add('score', time.perf_counter() - t1)
  t0 = time.perf_counter()
  for name in pipelines:
    for e, ep in enumerate(episodes):
      nq = len(ep.questions)
      if only is not None and name in only and ep.id not in only[name]:
        for m, _, _ in parsed:
          result.scores[name][m].append(np.full(nq, np.nan))
        result.retrieved[name].extend([[] for _ in range(nq)])
        continue
      topk = topks[name, e]
      check_equal_k(topk, nq, k=k, name=name, episode=ep.id, n_items=ep.n_items)
      for m, base, cut in parsed:
        if base in episode_metrics:
          vals = np.array([episode_metrics[base](ep, q, row, cut) for q, row in zip(ep.questions, topk.tolist())])
        else:
          vals = values[name, e, base, cut]
        result.scores[name][m].append(vals)
      ids = np.array([it.id for it in ep.items], dtype=object)
      result.retrieved[name].extend(ids[topk].tolist())
  for name in pipelines:
    for m in result.scores[name]:
      result.scores[name][m] = np.concatenate(result.scores[name][m]).astype(np.float64)
  if timer is not None:
    timer.add('score', time.perf_counter() - t0)
  return result


def _episodes_key(episodes: Sequence[Episode]) -> str:
  """sha256 of the episodes' whole content (ids, items, questions, gold; pickled frozen dataclasses)."""
  return hashlib.sha256(pickle.dumps(list(episodes), protocol=4)).hexdigest()


def _cached_topk(
  cache: LegCache,
  pipe: Pipeline,
  k: int,
  inputs,
  base_key,
  values: Mapping[str, np.ndarray],
  group_key: tuple,
  run_whole: Callable,
  devices: Sequence[Any] = (),
) -> jax.Array:
  """Top-k ``[E, Q, k]`` of ``pipe`` on one stacked group through ``cache`` (:mod:`engram_jax.eval.legcache`): a
  one-leg pipeline whole, an RRF pipeline as its legs' top-D (each looked up) and the fusion; legs and one-leg
  pipelines split over ``devices`` (:func:`engram_jax.eval.sharding.split_run`; none or one: the default device)."""
  stack, index = inputs
  traced = tuple(sorted((p, v.dtype.str, v.tobytes()) for p, v in values.items()))
  if pipe.fusion != 'rrf':
    return jnp.asarray(
      cache.get(
        'pipeline',
        (group_key, structure_key(pipe), traced, k),
        lambda: np.asarray(
          sharding.split_run(
            run_whole, (stack, base_key, index, values), episode_args=(True, False, True, False), devices=devices
          )
        ),
      )
    )
  n_legs = len(pipe.legs)
  tops = []
  for pos, spec in enumerate(pipe.legs):
    prefix = f'legs.{spec.name}.'
    mine = {p[len(prefix) :]: v for p, v in values.items() if p.startswith(prefix) and p[len(prefix) :] != 'weight'}
    tops.append(leg_top_d(cache, spec, pos, n_legs, mine, stack, base_key, index, group_key, devices))
  fuse = cache.program(
    ('rrf_topk', tuple(int(t[0].shape[-1]) for t in tops), n_legs, k), functools.partial(stacked_fusion, k)
  )
  weights = [values[f'legs.{s.name}.weight'] for s in pipe.legs]
  return fuse([t[0] for t in tops], [t[1] for t in tops], stack.where, weights, values['k0'])


def leg_top_d(
  cache: LegCache,
  spec,
  pos: int,
  n_legs: int,
  mine: Mapping[str, np.ndarray],
  stack: EpisodeArrays,
  base_key,
  index,
  group_key: tuple,
  devices: Sequence[Any] = (),
  staged: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
  """Leg ``pos`` of ``n_legs`` on one stacked group, as RRF reads it: ``(top-D indices, ranked) [E, Q, D]``, with its
  traced knobs ``mine`` (name -> value; every traced knob of the leg but its weight) as arguments, looked up in and
  stored to ``cache`` by everything it depends on (a staged leg's first part shared by every value of the knobs
  its second part reads). Used by the cached evaluation and by :func:`engram_jax.eval.grid.evaluate_grid`. With
  several ``devices`` the episodes are split over them (:func:`engram_jax.eval.sharding.split_run`; the same bits).
  ``staged=False`` runs a staged leg whole (one fused program, no stored first part: faster when the caller needs one
  value of its second part's knobs; the same bits)."""
  mine = dict(mine)

  def split(fn, args, episode_args, gather=True):
    out = sharding.split_run(fn, args, episode_args=episode_args, devices=devices, gather=gather)
    return jax.tree_util.tree_map(np.asarray, out) if gather else out

  static = legcache.fingerprint([v for n, v in spec.options if n not in mine]) + repr(
    [(n, type(v).__name__) for n, v in spec.options if n not in mine]
  )
  mine_key = tuple(sorted((n, v.dtype.str, v.tobytes()) for n, v in mine.items()))
  op = (spec.op, id(spec.operator.leg))  # the registered function itself (a re-registered name is another op)
  leg_key = (group_key, op, static, mine_key, spec.depth, pos, n_legs)
  stages = spec.operator.stages
  names = tuple(sorted(mine))
  if staged and stages is not None and not set(stages.by) & set(mine):  # its first part shared by every job of a sweep
    by = {n: v for n, v in spec.options if n in stages.by}
    prep_key = (group_key, op, legcache.fingerprint(list(by.values())) + repr(sorted(by)), pos, n_legs)
    prepare = cache.program(
      ('prepare', op, repr(sorted(by.items())), pos, n_legs),
      functools.partial(_stacked_prepare, spec, pos, n_legs, by),
    )
    run = cache.program(
      ('finish', op, static, names, spec.depth, pos, n_legs),
      functools.partial(_stacked_finish, spec, pos, n_legs, names),
    )

    def make():
      prepared = cache.get(
        'prepared',
        prep_key + (len(devices),),
        lambda: split(prepare, (stack, base_key, index), (True, False, True), gather=False),
      )
      return split(run, (stack, prepared, base_key, index, mine), (True, True, False, True, False))

  else:
    run = cache.program(
      ('leg', op, static, names, spec.depth, pos, n_legs),
      functools.partial(_stacked_leg, spec, pos, n_legs, names),
    )

    def make():
      return split(run, (stack, base_key, index, mine), (True, False, True, False))

  return cache.get('leg', leg_key, make)


def _leg_key(key, e, pos: int, n_legs: int):
  """Leg ``pos``'s key on episode ``e``, as :func:`engram_jax.eval.pipeline.pipeline_scores` splits it."""
  return jax.random.split(jax.random.fold_in(key, e), n_legs)[pos]


def _stacked_leg(spec, pos: int, n_legs: int, traced: tuple[str, ...]) -> Callable:
  """``(stacked arrays, key, episode indices, the leg's traced knob values) -> (top-D indices, ranked) [E, Q, D]``:
  leg ``pos`` of ``n_legs`` exactly as :func:`engram_jax.eval.pipeline.pipeline_scores` runs it (same key, same knob
  values), then its top-D as :func:`engram_jax.ops.rrf.rrf_fuse` reads it; jitted."""

  def run(st, key, index, mine):
    def one(a):
      ep, e = a
      k_ = _leg_key(key, e, pos, n_legs)
      s = spec.operator.leg(ep, k_, **{**dict(spec.options), **mine}) if traced else spec.score(ep, k_)
      return legcache.leg_top(s, ep.where, spec.depth)

    return jax.lax.map(one, (st, index))

  return jax.jit(run)


def _stacked_prepare(spec, pos: int, n_legs: int, by: Mapping[str, Any]) -> Callable:
  """``(stacked arrays, key, episode indices) -> prepared [E, ...]``: the first part of a staged leg
  (:class:`engram_jax.ops.registry.Stages`), with the leg's key, mapped over episodes; jitted."""

  def run(st, key, index):
    def one(a):
      ep, e = a
      return spec.operator.stages.prepare(ep, _leg_key(key, e, pos, n_legs), **by)

    return jax.lax.map(one, (st, index))

  return jax.jit(run)


def _stacked_finish(spec, pos: int, n_legs: int, traced: tuple[str, ...]) -> Callable:
  """``(stacked arrays, prepared, key, episode indices, traced knob values) -> (top-D, ranked) [E, Q, D]``: the
  second part of a staged leg, then its top-D as :func:`_stacked_leg` gives it (equal bit for bit); jitted."""

  def run(st, prepared, key, index, mine):
    def one(a):
      ep, p, e = a
      k_ = _leg_key(key, e, pos, n_legs)
      s = spec.operator.stages.finish(ep, p, k_, **{**dict(spec.options), **mine})
      return legcache.leg_top(s, ep.where, spec.depth)

    return jax.lax.map(one, (st, prepared, index))

  return jax.jit(run)


def stacked_fusion(k: int) -> Callable:
  """``(legs' top-D indices, ranked, where [E, N], weights, k0) -> top-k [E, Q, k]`` (-1 where unranked): RRF
  from the legs' top-D (:func:`engram_jax.eval.legcache.rrf_from_top`) and the final top-k, mapped over episodes."""

  def run(idx, ranked, where, weights, k0):
    w = jnp.stack([jnp.asarray(x, jnp.float32) for x in weights])

    def one(a):
      i, r, wh = a
      fused = legcache.rrf_from_top(i, r, weights=w, k0=k0, where=wh, n=wh.shape[-1])
      top, vals = ranking.top_k(fused, k=k, where=wh)
      return jnp.where(jnp.isneginf(vals), -1, top)

    return jax.lax.map(one, (idx, ranked, where))

  return jax.jit(run)


def stacked_topk(pipe: Pipeline, k: int) -> Callable:
  """``(stacked arrays [E, ...], key, episode indices [E], knob values) -> top-k [E, Q, k]``: ``pipe``'s structure
  mapped over episodes (episode ``e`` with ``fold_in(key, e)``), jitted; the traced knob values
  (:func:`engram_jax.eval.pipeline.traced_values`) are arguments, so it serves every pipeline of the same
  :func:`engram_jax.eval.pipeline.structure_key`. Several devices: :func:`engram_jax.eval.sharding.split_run`."""

  def run(st, key, index, values):
    return jax.lax.map(
      lambda a: pipeline_topk(pipe, a[0], jax.random.fold_in(key, a[1]), k=k, values=values), (st, index)
    )

  return jax.jit(run)


def _batched_metric(base: str, cut: int) -> Callable:
  """A label metric over stacked NumPy top-k ``[E, Q, k]`` and labels ``[E, Q, N]``: ``[E, Q]`` float64 (NumPy, so
  the values do not depend on the batch shape)."""
  return functools.partial(metrics_lib.METRICS[base], k=cut)


def crossfit_choose(
  per_value: Sequence[np.ndarray], folds: Sequence[str], question_ids: Sequence[str]
) -> tuple[np.ndarray, dict[str, int]]:
  """Leave-one-fold-out choice of a grid value: each fold is scored with the value that is best on the others.

  Args:
    per_value: G arrays ``[Q]``, the tuning metric of each grid value on every question.
    folds: ``[Q]`` fold id of each question (LoCoMo: its conversation).
    question_ids: ``[Q]`` ids, used to assert that no scored question is in its own training set.

  Returns:
    ``(choice [Q], {fold: grid index})``; ties between grid values go to the first.
  """
  vals = np.stack([np.asarray(v, np.float64) for v in per_value])  # [G, Q]
  folds = np.asarray(folds)
  ids = np.asarray(question_ids)
  choice = np.zeros(len(folds), np.int64)
  chosen: dict[str, int] = {}
  for f in dict.fromkeys(folds.tolist()):
    scored, train = folds == f, folds != f
    if not train.any():
      raise EngramError(f'cross-fitting needs at least two folds (episodes), got {len(set(folds.tolist()))}')
    splits.assert_disjoint(ids[train].tolist(), ids[scored].tolist())
    g = int(np.argmax(vals[:, train].mean(axis=1)))
    choice[scored] = g
    chosen[str(f)] = g
  return choice, chosen


def merge_tuned(result: EvalResult, name: str, variants: Sequence[str], *, metric: str) -> dict[str, object]:
  """Replace grid ``variants`` in ``result`` by one cross-fitted pipeline ``name`` (folds = episodes).

  Every question is scored by the variant chosen on the other episodes only. Returns what was chosen.
  """
  choice, chosen = crossfit_choose(
    [result.scores[v][metric] for v in variants], result.episode_ids, result.question_ids
  )
  result.scores[name] = {
    m: np.stack([result.scores[v][m] for v in variants])[choice, np.arange(len(choice))]
    for m in result.scores[variants[0]]
  }
  result.retrieved[name] = [result.retrieved[variants[c]][i] for i, c in enumerate(choice)]
  for v in variants:
    del result.scores[v], result.retrieved[v]
  return {'metric': metric, 'chosen_by_fold': {f: variants[g] for f, g in chosen.items()}}


def merge_replicates(result: EvalResult, name: str, variants: Sequence[str]) -> dict[str, object]:
  """Replace seed ``variants`` of a stochastic pipeline by their per-question mean, named ``name``.

  The per-question mean over seeds is the method's expected score on that question, so paired tests
  against other pipelines stay paired. Returns each seed's overall mean and their range per metric.
  """
  metrics = list(result.scores[variants[0]])
  per_seed = {m: [float(result.scores[v][m].mean()) for v in variants] for m in metrics}
  result.scores[name] = {m: np.mean([result.scores[v][m] for v in variants], axis=0) for m in metrics}
  result.retrieved[name] = result.retrieved[variants[0]]
  for v in variants:
    del result.scores[v], result.retrieved[v]
  return {
    'variants': list(variants),
    'retrieved_shown': variants[0],
    'per_seed_mean': per_seed,
    'range': {m: [min(x), max(x)] for m, x in per_seed.items()},
  }


def merge_by_episode(result: EvalResult, name: str, variant_of: Mapping[str, str]) -> dict[str, object]:
  """Replace per-episode variants by one pipeline ``name``: each question takes the variant of its episode.

  Raises:
    ValueError: if an episode has no variant.
  """
  missing = sorted(set(result.episode_ids) - set(variant_of))
  if missing:
    raise ValueError(f'{name}: no fitted parameters for episodes {missing}')
  variants = list(dict.fromkeys(variant_of.values()))
  pick = [variant_of[e] for e in result.episode_ids]
  result.scores[name] = {
    m: np.array([result.scores[v][m][i] for i, v in enumerate(pick)]) for m in result.scores[variants[0]]
  }
  result.retrieved[name] = [result.retrieved[v][i] for i, v in enumerate(pick)]
  for v in variants:
    del result.scores[v], result.retrieved[v]
  return {'variant_of_episode': dict(variant_of)}
