"""Aggregate per-question results into intervals, paired tests and a Markdown table."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engram_jax.metrics import stats

if TYPE_CHECKING:  # the evaluation layer sits above the metrics: its result type is only named here
  from engram_jax.eval.evaluation import EvalResult

BINARY = ('hit', 'recall_any', 'recall_all', 'answer', 'newest_first', 'field_session_recall_any')


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


def _intervals(vectors: Sequence[tuple[str, np.ndarray]], *, seed: int, n_resamples: int) -> list[stats.Interval]:
  """Intervals of ``(metric, values [Q])`` pairs of one question subset: Wilson for 0/1 metrics, one batched
  bootstrap (:func:`engram_jax.metrics.stats.bootstrap_cis`) for the others."""
  out: list[stats.Interval | None] = [None] * len(vectors)
  boot = [i for i, (m, _) in enumerate(vectors) if not is_binary(m)]
  for i, (m, v) in enumerate(vectors):
    if is_binary(m):
      out[i] = stats.wilson_ci(v)
  if boot:
    cis = stats.bootstrap_cis(np.stack([vectors[i][1] for i in boot]), seed=seed, n_resamples=n_resamples)
    for i, ci in zip(boot, cis):
      out[i] = ci
  return out  # type: ignore[return-value]


def summarize(
  result: EvalResult,
  *,
  category_names: Mapping[Any, str],
  seed: int,
  n_resamples: int = 10_000,
  baselines: Sequence[str] = (),
) -> dict[str, Any]:
  """Means with 95% intervals (bootstrap; Wilson for 0/1 metrics), overall and per category, and paired tests
  against ``baselines`` (bootstrap CI of the difference, sign-flip p; McNemar p too for 0/1 metrics).

  One bootstrap pass over all questions (:func:`engram_jax.metrics.stats.bootstrap_means` of every row that needs an
  interval or is a side of a pair) gives the overall intervals and, as differences of its replicates, the paired
  intervals; one pass per category; one sign-flip pass for all pairs. The passes are independent and run on up to
  2 threads. Each row's numbers equal those of a call on that row alone (:func:`interval`, :func:`paired`,
  :func:`engram_jax.metrics.stats.bootstrap_ci` on a category's values).

  Returns a JSON-ready dict ``{NAME: {metric: mean, 'ci95': {metric: [lo, hi]}, 'by_category': {...},
  'paired': {'vs <baseline>': {metric: {delta, lo, hi, p, n}}}}}``.
  """
  cats = np.asarray([str(c) for c in result.categories])
  order = sorted(set(result.categories), key=lambda c: (str(type(c)), c))
  keys = [(name, m) for name, per_metric in result.scores.items() for m in per_metric]
  pairs = [(name, base, m) for name, m in keys for base in baselines if base != name and base in result.scores]
  # rows of the all-question pass: those with a bootstrap interval, and both sides of every pair
  rows = list(
    dict.fromkeys(
      [k for k in keys if not is_binary(k[1])] + [(n, m) for n, _, m in pairs] + [(b, m) for _, b, m in pairs]
    )
  )
  row_of = {k: i for i, k in enumerate(rows)}
  values = np.stack([result.scores[n][m] for n, m in rows]) if rows else np.zeros((0, len(cats)))
  a = np.stack([result.scores[n][m] for n, _, m in pairs]) if pairs else np.zeros((0, len(cats)))
  b = np.stack([result.scores[base][m] for _, base, m in pairs]) if pairs else np.zeros((0, len(cats)))
  sels = [cats == str(c) for c in order]
  by_size = sorted(range(len(sels)), key=lambda i: -int(sels[i].sum()))  # largest category first: balanced threads
  tasks: list[Callable[[], Any]] = [
    lambda: stats.bootstrap_means(values, seed=seed, n_resamples=n_resamples) if rows else None,
    lambda: stats.sign_flip_pvalues(a - b, seed=seed + 1, n_resamples=n_resamples) if pairs else None,
  ]
  tasks += [
    lambda sel=sels[i]: _intervals([(m, result.scores[n][m][sel]) for n, m in keys], seed=seed, n_resamples=n_resamples)
    for i in by_size
  ]
  reps, pvalues, *done = stats.run_tasks(tasks)
  cat_cis = [done[by_size.index(i)] for i in range(len(sels))]

  out: dict[str, Any] = {name: {'ci95': {}, 'by_category': {}, 'paired': {}} for name in result.scores}
  boot_cis = stats.percentile_intervals(values, reps) if rows else []
  for name, m in keys:
    ci = stats.wilson_ci(result.scores[name][m]) if is_binary(m) else boot_cis[row_of[name, m]]
    out[name][m] = ci.mean
    out[name]['ci95'][m] = [ci.lo, ci.hi]
  for c, sel, cis in zip(order, sels, cat_cis):
    label = category_label(c, category_names)
    for name in result.scores:
      out[name]['by_category'][label] = {'n': int(sel.sum()), 'ci95': {}}
    for (name, m), ci in zip(keys, cis):
      block = out[name]['by_category'][label]
      block[m] = ci.mean
      block['ci95'][m] = [ci.lo, ci.hi]
  if pairs:
    deltas = reps[[row_of[n, m] for n, _, m in pairs]] - reps[[row_of[base, m] for _, base, m in pairs]]
    for (name, base, m), res, x, y in zip(pairs, stats.paired_results(a - b, deltas, pvalues), a, b):
      entry = res.to_dict()
      if is_binary(m):
        entry['mcnemar_p'] = stats.mcnemar_test(x, y)
      out[name]['paired'].setdefault(f'vs {base}', {})[m] = entry
  return out


def per_question(result: EvalResult) -> list[dict[str, Any]]:
  """One record per question: ids, category, gold count, each pipeline's metrics and retrieved ids."""
  # each score row converted once (``tolist`` gives the Python floats of ``float(v[i])``)
  scores = [(p, [(m, np.asarray(v, np.float64).tolist()) for m, v in ms.items()]) for p, ms in result.scores.items()]
  retrieved = list(result.retrieved.items())
  return [
    {
      'id': qid,
      'episode': result.episode_ids[i],
      'category': result.categories[i],
      'n_gold': result.n_gold[i],
      'scores': {p: {m: v[i] for m, v in ms} for p, ms in scores},
      'retrieved': {p: ids[i] for p, ids in retrieved},
    }
    for i, qid in enumerate(result.question_ids)
  ]


def _fmt(mean: float, ci: Sequence[float]) -> str:
  return f'{mean:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]'


def markdown_table(
  summary: Mapping[str, Any],
  *,
  metrics: Sequence[str],
  title: str = '',
  reference: Mapping[str, Mapping[str, float]] | None = None,
  reference_label: str = 'published',
) -> str:
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
  tests = [(name, vs, m, r) for name, e in summary.items() for vs, ms in e['paired'].items() for m, r in ms.items()]
  if tests:
    lines += [
      '',
      'Paired differences (row minus baseline; bootstrap 95% CI; sign-flip permutation p; McNemar p for 0/1 metrics)',
      '',
      '| pipeline | baseline | metric | delta | 95% CI | p | McNemar p |',
      '|---|---|---|---|---|---|---|',
    ]
    for name, vs, m, r in tests:
      mc = f'{r["mcnemar_p"]:.4f}' if 'mcnemar_p' in r else ''
      lines.append(
        f'| {name} | {vs[3:]} | {m} | {r["delta"]:+.4f} | [{r["lo"]:+.4f}, {r["hi"]:+.4f}] | {r["p"]:.4f} | {mc} |'
      )
  return '\n'.join(lines) + '\n'


def combined_table(
  per_dataset: Mapping[str, Mapping[str, Any]],
  *,
  order: Sequence[str],
  reference: Mapping[str, Mapping[str, Any]] | None = None,
  reference_label: str = 'published',
) -> str:
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
    lines.append(
      f'- {name}: chose {f["chosen"]} on {f["train_sets"]} ({f["n_train_questions"]} questions); grid {grid}'
    )
  return '\n'.join(lines) + '\n'
