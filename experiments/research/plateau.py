"""Collect a Hydra multirun folder's results.json files, or a grid run's grid.npz, into a plateau table and plot;
or print per-category paired tests of one finished run. Swept knobs are labelled by their full paths
(``legs.cos.weight``, ``legs.bm25.weight``, ``k0``).

A sweep (one job per grid point, each a results.json in ``<sweep>/<job>/``), for example CFS-R's knobs inside
the deployable RRF stack (see docs/research.md for the grid):

  python -m experiments.evaluate -m pipeline=[rrf_cos_bm25_cfsr] \\
      ++pipeline.rrf_cos_bm25_cfsr.legs.cfsr.lam=0.001,0.005,0.02 ... hydra.sweep.dir=outputs/sweeps/cfsr
  python -m experiments.research.plateau outputs/sweeps/cfsr --metric ndcg@10

writes ``plateau.md``, ``plateau.json`` and ``plateau.png`` beside the jobs: every configuration's mean with its 95%
interval, and its paired difference from the best configuration on the same questions (bootstrap CI, sign-flip
p). The plateau is the set of configurations whose paired CI against the best contains 0.

A grid run (one process, :mod:`engram_jax.eval.grid`) is read the same way:

  python -m experiments.evaluate pipeline=[rrf_cos_bm25_cfsr] +grid='{legs.cfsr.lam: [0.001, 0.005, 0.02]}' \\
      hydra.run.dir=outputs/grids/cfsr
  python -m experiments.research.plateau outputs/grids/cfsr

One run, per-category paired tests (rows minus baselines, on the questions of each category):

  python -m experiments.research.plateau RUN_DIR --paired tcfsr_prior,tcfsr_basis --against cfsr,tide_dense_xfit \\
      --categories 2 temporal-reasoning knowledge-update
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from engram_jax.eval import grid
from engram_jax.metrics import stats


def load_run(run_dir: Path) -> dict[str, Any]:
  """A run's results.json (single-dataset form; a multi-dataset run must name its dataset with ``#name``)."""
  path = Path(run_dir)
  name = None
  if '#' in path.name:
    stem, name = path.name.split('#', 1)
    path = path.with_name(stem)
  res = json.loads((path / 'results.json').read_text())
  if 'datasets' in res:
    if name is None:
      raise ValueError(f'{path} holds several datasets {list(res["datasets"])}: append #<dataset> to the path')
    res = res['datasets'][name]
  return res


def per_question(res: dict[str, Any], pipeline: str, metric: str) -> tuple[list[str], np.ndarray]:
  """``(question ids, values [Q])`` of one pipeline's metric, in the run's question order."""
  rows = res['per_question']
  return [r['id'] for r in rows], np.asarray([r['scores'][pipeline][metric] for r in rows], np.float64)


def _overrides(job: Path) -> dict[str, str]:
  path = job / '.hydra' / 'overrides.yaml'
  if not path.is_file():
    return {}
  out = {}
  for o in yaml.safe_load(path.read_text()) or []:
    key, _, value = str(o).partition('=')
    key = key.lstrip('+~')  # ++pipeline.X.legs.Y.knob (a knob left at its default is added, not overridden)
    if key.startswith('pipeline.') and key.count('.') >= 2:
      out[knob_path(key)] = value
    elif not key.startswith(('hydra', 'eval.progress', 'paths.')):
      out[key] = value
  return out


def knob_path(key: str) -> str:
  """A pipeline override's knob by its full path, as a grid and ``pipeline.split_path`` name it:
  ``pipeline.P.legs.cos.weight`` -> ``legs.cos.weight``, ``pipeline.P.k0`` -> ``k0`` (two legs' ``weight`` never
  collide)."""
  return key.split('.', 2)[2]


def collect_grid(
  grid_dir: Path, *, metric: str, seed: int = 20261008, n_resamples: int = 10_000, top: int | None = None
):
  """The records of :func:`plateau` from a grid run's ``grid.npz`` (``python -m experiments.evaluate ... +grid=``):
  its leading points (``top``, or until the plateau ends), ranked, each paired against the best
  (:func:`engram_jax.eval.grid.rank_points`), with the knobs by their full paths; ``job`` is the point's index."""
  result = grid.load_npz(Path(grid_dir) / 'grid.npz')
  if metric not in result.scores:
    raise ValueError(f'{grid_dir}: no metric {metric!r} in the grid; metrics: {sorted(result.scores)}')
  return [
    {
      'job': str(r['point']),
      'params': {p: f'{v:g}' for p, v in r['params'].items()},
      'pipeline': result.pipeline,
      'mean': r['mean'],
      'ci': r['ci'],
      'ids': result.question_ids,
      'values': result.scores[metric][r['point']],
      'vs_best': r['vs_best'],
      'on_plateau': r['on_plateau'],
    }
    for r in grid.rank_points(result, metric, seed=seed, n_resamples=n_resamples, top=top)
  ]


def collect(sweep_dir: Path, *, metric: str, pipeline: str | None = None) -> list[dict[str, Any]]:
  """One record per finished job: ``{job, params, pipeline, mean, ci, ids, values}`` (jobs without results skipped)."""
  jobs = sorted(
    (p for p in Path(sweep_dir).iterdir() if (p / 'results.json').is_file()), key=lambda p: (len(p.name), p.name)
  )
  if not jobs:
    raise FileNotFoundError(f'no <job>/results.json under {sweep_dir}')
  recs = []
  for job in jobs:
    res = load_run(job)
    name = pipeline or next(iter(res['pipelines']))
    summ = res['pipelines'][name]
    ids, vals = per_question(res, name, metric)
    recs.append(
      {
        'job': job.name,
        'params': _overrides(job),
        'pipeline': name,
        'mean': float(summ[metric]),
        'ci': [float(x) for x in summ['ci95'][metric]],
        'ids': ids,
        'values': vals,
      }
    )
  keys = list(dict.fromkeys(k for r in recs for k in r['params']))
  swept = [k for k in keys if len({r['params'].get(k) for r in recs}) > 1]  # overrides shared by every job: not swept
  for r in recs:
    r['params'] = {k: r['params'].get(k, '') for k in swept}
  return recs


def plateau(recs: list[dict[str, Any]], *, seed: int = 20261008, n_resamples: int = 10_000) -> list[dict[str, Any]]:
  """Sort by mean (best first) and add each configuration's paired difference from the best.

  Raises:
    ValueError: if the jobs were not scored on the same questions (a paired test would be meaningless).
  """
  recs = sorted(recs, key=lambda r: -r['mean'])
  best = recs[0]
  for r in recs:
    if r['ids'] != best['ids']:
      raise ValueError(f'job {r["job"]} was scored on other questions than job {best["job"]}')
    if r is best:
      r['vs_best'] = {'delta': 0.0, 'lo': 0.0, 'hi': 0.0, 'p': 1.0, 'n': len(r['ids'])}
    else:
      r['vs_best'] = stats.paired_test(r['values'], best['values'], seed=seed, n_resamples=n_resamples).to_dict()
    r['on_plateau'] = bool(r['vs_best']['lo'] <= 0.0 <= r['vs_best']['hi'])
  return recs


def _label(params: dict[str, str]) -> str:
  return ', '.join(f'{k}={v}' for k, v in params.items()) or '(defaults)'


def markdown(recs: Sequence[dict[str, Any]], *, metric: str, title: str = '') -> str:
  on = [r for r in recs if r['on_plateau']]
  lines = [
    f'### {title or "sweep"}: {metric}, {len(recs)} configurations, {len(recs[0]["ids"])} questions',
    '',
    f'Plateau (paired 95% CI vs the best contains 0): {len(on)} configurations, '
    f'{metric} {min(r["mean"] for r in on):.4f} .. {max(r["mean"] for r in on):.4f}; '
    f'top 5 span {recs[min(4, len(recs) - 1)]["mean"]:.4f} .. {recs[0]["mean"]:.4f}.',
    '',
    f'| rank | job | configuration | {metric} [95% CI] | vs best: delta [95% CI] | p | plateau |',
    '|---|---|---|---|---|---|---|',
  ]
  for i, r in enumerate(recs, 1):
    d = r['vs_best']
    lines.append(
      f'| {i} | {r["job"]} | {_label(r["params"])} | {r["mean"]:.4f} [{r["ci"][0]:.4f}, {r["ci"][1]:.4f}] '
      f'| {d["delta"]:+.4f} [{d["lo"]:+.4f}, {d["hi"]:+.4f}] | {d["p"]:.4f} | '
      f'{"yes" if r["on_plateau"] else ""} |'
    )
  return '\n'.join(lines) + '\n'


def plot(
  recs: Sequence[dict[str, Any]],
  *,
  metric: str,
  path: Path | None = None,
  title: str = '',
  reference: tuple[float, float] | None = None,
):
  """Three views of a sweep, configurations ranked best first. (a) means with 95% intervals: how far apart the
  configurations are in absolute terms; (b) each configuration's paired difference from the best with its 95%
  interval (same questions, so far tighter): the plateau is where the interval reaches 0; (c) the paired
  difference against each swept parameter. ``reference`` (a published ``(lo, hi)`` range of top configurations)
  is drawn in (b) as the band ``[lo - hi, 0]``: its *spread*, since another embedder sets another level.
  Returns the matplotlib figure (saved to ``path`` as PNG when given)."""
  import matplotlib

  if path is not None:
    matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  params = sorted({k for r in recs for k in r['params']})
  ncol = 2 + len(params)
  fig, axes = plt.subplots(
    1,
    ncol,
    figsize=(9 + 2.2 * len(params), 4.2),
    gridspec_kw={'width_ratios': [2, 2] + [1] * len(params)},
    squeeze=False,
  )
  axes = axes[0]
  x = np.arange(1, len(recs) + 1)
  on = np.array([r['on_plateau'] for r in recs])
  means = np.array([r['mean'] for r in recs])
  delta = np.array([r['vs_best']['delta'] for r in recs])

  def dots(ax, xs, ys, lo, hi):
    ax.errorbar(xs, ys, yerr=[ys - lo, hi - ys], fmt='none', ecolor='0.6', elinewidth=1, capsize=2)
    ax.scatter(xs[on], ys[on], color='C0', zorder=3, s=18, label='plateau: paired CI vs best contains 0')
    ax.scatter(xs[~on], ys[~on], facecolor='white', edgecolor='C3', zorder=3, s=18, label='below the best')

  dots(axes[0], x, means, np.array([r['ci'][0] for r in recs]), np.array([r['ci'][1] for r in recs]))
  axes[0].set_xlabel('configuration rank')
  axes[0].set_ylabel(metric)
  axes[0].set_title(f'(a) {title or "sweep"}: mean, 95% CI', fontsize=9)
  dots(axes[1], x, delta, np.array([r['vs_best']['lo'] for r in recs]), np.array([r['vs_best']['hi'] for r in recs]))
  axes[1].axhline(0.0, color='C0', lw=0.8)
  if reference is not None:
    axes[1].axhspan(
      reference[0] - reference[1],
      0.0,
      color='C2',
      alpha=0.3,
      label=f'published top-config spread ({reference[1] - reference[0]:.4f})',
    )
  axes[1].set_xlabel('configuration rank')
  axes[1].set_ylabel(f'{metric} minus best (paired)')
  axes[1].set_title('(b) paired difference from the best, 95% CI', fontsize=9)
  axes[1].legend(fontsize=7, loc='lower left')
  for j, p in enumerate(params):
    a = axes[2 + j]
    vals = [r['params'].get(p, '') for r in recs]
    levels = sorted(set(vals), key=lambda v: (float(v) if _isnum(v) else float('inf'), v))
    pos = {v: i for i, v in enumerate(levels)}
    jitter = np.linspace(-0.2, 0.2, len(recs))
    a.scatter([pos[v] + jitter[i] for i, v in enumerate(vals)], delta, c=np.where(on, 'C0', 'C3'), s=12)
    a.axhline(0.0, color='C0', lw=0.8)
    a.set_xticks(range(len(levels)), levels)
    a.set_xlim(-0.5, len(levels) - 0.5)
    a.set_xlabel(p)
    a.set_ylim(axes[1].get_ylim())
    a.tick_params(labelleft=j == 0, labelsize=8)
    if j == 0:
      a.set_title('(c) by parameter', fontsize=9)
  fig.tight_layout()
  if path is not None:
    fig.savefig(path, dpi=130)
  return fig


def _isnum(v: str) -> bool:
  try:
    float(v)
    return True
  except ValueError:
    return False


def paired_by_category(
  res: dict[str, Any],
  rows: Sequence[str],
  against: Sequence[str],
  *,
  metric: str,
  categories: Sequence[str] | None = None,
  seed: int = 20261008,
  n_resamples: int = 10_000,
) -> list[dict[str, Any]]:
  """Paired tests ``row - baseline`` on all questions and on each category's questions (categories as stored,
  compared as strings; None = every category)."""
  cats = np.asarray([str(r['category']) for r in res['per_question']])
  wanted = list(dict.fromkeys(categories)) if categories else sorted(set(cats.tolist()))
  out = []
  for row in rows:
    _, a = per_question(res, row, metric)
    for base in against:
      if base == row:
        continue
      _, b = per_question(res, base, metric)
      for cat in ['all'] + wanted:
        sel = np.ones(len(cats), bool) if cat == 'all' else cats == str(cat)
        if not sel.any():
          continue
        r = stats.paired_test(a[sel], b[sel], seed=seed, n_resamples=n_resamples).to_dict()
        out.append(
          {
            'row': row,
            'baseline': base,
            'category': cat,
            'metric': metric,
            'row_mean': float(a[sel].mean()),
            'baseline_mean': float(b[sel].mean()),
            **r,
          }
        )
  return out


def paired_markdown(tests: Sequence[dict[str, Any]]) -> str:
  lines = [
    '| row | baseline | category | n | metric | row | baseline | delta [95% CI] | p |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for t in tests:
    lines.append(
      f'| {t["row"]} | {t["baseline"]} | {t["category"]} | {t["n"]} | {t["metric"]} | {t["row_mean"]:.4f} '
      f'| {t["baseline_mean"]:.4f} | {t["delta"]:+.4f} [{t["lo"]:+.4f}, {t["hi"]:+.4f}] | {t["p"]:.4f} |'
    )
  return '\n'.join(lines) + '\n'


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('folder', type=Path, help='a multirun folder (sweep) or, with --paired, one run folder')
  ap.add_argument('--metric', default=None, help="default: the runs' first metric")
  ap.add_argument('--pipeline', default=None, help='sweep: which pipeline of each job (default: the first)')
  ap.add_argument('--reference', default=None, help='sweep: a published plateau LO:HI drawn as a band')
  ap.add_argument('--paired', default=None, help='comma-separated rows: per-category paired tests of one run')
  ap.add_argument('--against', default=None, help='comma-separated baselines for --paired')
  ap.add_argument('--categories', nargs='*', default=None, help='categories for --paired (default: all)')
  ap.add_argument('--n-resamples', type=int, default=10_000)
  ap.add_argument('--top', type=int, default=None, help='grid: leading points tested (default: until the plateau ends)')
  ap.add_argument('--out', type=Path, default=None, help='output folder (default: the input folder)')
  args = ap.parse_args(argv)
  out = args.out or args.folder
  out.mkdir(parents=True, exist_ok=True)
  if args.paired:
    res = load_run(args.folder)
    metrics = [args.metric] if args.metric else list(res['metrics'])
    tests = [
      t
      for m in metrics
      for t in paired_by_category(
        res,
        args.paired.split(','),
        (args.against or '').split(','),
        metric=m,
        categories=args.categories,
        seed=int(res.get('seed', 20261008)),
        n_resamples=args.n_resamples,
      )
    ]
    text = paired_markdown(tests)
    (out / 'paired_by_category.md').write_text(text)
    (out / 'paired_by_category.json').write_text(json.dumps(tests, indent=1))
    print(text)
    return
  if (args.folder / 'grid.npz').is_file():  # a grid run: its leading points, already paired against the best
    metric = args.metric or json.loads((args.folder / 'grid.json').read_text())['metric']
    recs = collect_grid(args.folder, metric=metric, n_resamples=args.n_resamples, top=args.top)
  else:
    first = next(p for p in sorted(args.folder.iterdir()) if (p / 'results.json').is_file())
    metric = args.metric or load_run(first)['metrics'][0]
    recs = plateau(collect(args.folder, metric=metric, pipeline=args.pipeline), n_resamples=args.n_resamples)
  ref = tuple(float(x) for x in args.reference.split(':')) if args.reference else None
  text = markdown(recs, metric=metric, title=str(args.folder))
  plot(recs, metric=metric, path=out / 'plateau.png', title=f'{recs[0]["pipeline"]}: {metric}', reference=ref)
  (out / 'plateau.md').write_text(text)
  (out / 'plateau.json').write_text(
    json.dumps([{k: v for k, v in r.items() if k not in ('ids', 'values')} for r in recs], indent=1)
  )
  print(text)
  print(f'wrote {out / "plateau.png"}')


if __name__ == '__main__':
  main()
