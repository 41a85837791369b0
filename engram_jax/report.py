"""Aggregate per-question results into intervals, paired tests and a Markdown table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engram_jax import stats
from engram_jax.evaluation import EvalResult


def category_label(cat: int | str, names: Mapping[Any, str]) -> str:
  name = names.get(cat, names.get(str(cat)))
  return f'{name} ({cat})' if name else str(cat)


def summarize(result: EvalResult, *, category_names: Mapping[Any, str], seed: int, n_resamples: int = 10_000,
              baselines: Sequence[str] = ()) -> dict[str, Any]:
  """Means with 95% bootstrap intervals, overall and per category, and paired tests against ``baselines``.

  Returns a JSON-ready dict ``{NAME: {metric: mean, 'ci95': {metric: [lo, hi]}, 'by_category': {...},
  'paired': {'vs <baseline>': {metric: {delta, lo, hi, p, n}}}}}``.
  """
  cats = np.asarray([str(c) for c in result.categories])
  order = sorted(set(result.categories), key=lambda c: (str(type(c)), c))
  out: dict[str, Any] = {}
  for name, per_metric in result.scores.items():
    entry: dict[str, Any] = {'ci95': {}, 'by_category': {}, 'paired': {}}
    for m, v in per_metric.items():
      ci = stats.bootstrap_ci(v, seed=seed, n_resamples=n_resamples)
      entry[m] = ci.mean
      entry['ci95'][m] = [ci.lo, ci.hi]
    for c in order:
      sel = cats == str(c)
      block: dict[str, Any] = {'n': int(sel.sum()), 'ci95': {}}
      for m, v in per_metric.items():
        ci = stats.bootstrap_ci(v[sel], seed=seed, n_resamples=n_resamples)
        block[m] = ci.mean
        block['ci95'][m] = [ci.lo, ci.hi]
      entry['by_category'][category_label(c, category_names)] = block
    for base in baselines:
      if base == name or base not in result.scores:
        continue
      entry['paired'][f'vs {base}'] = {
          m: stats.paired_test(v, result.scores[base][m], seed=seed, n_resamples=n_resamples).to_dict()
          for m, v in per_metric.items()}
    out[name] = entry
  return out


def per_question(result: EvalResult) -> list[dict[str, Any]]:
  """One record per question: ids, category, gold count, each pipeline's metrics and retrieved ids."""
  rows = []
  for i, qid in enumerate(result.question_ids):
    rows.append({
        'id': qid, 'episode': result.episode_ids[i], 'category': result.categories[i],
        'n_gold': result.n_gold[i],
        'scores': {p: {m: float(v[i]) for m, v in ms.items()} for p, ms in result.scores.items()},
        'retrieved': {p: ids[i] for p, ids in result.retrieved.items()}})
  return rows


def _fmt(mean: float, ci: Sequence[float]) -> str:
  return f'{mean:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]'


def markdown_table(summary: Mapping[str, Any], *, metrics: Sequence[str], title: str = '',
                   reference: Mapping[str, Mapping[str, float]] | None = None,
                   reference_label: str = 'published') -> str:
  """Markdown: overall means with CIs (+ a labelled reference column), per-category means, paired tests."""
  lines = [f'### {title}', ''] if title else []
  ref_cols = [f'{m} ({reference_label})' for m in metrics] if reference else []
  head = ['pipeline'] + [f'{m} [95% CI]' for m in metrics] + ref_cols
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for name, e in summary.items():
    row = [name] + [_fmt(e[m], e['ci95'][m]) for m in metrics]
    if reference:
      ref = reference.get(name, {})
      row += [f'{ref[m]:.4f}' if m in ref else 'n/a' for m in metrics]
    lines.append('| ' + ' | '.join(row) + ' |')
  cats = list(next(iter(summary.values()))['by_category'])
  for m in metrics:
    lines += ['', f'{m} by category (n questions in header)', '']
    n = next(iter(summary.values()))['by_category']
    head = ['pipeline'] + [f'{c} n={n[c]["n"]}' for c in cats]
    lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, e in summary.items():
      lines.append('| ' + ' | '.join([name] + [f'{e["by_category"][c][m]:.4f}' for c in cats]) + ' |')
  paired = [(name, vs, m, r) for name, e in summary.items() for vs, ms in e['paired'].items()
            for m, r in ms.items()]
  if paired:
    lines += ['', 'Paired differences (row minus baseline; bootstrap 95% CI; sign-flip permutation p)', '',
              '| pipeline | baseline | metric | delta | 95% CI | p |', '|---|---|---|---|---|---|']
    for name, vs, m, r in paired:
      lines.append(f'| {name} | {vs[3:]} | {m} | {r["delta"]:+.4f} | [{r["lo"]:+.4f}, {r["hi"]:+.4f}] '
                   f'| {r["p"]:.4f} |')
  return '\n'.join(lines) + '\n'
