"""``python -m experiments.evaluate pipeline=[P] +grid='{legs.cos.weight: [0.5, 1, 2], k0: [20, 60]}'``: a grid of
knob values of one pipeline in one process (:func:`engram_jax.eval.grid.evaluate_grid`), written as

* ``grid.npz``: knob values per point, per-point means and per-question scores ``[P, Q]`` of every metric;
* ``grid.md`` / ``grid.json``: the leading points ranked with 95% intervals, and the paired plateau against the best
  (points whose paired 95% CI of the difference contains 0), knobs labelled by their full path;
* ``grid.png``: the plateau (paired difference from the best by rank) and 2-D slices through the best point as
  heatmaps, one per pair of swept knobs (with many knobs: disjoint pairs, each knob on one axis).

The metrics are the run's (``eval.metrics``), a dataset's own included (FactConsolidation's ``answer@k``, scored from
every point's top-k in the same call). The grid may also be written nested, as Hydra builds it from ``+grid.legs.cos.weight=[0.5,1,2] +grid.k0=[20,60]``.
``eval.grid_chunk`` sets the points fused at once (memory), ``eval.grid_ranked`` how many leading points are tested
against the best (null: 25 at a time until a batch holds no point on the plateau).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from engram_jax.eval import evaluation, grid, timing
from engram_jax.metrics import report
from experiments.lib import checks, common

log = logging.getLogger(__name__)
MAX_PAIRS = 6


def markdown(result: grid.GridResult, ranked: list[dict[str, Any]], *, metric: str, rows: int = 20) -> str:
  """The ranked table (``rows`` leading points) and the plateau line; every knob by its full path."""
  on = [r for r in ranked if r['on_plateau']]
  lines = [
    f'### grid of {result.pipeline}: {metric}, {result.n_points} points, {len(result.question_ids)} questions, '
    f'k={result.k}',
    '',
    f'Swept: {", ".join(f"{p} {sorted(set(result.points[p].tolist()))}" for p in result.paths)}.',
    '',
    f'Plateau (paired 95% CI vs the best contains 0, among the {len(ranked)} leading points tested'
    f'{"; it may extend past them" if ranked[-1]["on_plateau"] and len(ranked) < result.n_points else ""}): {len(on)} '
    f'points, {metric} {min(r["mean"] for r in on):.4f} .. {max(r["mean"] for r in on):.4f}.',
    '',
    f'| rank | point | {" | ".join(result.paths)} | {metric} [95% CI] | vs best: delta [95% CI] | p | plateau |',
    '|---|---|' + '---|' * len(result.paths) + '---|---|---|---|',
  ]
  for r in ranked[:rows]:
    d = r['vs_best']
    vals = ' | '.join(f'{r["params"][p]:g}' for p in result.paths)
    lines.append(
      f'| {r["rank"]} | {r["point"]} | {vals} | {r["mean"]:.4f} [{r["ci"][0]:.4f}, {r["ci"][1]:.4f}] '
      f'| {d["delta"]:+.4f} [{d["lo"]:+.4f}, {d["hi"]:+.4f}] | {d["p"]:.4f} | {"yes" if r["on_plateau"] else ""} |'
    )
  return '\n'.join(lines) + '\n'


def plot(result: grid.GridResult, ranked: list[dict[str, Any]], *, metric: str, path: Path | None = None):
  """(a) the paired difference from the best of the tested points by rank (plateau in blue); then one heatmap per
  pair of swept knobs (several levels each): ``metric`` over the pair with every other knob at the best point's
  value (every pair when there are at most ``MAX_PAIRS``, else disjoint neighbours in grid order, each knob on
  one axis). Axes carry the knobs' full paths. Returns the figure (saved as PNG to ``path`` when given)."""
  fig, axes = slices(result, metric=metric)
  plateau_panel(fig, axes[0], result, ranked, metric=metric)
  return finish(fig, path)


def slices(result: grid.GridResult, *, metric: str):
  """The figure of :func:`plot` without panel (a): ``(figure, axes)``, the heatmaps drawn through the best point
  (the first of the highest means, as :func:`engram_jax.eval.grid.rank_points` orders them), ``axes[0]`` empty. A
  ``matplotlib.figure.Figure`` (no pyplot: no GUI backend, and half the import time)."""
  from matplotlib.figure import Figure

  means = result.means(metric)
  best = int(np.argsort(-means, kind='stable')[0])
  swept = [p for p in result.paths if len(set(result.points[p].tolist())) > 1]
  pairs = list(itertools.combinations(swept, 2))
  if len(pairs) > MAX_PAIRS:  # many knobs: disjoint neighbours, so that every knob gets an axis
    pairs = [(swept[i], swept[(i + 1) % len(swept)]) for i in range(0, len(swept), 2)][:MAX_PAIRS]
  fig = Figure(figsize=(5 + 3.6 * len(pairs), 3.8))
  axes = fig.subplots(1, 1 + len(pairs), squeeze=False)[0]
  for ax, (a, b) in zip(axes[1:], pairs):
    fixed = np.ones(result.n_points, bool)
    for p in result.paths:
      if p not in (a, b):
        fixed &= result.points[p] == result.points[p][best]
    la, lb = sorted(set(result.points[a].tolist())), sorted(set(result.points[b].tolist()))
    img = np.full((len(la), len(lb)), np.nan)
    for i in np.flatnonzero(fixed):
      img[la.index(result.points[a][i].item()), lb.index(result.points[b][i].item())] = means[i]
    im = ax.imshow(img, origin='lower', aspect='auto', cmap='viridis')
    ax.set_xticks(range(len(lb)), [f'{v:g}' for v in lb], fontsize=7)
    ax.set_yticks(range(len(la)), [f'{v:g}' for v in la], fontsize=7)
    ax.set_xlabel(b, fontsize=8)
    ax.set_ylabel(a, fontsize=8)
    ax.plot(lb.index(result.points[b][best].item()), la.index(result.points[a][best].item()), 'r*', ms=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
  if pairs:
    axes[1].set_title('slices through the best point (*)', fontsize=9)
  return fig, axes


def plateau_panel(fig, ax, result: grid.GridResult, ranked: list[dict[str, Any]], *, metric: str) -> None:
  """Panel (a) of :func:`plot` on ``ax``: the paired difference from the best by rank, the plateau in blue."""
  if ranked and int(ranked[0]['point']) != int(np.argsort(-result.means(metric), kind='stable')[0]):
    raise AssertionError('the slices and the ranking disagree on the best point')
  x = np.arange(1, len(ranked) + 1)
  delta = np.array([r['vs_best']['delta'] for r in ranked])
  lo = np.array([r['vs_best']['lo'] for r in ranked])
  hi = np.array([r['vs_best']['hi'] for r in ranked])
  on = np.array([r['on_plateau'] for r in ranked])
  ax.errorbar(x, delta, yerr=[delta - lo, hi - delta], fmt='none', ecolor='0.6', elinewidth=1)
  ax.scatter(x[on], delta[on], color='C0', s=12, zorder=3, label='plateau: paired CI contains 0')
  ax.scatter(x[~on], delta[~on], facecolor='white', edgecolor='C3', s=12, zorder=3, label='below the best')
  ax.axhline(0.0, color='C0', lw=0.8)
  ax.set_xlabel('point rank')
  ax.set_ylabel(f'{metric} minus best (paired)')
  ax.set_title(f'(a) {result.pipeline}: {on.sum()} points on the plateau', fontsize=9)
  ax.legend(fontsize=7, loc='lower left')


def finish(fig, path: Path | None):
  """Fixed margins (not tight_layout: its layout pass measured a third of the report's time on the 100-point grid),
  then the PNG at ``path`` when given; returns ``fig``."""
  w = fig.get_figwidth()
  fig.subplots_adjust(left=0.9 / w, right=1 - 0.55 / w, bottom=0.16, top=0.9, wspace=0.55)
  if path is not None:
    fig.savefig(path, dpi=100)
  return fig


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
  """Evaluate the grid ``cfg.grid`` of the one selected pipeline on ``cfg.dataset`` and write the grid's files."""
  timer = timing.RunTimer()
  common.enable_compile_cache(cfg)
  spec = grid.flatten_grid(OmegaConf.to_container(cfg.grid, resolve=True))
  pipes, expanded = common.build_pipelines(cfg)
  if len(pipes) != 1 or expanded:
    raise ValueError(f'a grid takes one hand-set pipeline (no tune/replicate/fitted), got {sorted(pipes)}')
  if cfg.get('datasets'):
    raise ValueError('a grid runs on one dataset (dataset=...), not on datasets')
  (name, pipe), ds = next(iter(pipes.items())), cfg.dataset
  metrics = checks.metrics_for(cfg, ds)
  embed_fn = common.make_embedder(cfg)
  with timer.phase('load'):
    episodes, _ = common.load_dataset(cfg, ds)
  with timer.phase('embed'):
    embeddings = evaluation.embed_episodes(episodes, embed_fn)
  result = grid.evaluate_grid(
    episodes,
    embeddings,
    pipe,
    spec,
    k=cfg.eval.k,
    metrics=metrics,
    seed=cfg.seed,
    episode_metrics=common.dataset_metrics(ds),
    chunk=int(cfg.eval.get('grid_chunk', 64)),
    max_waste=float(cfg.eval.get('max_waste', 2.0)),
    timer=timer,
    devices=common.eval_devices(cfg),
  )
  t0 = time.perf_counter()
  metric = metrics[0]
  # the bootstrap (NumPy, which lets go of the GIL in its gathers and sums) on a thread beside the figure's slices
  # and the npz (Python): the same numbers, and the report's time mostly hidden behind the statistics
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    ranking = pool.submit(
      grid.rank_points, result, metric, seed=cfg.seed, n_resamples=cfg.eval.n_resamples, top=cfg.eval.get('grid_ranked')
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    grid.save_npz(result, out_dir / 'grid.npz')
    fig, axes = slices(result, metric=metric)
    t1 = time.perf_counter()
    ranked = ranking.result()
  timer.add('report', t1 - t0)
  timer.add('statistics', time.perf_counter() - t1)
  t0 = time.perf_counter()
  text = markdown(result, ranked, metric=metric)
  summary = {
    'dataset': ds.name,
    'pipeline': name,
    'metric': metric,
    'metrics': metrics,
    'k': cfg.eval.k,
    'seed': cfg.seed,
    'grid': spec,
    'n_points': result.n_points,
    'ranked': ranked,
    'info': result.info,
  }
  report.write_files(
    out_dir,
    {
      'grid.md': text,
      'grid.json': json.dumps(summary, indent=1),
      'config_resolved.yaml': OmegaConf.to_yaml(cfg, resolve=True),
    },
  )
  plateau_panel(fig, axes[0], result, ranked, metric=metric)
  finish(fig, out_dir / 'grid.png')
  timer.add('report', time.perf_counter() - t0)
  spent = timer.stop()
  report.write_files(out_dir, {'run_info.json': json.dumps({'timing': spent, 'info': result.info}, indent=1)})
  print(text)
  print(timing.markdown(spent))
  log.info('wrote %s', out_dir / 'grid.npz')
  return summary
