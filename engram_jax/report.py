"""Aggregate per-question results into intervals, paired tests and a Markdown table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pathlib import Path

import numpy as np

from engram_jax import stats
from engram_jax.evaluation import EvalResult


BINARY = ('hit', 'recall_any', 'recall_all', 'answer', 'newest_first')


def is_binary(metric: str) -> bool:
  """0/1 metrics get Wilson intervals and McNemar tests."""
  return metric.partition('@')[0] in BINARY


def interval(v: np.ndarray, metric: str, *, seed: int, n_resamples: int) -> stats.Interval:
  if is_binary(metric):
    return stats.wilson_ci(v)
  return stats.bootstrap_ci(v, seed=seed, n_resamples=n_resamples)


def paired(a: np.ndarray, b: np.ndarray, metric: str, *, seed: int, n_resamples: int) -> dict[str, float]:
  out = stats.paired_test(a, b, seed=seed, n_resamples=n_resamples).to_dict()
  if is_binary(metric):
    out['mcnemar_p'] = stats.mcnemar_test(a, b)
  return out


def write_files(out_dir: Path, files: Mapping[str, str]) -> None:
  """Write a run's files (name -> text) into ``out_dir`` (created)."""
  out_dir.mkdir(parents=True, exist_ok=True)
  for name, text in files.items():
    (out_dir / name).write_text(text)


def category_label(cat: int | str, names: Mapping[Any, str]) -> str:
  name = names.get(cat, names.get(str(cat)))
  return f'{name} ({cat})' if name else str(cat)


def summarize(result: EvalResult, *, category_names: Mapping[Any, str], seed: int, n_resamples: int = 10_000,
              baselines: Sequence[str] = ()) -> dict[str, Any]:
  """Means with 95% intervals (bootstrap; Wilson for 0/1 metrics), overall and per category, and paired tests
  against ``baselines`` (bootstrap CI of the difference, sign-flip p; McNemar p too for 0/1 metrics).

  Returns a JSON-ready dict ``{NAME: {metric: mean, 'ci95': {metric: [lo, hi]}, 'by_category': {...},
  'paired': {'vs <baseline>': {metric: {delta, lo, hi, p, n}}}}}``.
  """
  cats = np.asarray([str(c) for c in result.categories])
  order = sorted(set(result.categories), key=lambda c: (str(type(c)), c))
  out: dict[str, Any] = {}
  for name, per_metric in result.scores.items():
    entry: dict[str, Any] = {'ci95': {}, 'by_category': {}, 'paired': {}}
    for m, v in per_metric.items():
      ci = interval(v, m, seed=seed, n_resamples=n_resamples)
      entry[m] = ci.mean
      entry['ci95'][m] = [ci.lo, ci.hi]
    for c in order:
      sel = cats == str(c)
      block: dict[str, Any] = {'n': int(sel.sum()), 'ci95': {}}
      for m, v in per_metric.items():
        ci = interval(v[sel], m, seed=seed, n_resamples=n_resamples)
        block[m] = ci.mean
        block['ci95'][m] = [ci.lo, ci.hi]
      entry['by_category'][category_label(c, category_names)] = block
    for base in baselines:
      if base == name or base not in result.scores:
        continue
      entry['paired'][f'vs {base}'] = {
          m: paired(v, result.scores[base][m], m, seed=seed, n_resamples=n_resamples)
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
  tests = [(name, vs, m, r) for name, e in summary.items() for vs, ms in e['paired'].items()
            for m, r in ms.items()]
  if tests:
    lines += ['', 'Paired differences (row minus baseline; bootstrap 95% CI; sign-flip permutation p; '
              'McNemar p for 0/1 metrics)', '',
              '| pipeline | baseline | metric | delta | 95% CI | p | McNemar p |', '|---|---|---|---|---|---|---|']
    for name, vs, m, r in tests:
      mc = f'{r["mcnemar_p"]:.4f}' if 'mcnemar_p' in r else ''
      lines.append(f'| {name} | {vs[3:]} | {m} | {r["delta"]:+.4f} | [{r["lo"]:+.4f}, {r["hi"]:+.4f}] '
                   f'| {r["p"]:.4f} | {mc} |')
  return '\n'.join(lines) + '\n'


def combined_table(per_dataset: Mapping[str, Mapping[str, Any]], *, order: Sequence[str],
                   reference: Mapping[str, Mapping[str, Any]] | None = None,
                   reference_label: str = 'published') -> str:
  """One row per pipeline, one column per (dataset, metric): mean [95% CI]; 'n/a' where a pipeline was not run.

  ``reference`` (``{row: {column: value}}``, columns named ``<dataset> <metric>``) adds labelled reference rows.
  """
  cols = [(d, m) for d, r in per_dataset.items() for m in r['metrics']]
  head = ['pipeline'] + [f'{d} {m} (n={per_dataset[d]["n_questions"]})' for d, m in cols]
  lines = ['### all datasets: mean [95% CI]', '', '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for name in order:
    row = [name]
    for d, m in cols:
      e = per_dataset[d]['pipelines'].get(name)
      row.append(_fmt(e[m], e['ci95'][m]) if e else 'n/a')
    lines.append('| ' + ' | '.join(row) + ' |')
  for name, ref in (reference or {}).items():
    row = [f'{name} ({reference_label})'] + [str(ref.get(f'{d} {m}', 'n/a')) for d, m in cols]
    lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines) + '\n'


def fits_markdown(fits: Mapping[str, Mapping[str, Any]]) -> str:
  lines = ['', 'Parameters fit on training questions (disjoint from every scored set, asserted):', '']
  for name, f in fits.items():
    grid = ', '.join(f'{v.split("[")[-1].rstrip("]")}: {m:.4f}' for v, m in f['grid'].items())
    lines.append(f'- {name}: chose {f["chosen"]} on {f["train_sets"]} ({f["n_train_questions"]} questions); '
                 f'grid {grid}')
  return '\n'.join(lines) + '\n'
