"""The CFS post's harmful pile-up subset and evidence-cluster recall (NumPy; analysis, not an operator).

Harmful pile-up (per question): cosine's top-10 misses at least one gold item that cosine ranks 11-50,
while cosine's top-10 holds a *redundant non-gold pair*: two non-gold items whose mutual cosine is
``>= threshold`` (0.75).

Evidence clusters: the question's gold items grouped into connected components of the graph
"mutual cosine >= threshold" (paraphrases of one fact form one cluster). Evidence-cluster recall@k =
the fraction of clusters with at least one member in the top k.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engram_jax.core.types import Episode
from engram_jax.eval.evaluation import EvalResult
from engram_jax.metrics import stats


def cosine_order(query: np.ndarray, docs: np.ndarray) -> np.ndarray:
  """Item indices by cosine, descending, ties to the later item (the shared rule). ``[D], [N, D] -> [N]``."""
  s = docs @ query
  return np.lexsort((-np.arange(len(s)), -s))


def is_harmful_pileup(
  order: np.ndarray,
  gold: set[int],
  gram: np.ndarray,
  *,
  top: int = 10,
  window: tuple[int, int] = (11, 50),
  threshold: float = 0.75,
) -> bool:
  """Whether one question is in the harmful pile-up subset (see module docstring)."""
  head = order[:top]
  missed = [i for i in order[window[0] - 1 : window[1]] if i in gold]
  if not missed:
    return False
  non_gold = [i for i in head if i not in gold]
  sims = gram[np.ix_(non_gold, non_gold)]
  return bool(np.any(np.triu(sims >= threshold, k=1)))


def gold_clusters(gold: Sequence[int], gram: np.ndarray, *, threshold: float = 0.75) -> list[set[int]]:
  """Connected components of the gold items under mutual cosine ``>= threshold``."""
  gold = list(gold)
  adj = gram[np.ix_(gold, gold)] >= threshold
  from scipy.sparse import csgraph  # ~0.3-0.6 s at start-up otherwise

  n, labels = csgraph.connected_components(adj, directed=False)
  return [{gold[j] for j in np.flatnonzero(labels == c)} for c in range(n)]


def cluster_recall(retrieved: Sequence[int], clusters: Sequence[set[int]]) -> float:
  got = set(retrieved)
  return sum(bool(c & got) for c in clusters) / len(clusters)


def pileup_report(
  episodes: Sequence[Episode],
  embeddings: Sequence[tuple[np.ndarray, np.ndarray]],
  result: EvalResult,
  *,
  categories: Sequence[Any],
  baselines: Sequence[str],
  seed: int,
  threshold: float = 0.75,
  n_resamples: int = 10_000,
) -> dict[str, Any]:
  """Subset sizes and evidence-cluster recall@k per pipeline on the harmful pile-up subset of each category.

  Returns ``{str(category): {'n': int, 'pipelines': {name: {'cluster_recall': mean, 'ci95': [lo, hi],
  'paired': {'vs <b>': {...}}}}}}``.
  """
  row = {qid: i for i, qid in enumerate(result.question_ids)}
  out: dict[str, Any] = {}
  for cat in categories:
    rows: list[int] = []
    values: dict[str, list[float]] = {name: [] for name in result.retrieved}
    for ep, (docs, queries) in zip(episodes, embeddings):
      gram = docs @ docs.T
      index = ep.index_of()
      for q, qe in zip(ep.questions, queries):
        if q.category != cat:
          continue
        gold = {index[g] for g in q.gold}
        if not is_harmful_pileup(cosine_order(qe, docs), gold, gram, threshold=threshold):
          continue
        i = row[q.id]
        rows.append(i)
        clusters = gold_clusters(sorted(gold), gram, threshold=threshold)
        for name, ret in result.retrieved.items():
          values[name].append(cluster_recall([index[x] for x in ret[i]], clusters))
    block: dict[str, Any] = {'n': len(rows), 'pipelines': {}}
    for name, v in values.items():
      if not v:
        continue
      ci = stats.bootstrap_ci(np.array(v), seed=seed, n_resamples=n_resamples)
      entry: dict[str, Any] = {'cluster_recall': ci.mean, 'ci95': [ci.lo, ci.hi], 'paired': {}}
      for b in baselines:
        if b != name and b in values:
          entry['paired'][f'vs {b}'] = stats.paired_test(
            np.array(v), np.array(values[b]), seed=seed, n_resamples=n_resamples
          ).to_dict()
      block['pipelines'][name] = entry
    out[str(cat)] = block
  return out


def pileup_markdown(report: Mapping[str, Any], names: Mapping[Any, str]) -> str:
  lines = ['', 'Harmful pile-up subset: evidence-cluster recall@10 (paired vs baselines: delta [95% CI])', '']
  for cat, block in report.items():
    label = names.get(int(cat), cat) if str(cat).isdigit() else cat
    lines += [
      f'category {cat} ({label}): {block["n"]} questions',
      '',
      '| pipeline | cluster recall [95% CI] | paired |',
      '|---|---|---|',
    ]
    for name, e in block['pipelines'].items():
      paired = '; '.join(f'{vs}: {r["delta"]:+.4f} [{r["lo"]:+.4f}, {r["hi"]:+.4f}]' for vs, r in e['paired'].items())
      lines.append(f'| {name} | {e["cluster_recall"]:.4f} [{e["ci95"][0]:.4f}, {e["ci95"][1]:.4f}] | {paired} |')
    lines.append('')
  return '\n'.join(lines)
