"""Paired tests between rows of finished runs (same dataset, same questions), from their results.json files.

  python -m experiments.compare A/results.json B/results.json                 # each pipeline of B against A's
  python -m experiments.compare A/results.json B/results.json --pairs cosine@2:cosine@1
  python -m experiments.compare outputs/tables/cfs_table/results.json \
      --pairs rrf_cos_bm25_cfs:rrf_cos_cos2_bm25_e30

A row is a pipeline of one file, written ``PIPELINE@N`` (N: the file's position, from 1); a bare ``PIPELINE`` is
accepted where only one file holds it. Both evaluate and fit results are read (a fit's rows are its summary rows,
e.g. ``rrf_cos_bm25_cfsr (fitted, out of fold)``). Without ``--pairs``: with one file every pipeline is compared
with its first; with several, each pipeline of file N with the pipeline of the same name in file 1. A pair of rows
from different datasets or different question sets is refused. The rows compared are printed first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.metrics import report, stats


class Row(NamedTuple):
  """One pipeline of one results file: its per-question metric values."""

  file: int  # position of the file on the command line, from 1
  path: Path
  pipeline: str
  dataset: str | None
  scores: dict[str, dict[str, float]]  # question id -> metric -> value

  @property
  def label(self) -> str:
    return f'{self.pipeline}@{self.file}'


def _fit_dataset(path: Path) -> str | None:
  """A fit's dataset name, from the ``config_resolved.yaml`` beside its results.json (None when absent)."""
  cfg = path.parent / 'config_resolved.yaml'
  if not cfg.is_file():
    return None
  import yaml

  node = yaml.safe_load(cfg.read_text()) or {}
  return (node.get('dataset') or {}).get('name')


def variant_labels(res: dict[str, Any]) -> list[str]:
  """The variants of an ``experiments.fit`` results.json (``fit.variants``: its ``(<label>, out of fold)`` rows
  beside the scalar fit's), in the run's order.

  >>> variant_labels({'pipeline': 'p', 'summary': {'p (fitted, out of fold)': {}, 'p (mine, out of fold)': {}},
  ...                 'variants': {'mine': {'per_question': {}}}})
  ['mine']
  """
  head, tail = f'{res["pipeline"]} (', ', out of fold)'
  labels = [r[len(head) : -len(tail)] for r in res.get('summary', {}) if r.startswith(head) and r.endswith(tail)]
  return [label for label in labels if label != 'fitted' and isinstance(variant_section(res, label), dict)]


def variant_section(res: dict[str, Any], label: str) -> dict[str, Any] | None:
  """Variant ``label``'s section of a fit's results.json: under ``variants`` (or, in a results.json written before
  issue 50, at its top level).

  >>> variant_section({'variants': {'mine': {'per_question': {}}}}, 'mine')
  {'per_question': {}}
  """
  return (res.get('variants') or res).get(label)


def _fit_rows(res: dict[str, Any], path: Path, file: int, dataset: str | None) -> list[Row]:
  """The rows of an ``experiments.fit`` results.json: hand-set, fitted (and each variant, e.g. adapter) out of fold."""
  pq, name, metrics = res['per_question'], res['pipeline'], res['metrics']
  ids = pq['question_ids']
  vectors = {f'{name} (fitted, out of fold)': pq['fitted'], f'{name} (hand-set)': pq['hand_set']}
  vectors.update({f'{b} (hand-set)': v for b, v in pq.get('baselines', {}).items()})
  for label in variant_labels(res):  # each variant of fit.variants in the run (its components' fit)
    vectors[f'{name} ({label}, out of fold)'] = variant_section(res, label)['per_question']
  dataset = dataset or _fit_dataset(path)
  return [
    Row(file, path, row, dataset, {q: {m: float(v[m][i]) for m in metrics} for i, q in enumerate(ids)})
    for row, v in vectors.items()
  ]


def read_rows(path: Path, file: int, dataset: str | None = None) -> list[Row]:
  """The rows of one results.json (``experiments.evaluate`` or ``experiments.fit``; a multi-dataset run needs
  ``dataset``); refused when its run folder is incomplete or mixed (:func:`engram_jax.core.runfolder.check`)."""
  runfolder.check_file(path)
  try:
    res = json.loads(Path(path).read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise EngramError(f'{path}: not a readable results.json ({e})') from None
  if 'datasets' in res:
    if dataset is None:
      raise EngramError(f'{path} holds several datasets {sorted(res["datasets"])}: pass --dataset')
    if dataset not in res['datasets']:
      raise EngramError(f'{path} has no dataset {dataset!r}; it holds {sorted(res["datasets"])}')
    res = res['datasets'][dataset]
  if isinstance(res.get('per_question'), dict):  # experiments.fit
    return _fit_rows(res, Path(path), file, dataset)
  if not isinstance(res.get('per_question'), list):
    raise EngramError(f'{path}: no per-question scores (not a results.json of experiments.evaluate or fit)')
  by_name: dict[str, dict[str, dict[str, float]]] = {}
  for q in res['per_question']:
    for name, ms in q['scores'].items():
      by_name.setdefault(name, {})[q['id']] = ms
  ds = res.get('dataset', dataset)
  return [Row(file, Path(path), name, ds, s) for name, s in by_name.items()]


def per_question_scores(paths: list[Path], dataset: str | None = None) -> list[Row]:
  """Every row of every file, in order (files numbered from 1)."""
  return [row for i, p in enumerate(paths, 1) for row in read_rows(p, i, dataset)]


def find_row(rows: list[Row], spec: str) -> Row:
  """The row named ``PIPELINE@N`` (file N) or ``PIPELINE`` (held by exactly one file)."""
  name, _, num = spec.rpartition('@')
  if name and num.isdigit():
    hits = [r for r in rows if r.pipeline == name and r.file == int(num)]
  else:
    name, hits = spec, [r for r in rows if r.pipeline == spec]
  if not hits:
    known = sorted(r.label for r in rows)
    raise EngramError(f'unknown pipeline {spec!r}; known rows (PIPELINE@FILE): {known}')
  if len(hits) > 1:
    raise EngramError(f'pipeline {name!r} is in several files ({[r.label for r in hits]}); name one as {name}@N')
  return hits[0]


def default_pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
  """One file: each pipeline against the first. Several: each pipeline of file N (N > 1) against the pipeline of
  the same name in file 1 (refused when none is shared)."""
  files = sorted({r.file for r in rows})
  if len(files) == 1:
    return [(r, rows[0]) for r in rows[1:]]
  first = {r.pipeline: r for r in rows if r.file == files[0]}
  pairs = [(r, first[r.pipeline]) for r in rows if r.file != files[0] and r.pipeline in first]
  if not pairs:
    raise EngramError(f'no pipeline name is shared with file 1 ({sorted(first)}); name the pairs with --pairs A@N:B@1')
  return pairs


def check_pair(a: Row, b: Row) -> list[str]:
  """The common question ids of two rows; refused across datasets or question sets."""
  if a.dataset != b.dataset and None not in (a.dataset, b.dataset):
    raise EngramError(f'{a.label} is on dataset {a.dataset!r} and {b.label} on {b.dataset!r}: not a paired comparison')
  qa, qb = set(a.scores), set(b.scores)
  if qa != qb:
    raise EngramError(
      f'{a.label} ({len(qa)} questions) and {b.label} ({len(qb)} questions) score different question sets '
      f'({len(qa - qb)} only in the first, {len(qb - qa)} only in the second, {len(qa & qb)} shared): not a paired '
      'comparison'
    )
  ma, mb = next(iter(a.scores.values())), next(iter(b.scores.values()))
  if not set(ma) & set(mb):
    raise EngramError(f'{a.label} ({sorted(ma)}) and {b.label} ({sorted(mb)}) share no metric')
  return sorted(qa)


def compare(pairs: list[tuple[Row, Row]], *, seed: int, n_resamples: int) -> list[dict]:
  rows = []
  for a, b in pairs:
    common = check_pair(a, b)
    metrics = [m for m in a.scores[common[0]] if m in b.scores[common[0]]]
    for m in metrics:
      x = np.array([a.scores[q][m] for q in common])
      y = np.array([b.scores[q][m] for q in common])
      rows.append(
        {
          'a': a.label,
          'b': b.label,
          'metric': m,
          'n': len(common),
          **report.paired(x, y, m, seed=seed, n_resamples=n_resamples),
        }
      )
  return rows


def check_distinct_files(paths: list[Path]) -> None:
  """The same results file given twice is refused: compared with itself, every row gives +0.0000 and p 1."""
  seen: dict[Path, int] = {}
  for i, p in enumerate(paths, 1):
    key = Path(p).resolve()
    if key in seen:
      raise EngramError(
        f'{p} is given twice (files {seen[key]} and {i}): a file compared with itself gives delta 0 and p 1 on every '
        'row; give two runs (or one file, to compare its pipelines with its first)'
      )
    seen[key] = i


def main(argv: list[str] | None = None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('results', nargs='+', type=Path)
  p.add_argument('--pairs', nargs='*', default=None, help='A:B pairs (A minus B), each PIPELINE@FILE or PIPELINE')
  p.add_argument('--dataset', default=None)
  p.add_argument('--seed', type=int, default=20261008)
  p.add_argument('--n-resamples', type=int, default=10_000)
  args = p.parse_args(argv)
  stats.check_resamples(args.n_resamples, where='--n-resamples')
  check_distinct_files(args.results)
  rows = per_question_scores(args.results, args.dataset)
  if args.pairs:
    specs = []
    for x in args.pairs:
      a, sep, b = x.partition(':')
      if not sep or not a or not b:
        raise EngramError(f'--pairs takes A:B (A minus B), got {x!r}')
      specs.append((a, b))
    pairs = [(find_row(rows, a), find_row(rows, b)) for a, b in specs]
  else:
    pairs = default_pairs(rows)
  for a, b in pairs:
    if a is b:
      raise EngramError(f'--pairs compares {a.label} with itself (delta 0 and p 1 by construction); name two rows')
    print(f'{a.label} ({a.path}, {a.dataset}) minus {b.label} ({b.path}, {b.dataset})')
    if a.scores == b.scores:
      print(f'note: {a.label} and {b.label} have identical per-question scores (delta 0, p 1: the same run twice?)')
  out = compare(pairs, seed=args.seed, n_resamples=args.n_resamples)
  print('| A | B | metric | n | delta (A - B) | 95% CI | p | McNemar p |\n|---|---|---|---|---|---|---|---|')
  for r in out:
    mc = f'{r["mcnemar_p"]:.4f}' if 'mcnemar_p' in r else ''
    print(
      f'| {r["a"]} | {r["b"]} | {r["metric"]} | {r["n"]} | {r["delta"]:+.4f} | [{r["lo"]:+.4f}, {r["hi"]:+.4f}] '
      f'| {r["p"]:.4f} | {mc} |'
    )
  return out


if __name__ == '__main__':
  from experiments.lib.common import plain_errors

  plain_errors(main)()
