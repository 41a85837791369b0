"""Collect a Hydra multirun: one table of every job x pipeline (mean [95% CI]) with paired tests against one row.

  python -m experiments.collect outputs/multiruns/2026-12-01_10-00-00
  python -m experiments.collect SWEEP --against 3 --against-pipeline cosine --metric ndcg

Reads each job folder's ``.hydra/overrides.yaml`` and ``results.json`` (``experiments.evaluate``); a job is labelled
by the overrides that differ between the jobs. Means and intervals are the job's own (its ``results.json``);
paired tests (bootstrap CI of the mean difference, sign-flip p, McNemar p for 0/1 metrics; one batched
``engram_jax.metrics.stats.paired_tests`` pass per question set) compare every row with the reference row on the
questions they share (the count is reported; the header says whether all jobs scored the same questions).
``--metric`` is a full name (``ndcg@10``) or a base name (``ndcg``: each job's own cutoff, so a sweep over
``eval.k`` lines up). Writes ``collect.md`` and ``collect.json`` into the multirun folder (the jobs' wall times,
from ``run_info.json``, sit apart under ``timing``) and prints the table. Jobs without ``results.json`` (failed or
still running) are listed, not fatal; a job whose folder is incomplete or mixed (:func:`engram_jax.core.runfolder.check`:
killed while writing, or rerun into), a damaged ``results.json``, a grid job and a fit job are refused in one line
naming the file, as are a single run folder and a folder without jobs.

Several finished runs outside one multirun: ``experiments.compare``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import yaml

from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.metrics import report, stats
from experiments import compare


class Job(NamedTuple):
  num: str  # the job's folder name (Hydra's job number)
  folder: Path
  overrides: tuple[str, ...]


class Row(NamedTuple):
  job: str
  label: str
  pipeline: str
  metric: str
  mean: float
  ci: tuple[float, float]
  scores: dict[str, float]  # question id -> value


def _order(name: str) -> tuple[int, int | str]:
  return (0, int(name)) if name.isdigit() else (1, name)


def _overrides(path: Path) -> tuple[str, ...]:
  try:
    got = yaml.safe_load(path.read_text()) or []
  except (OSError, yaml.YAMLError) as e:
    raise EngramError(f'{path}: not a readable overrides file ({type(e).__name__}: {e})') from None
  if not isinstance(got, list):
    raise EngramError(f'{path}: not a list of overrides (got {type(got).__name__})')
  return tuple(str(o) for o in got)


def find_jobs(folder: Path) -> list[Job]:
  """The job folders of a multirun (each holds ``.hydra/overrides.yaml``), by job number."""
  if not folder.is_dir():
    raise EngramError(f'{folder}: no such folder (a Hydra multirun folder, hydra.sweep.dir)')
  jobs = []
  for sub in sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: _order(p.name)):
    path = sub / '.hydra' / 'overrides.yaml'
    if path.is_file():
      jobs.append(Job(sub.name, sub, _overrides(path)))
  if not jobs and runfolder.is_run_folder(folder):
    raise EngramError(
      f'{folder} is a single run folder, not a multirun (whose jobs are numbered subfolders): compare finished runs '
      f'with python -m experiments.compare {folder / "results.json"} OTHER/results.json'
    )
  if not jobs:
    raise EngramError(f'{folder}: no job folders (with .hydra/overrides.yaml); is this a Hydra multirun folder?')
  return jobs


def job_labels(jobs: Sequence[Job]) -> dict[str, str]:
  """Job number -> the overrides that differ between the jobs (all of a job's overrides when none differ)."""
  common = set.intersection(*(set(j.overrides) for j in jobs))
  out = {}
  for j in jobs:
    varying = [o for o in j.overrides if o not in common or len(jobs) == 1]
    out[j.num] = ' '.join(varying) or '(no overrides)'
  return out


def resolve_metric(name: str, metrics: Sequence[str], k: int | None = None) -> str | None:
  """``name`` if the job scored it; for a base name (no ``@``) the job's metric of that base, the one at the job's
  ``k`` when there are several; None when the job has none."""
  if '@' in name:
    return name if name in metrics else None
  same = [m for m in metrics if m.partition('@')[0] == name]
  at_k = [m for m in same if m == f'{name}@{k}']
  return (at_k or same or [None])[0]


def _dataset_results(res: dict[str, Any], dataset: str | None, where: Path) -> dict[str, Any]:
  if 'datasets' not in res:
    return res
  if dataset is None:
    raise EngramError(f'{where} holds several datasets {sorted(res["datasets"])}: pass --dataset')
  if dataset not in res['datasets']:
    raise EngramError(f'{where} has no dataset {dataset!r}; it holds {sorted(res["datasets"])}')
  return res['datasets'][dataset]


def read_job(job: Job) -> dict[str, Any] | None:
  """A job's ``results.json`` (None when it has none: failed or running), checked: the job's folder whole
  (:func:`engram_jax.core.runfolder.check`), the file readable and an ``experiments.evaluate`` job's."""
  path = job.folder / 'results.json'
  if not path.is_file():
    if (job.folder / 'grid.json').is_file() or (job.folder / 'grid.npz').is_file():
      raise EngramError(
        f'{job.folder}: a grid job (grid.json, no results.json): collect reads experiments.evaluate jobs; a grid '
        'ranks its own points (grid.md), python -m experiments.research.plateau reads its grid.npz'
      )
    return None
  runfolder.check(job.folder, ['results.json'])
  try:
    res = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise EngramError(f'{path}: not a readable results.json ({type(e).__name__}: {e})') from None
  if not isinstance(res, dict) or isinstance(res.get('per_question'), dict):
    raise EngramError(
      f'{path}: not a results.json of experiments.evaluate (a fit job?); compare fits with python -m '
      'experiments.compare'
    )
  return res


def load_rows(
  jobs: Sequence[Job], metric: str | None, dataset: str | None = None
) -> tuple[list[Row], list[dict[str, str]], dict[str, float], str]:
  """One row per (job, pipeline) with a ``results.json``.

  Returns:
    ``(rows, missing, timing, metric)``: ``missing`` lists jobs without results (or without the metric),
    ``timing`` maps job number to its wall seconds (``run_info.json``), ``metric`` is the name asked for
    (default: the base name of the first job's first metric).
  """
  labels = job_labels(jobs)
  rows, missing, timing = [], [], {}
  for job in jobs:
    path = job.folder / 'results.json'
    got = read_job(job)
    if got is None:
      missing.append({'job': job.num, 'label': labels[job.num], 'why': 'no results.json (failed or running)'})
      continue
    res = _dataset_results(got, dataset, path)
    metric = metric or res['metrics'][0].partition('@')[0]
    name = resolve_metric(metric, res['metrics'], res.get('k'))
    if name is None:
      missing.append({'job': job.num, 'label': labels[job.num], 'why': f'no metric {metric} in {res["metrics"]}'})
      continue
    scores = {r.pipeline: r.scores for r in compare.per_question_scores([path], dataset)}  # one file: one row each
    for pipe, summary in res['pipelines'].items():
      per_q = {q: ms[name] for q, ms in scores[pipe].items()}
      rows.append(
        Row(
          job.num,
          labels[job.num],
          pipe,
          name,
          float(summary[name]),
          tuple(float(x) for x in summary['ci95'][name]),
          per_q,
        )
      )
    info = job.folder / 'run_info.json'
    if info.is_file():
      timing[job.num] = float(json.loads(info.read_text())['timing']['wall_s'])
  if not rows:
    raise EngramError(f'no finished job scored {metric}: {missing}')
  return rows, missing, timing, metric


def find_reference(rows: Sequence[Row], jobs: Sequence[Job], against: str | None, pipeline: str | None) -> int:
  """Index of the reference row: job ``against`` (a job number, or overrides it has, space-separated; default the
  first finished job) and its pipeline ``pipeline`` (default its first)."""
  if against is None:
    job = rows[0].job
  elif against in {j.num for j in jobs}:
    job = against
  else:
    want = set(against.split())
    hits = [j.num for j in jobs if want <= set(j.overrides)]
    if len(hits) != 1:
      labels = job_labels(jobs)
      raise EngramError(
        f'--against {against!r} matches jobs {hits}; give a job number or overrides naming one job: {labels}'
      )
    job = hits[0]
  mine = [i for i, r in enumerate(rows) if r.job == job]
  if not mine:
    raise EngramError(f'job {job} has no results to compare against')
  if pipeline is None:
    return mine[0]
  hit = [i for i in mine if rows[i].pipeline == pipeline]
  if not hit:
    raise EngramError(f'job {job} has no pipeline {pipeline!r}; it has {[rows[i].pipeline for i in mine]}')
  return hit[0]


def paired_against(rows: Sequence[Row], ref: int, *, seed: int, n_resamples: int) -> list[dict[str, Any] | None]:
  """Each row minus the reference row on their shared questions, in the reference job's question order (None for
  the reference itself): one batched :func:`engram_jax.metrics.stats.paired_tests` pass per distinct shared-question set
  (a row's numbers do not depend on the batch), McNemar p for 0/1 metrics. With the run's seed, a pair of one job
  gets the numbers of that job's own ``results.json``."""
  base = rows[ref]
  groups: dict[tuple[str, ...], list[int]] = {}
  for i, row in enumerate(rows):
    if i != ref:
      groups.setdefault(tuple(q for q in base.scores if q in row.scores), []).append(i)  # the reference's order
  out: list[dict[str, Any] | None] = [None] * len(rows)
  for qids, members in groups.items():
    if not qids:
      for i in members:
        out[i] = {'n': 0}
      continue
    a = np.array([[rows[i].scores[q] for q in qids] for i in members])
    b = np.array([base.scores[q] for q in qids])
    results = stats.paired_tests(a, np.broadcast_to(b, a.shape), seed=seed, n_resamples=n_resamples)
    for i, x, res in zip(members, a, results):
      entry = res.to_dict()
      if report.is_binary(rows[i].metric) and report.is_binary(base.metric):
        entry['mcnemar_p'] = stats.mcnemar_test(x, b)
      out[i] = entry
  return out


def collect(
  folder: Path,
  *,
  metric: str | None = None,
  against: str | None = None,
  against_pipeline: str | None = None,
  dataset: str | None = None,
  seed: int = 20261008,
  n_resamples: int = 10_000,
) -> dict[str, Any]:
  """The multirun in ``folder`` as one JSON-ready table (see the module docstring)."""
  jobs = find_jobs(folder)
  rows, missing, timing, metric = load_rows(jobs, metric, dataset)
  ref = find_reference(rows, jobs, against, against_pipeline)
  tests = paired_against(rows, ref, seed=seed, n_resamples=n_resamples)
  qsets = {tuple(sorted(r.scores)) for r in rows}
  return {
    'metric': metric,
    'seed': seed,
    'n_resamples': n_resamples,
    'n_jobs': len(jobs),
    'same_questions': len(qsets) == 1,
    'reference': {
      'job': rows[ref].job,
      'label': rows[ref].label,
      'pipeline': rows[ref].pipeline,
      'metric': rows[ref].metric,
    },
    'rows': [
      {
        'job': r.job,
        'label': r.label,
        'pipeline': r.pipeline,
        'metric': r.metric,
        'n': len(r.scores),
        'mean': r.mean,
        'ci95': list(r.ci),
        'vs_reference': t,
      }
      for r, t in zip(rows, tests)
    ],
    'missing': missing,
    'timing': {'wall_s': timing},
  }


def markdown(table: dict[str, Any], title: str) -> str:
  """The collected table as Markdown: one row per job x pipeline, the paired test against the reference."""
  ref = table['reference']
  same = (
    'all jobs scored the same questions'
    if table['same_questions']
    else 'question sets differ between jobs: each test uses the questions shared with the reference (n)'
  )
  lines = [
    f'### {title}: {table["n_jobs"]} jobs, {table["metric"]}',
    '',
    f'Reference: job {ref["job"]} ({ref["label"]}) / {ref["pipeline"]}; {same}. Paired: row minus reference, '
    'bootstrap 95% CI, sign-flip p (McNemar p for 0/1 metrics).',
    '',
    '| job | overrides | pipeline | metric | n | mean [95% CI] | delta vs reference [95% CI] | p | McNemar p |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for r in table['rows']:
    t = r['vs_reference']
    mean = f'{r["mean"]:.4f} [{r["ci95"][0]:.4f}, {r["ci95"][1]:.4f}]'
    if t is None:
      test = ['reference', '', '']
    elif t['n'] == 0:
      test = ['no shared questions', '', '']
    else:
      test = [
        f'{t["delta"]:+.4f} [{t["lo"]:+.4f}, {t["hi"]:+.4f}]' + ('' if t['n'] == r['n'] else f' (n={t["n"]})'),
        f'{t["p"]:.4f}',
        f'{t["mcnemar_p"]:.4f}' if 'mcnemar_p' in t else '',
      ]
    lines.append('| ' + ' | '.join([r['job'], r['label'], r['pipeline'], r['metric'], str(r['n']), mean] + test) + ' |')
  if table['missing']:
    lines += ['', 'Not in the table:', ''] + [f'- job {m["job"]} ({m["label"]}): {m["why"]}' for m in table['missing']]
  if table['timing']['wall_s']:
    lines += [
      '',
      'Wall time per job (run_info.json): '
      + ', '.join(f'{j}: {s:.1f} s' for j, s in table['timing']['wall_s'].items()),
    ]
  return '\n'.join(lines) + '\n'


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('folder', type=Path, help='a Hydra multirun folder (hydra.sweep.dir)')
  p.add_argument('--metric', default=None, help="ndcg@10, or a base name (ndcg) for each job's own cutoff")
  p.add_argument('--against', default=None, help='reference job: its number, or overrides it has (space-separated)')
  p.add_argument('--against-pipeline', default=None, help="the reference job's pipeline (default: its first)")
  p.add_argument('--dataset', default=None, help='the dataset of multi-dataset runs')
  p.add_argument('--seed', type=int, default=20261008)
  p.add_argument('--n-resamples', type=int, default=10_000)
  args = p.parse_args(argv)
  stats.check_resamples(args.n_resamples, where='--n-resamples')
  table = collect(
    args.folder,
    metric=args.metric,
    against=args.against,
    against_pipeline=args.against_pipeline,
    dataset=args.dataset,
    seed=args.seed,
    n_resamples=args.n_resamples,
  )
  text = markdown(table, args.folder.name)
  report.write_files(args.folder, {'collect.json': json.dumps(table, indent=1) + '\n', 'collect.md': text})
  print(text)
  return table


if __name__ == '__main__':
  from experiments.lib.common import plain_errors

  plain_errors(main)()
