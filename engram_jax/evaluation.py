"""Run pipelines over episodes and collect per-question metrics."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from engram_jax import metrics as metrics_lib
from engram_jax.pipeline import EpisodeArrays, Pipeline, check_equal_k, episode_arrays, pipeline_topk
from engram_jax.types import Episode


@dataclasses.dataclass
class EvalResult:
  """Per-question outcomes of several pipelines on the same questions (row i is the same question)."""

  question_ids: list[str]
  episode_ids: list[str]
  categories: list[int | str]
  n_gold: list[int]
  scores: dict[str, dict[str, np.ndarray]]  # pipeline -> metric -> [Q_total]
  retrieved: dict[str, list[list[str]]]     # pipeline -> per question top-k item ids
  k: int


def embed_episodes(episodes: Sequence[Episode], embed: Callable[[list[str]], np.ndarray]
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
  """Embed every item and question text once; returns ``[(docs [N, D], queries [Q, D])]`` per episode."""
  texts: list[str] = []
  for ep in episodes:
    texts.extend(it.text for it in ep.items)
    texts.extend(q.text for q in ep.questions)
  vecs = embed(texts)
  out, at = [], 0
  for ep in episodes:
    n, q = ep.n_items, len(ep.questions)
    out.append((vecs[at:at + n], vecs[at + n:at + n + q]))
    at += n + q
  return out


def evaluate(episodes: Sequence[Episode], embeddings: Sequence[tuple[np.ndarray, np.ndarray]],
             pipelines: Mapping[str, Pipeline], *, k: int, metrics: Sequence[str], seed: int,
             progress: bool = True, arrays: Sequence[EpisodeArrays] | None = None) -> EvalResult:
  """Run each pipeline on each episode, assert equal ``k``, and score every question.

  Raises:
    ValueError: if ``k`` exceeds an episode's number of items, or a metric's cutoff exceeds ``k``.
  """
  parsed = [(m, *metrics_lib.parse_metric(m)) for m in metrics]
  for m, _, cut in parsed:
    if cut > k:
      raise ValueError(f'Metric {m} needs {cut} results but pipelines return k={k}')
  for ep in episodes:
    if ep.n_items < k:
      raise ValueError(f'k={k} is larger than episode {ep.id} ({ep.n_items} items)')
  if arrays is None:
    arrays = [episode_arrays(ep, d, q) for ep, (d, q) in zip(episodes, embeddings)]
  fns = {name: jax.jit(functools.partial(pipeline_topk, p, k=k)) for name, p in pipelines.items()}
  result = EvalResult(
      question_ids=[q.id for ep in episodes for q in ep.questions],
      episode_ids=[ep.id for ep in episodes for _ in ep.questions],
      categories=[q.category for ep in episodes for q in ep.questions],
      n_gold=[len(q.gold) for ep in episodes for q in ep.questions],
      scores={name: {m: [] for m, _, _ in parsed} for name in pipelines},
      retrieved={name: [] for name in pipelines}, k=k)
  base_key = jax.random.key(seed)
  steps = [(name, e) for name in pipelines for e in range(len(episodes))]
  for name, e in tqdm(steps, desc='pipelines x episodes', disable=not progress):
    ep, arr = episodes[e], arrays[e]
    nq = len(ep.questions)
    topk = np.asarray(fns[name](arr, jax.random.fold_in(base_key, e)))
    check_equal_k(topk, nq, k=k, name=name, episode=ep.id)
    labels = np.asarray(arr.labels)
    for m, base, cut in parsed:
      vals = np.asarray(metrics_lib.METRICS[base](topk, labels, k=cut))[:nq]
      result.scores[name][m].append(vals)
    result.retrieved[name].extend([[ep.items[i].id for i in row] for row in topk[:nq].tolist()])
  for name in pipelines:
    for m in result.scores[name]:
      result.scores[name][m] = np.concatenate(result.scores[name][m]).astype(np.float64)
  return result
