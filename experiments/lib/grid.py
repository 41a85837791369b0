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
against the best (null: 25 at a time until a batch holds no point on the plateau), ``eval.grid_max_points`` the
largest grid run (a larger one is refused before any embedding, with its memory estimate: :func:`check_size`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from engram_jax.core.errors import EngramError
from engram_jax.eval import evaluation, grid, timing
from engram_jax.eval.config import EvalConfig
from engram_jax.eval.pipeline import Pipeline
from engram_jax.metrics import report
from experiments.lib import checks, common, grid_figure

log = logging.getLogger(__name__)


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


def view(result: grid.GridResult, metric: str) -> grid_figure.GridView:
  """What the figure reads of ``result``: the knob values and the per-point means of ``metric``."""
  return grid_figure.GridView(result.pipeline, list(result.paths), dict(result.points), result.means(metric), metric)


def plot(result: grid.GridResult, ranked: list[dict[str, Any]], *, metric: str, path: Path | None = None):
  """``grid.png``'s figure of ``result`` in this process (:func:`experiments.lib.grid_figure.plot`)."""
  return grid_figure.plot(view(result, metric), ranked, path)


def _bytes(n: int) -> str:
  for unit, size in (('TB', 1 << 40), ('GB', 1 << 30), ('MB', 1 << 20), ('kB', 1 << 10)):
    if n >= size:
      return f'{n / size:.1f} {unit}'
  return f'{n} B'


def check_size(
  settings: EvalConfig, spec: dict[str, list[Any]], n_questions: int, metrics: list[str]
) -> dict[str, int]:
  """The grid's points and the memory of their per-question scores (``P x Q x metrics`` float64), refused in one line
  above ``eval.grid_max_points`` (before any embedding); returns ``{'points', 'bytes'}``."""
  limit = settings.grid_max_points
  n = grid.n_grid_points(spec)
  nbytes = n * n_questions * len(metrics) * 8
  if n > limit:
    axes = ' x '.join(f'{len(v)} ({p})' for p, v in spec.items())
    raise EngramError(
      f'+grid has {n:,} points ({axes}), more than eval.grid_max_points={limit:,}: their per-question scores alone '
      f'take about {_bytes(nbytes)} ({n:,} points x {n_questions} questions x {len(metrics)} metrics x 8 bytes), '
      'before the fusion and the ranking; narrow the grid, or raise eval.grid_max_points if the machine holds it'
    )
  log.info('grid: %d points, per-question scores ~%s', n, _bytes(nbytes))
  return {'points': n, 'bytes': nbytes}


def check(cfg: DictConfig, settings: EvalConfig | None = None) -> tuple[str, Pipeline, dict[str, list[Any]]]:
  """What a grid run can check from the config alone, before any data is read: one dataset, one hand-set pipeline,
  every knob's values (numbers for numeric knobs, none listed twice, no empty list: :func:`engram_jax.eval.grid.
  grid_axes`). Returns ``(pipeline name, pipeline, {knob path: values})``."""
  if cfg.get('datasets'):
    raise EngramError('a grid runs on one dataset (dataset=...), not on datasets')
  spec = grid.flatten_grid(OmegaConf.to_container(cfg.grid, resolve=True))
  pipes, expanded = common.build_pipelines(cfg, settings)
  if len(pipes) != 1 or expanded:
    raise EngramError(
      f'a grid takes one hand-set pipeline (no tune/replicate/fitted), got {sorted(pipes)}; select one, e.g. '
      f'pipeline=[{next(iter(cfg.pipeline), "rrf_cos_bm25")}]'
    )
  (name, pipe) = next(iter(pipes.items()))
  grid.grid_axes(pipe, spec)
  return name, pipe, spec


def run(cfg: DictConfig, out_dir: Path, settings: EvalConfig | None = None) -> dict[str, Any]:
  """Evaluate the grid ``cfg.grid`` of the one selected pipeline on ``cfg.dataset`` and write the grid's files
  (``settings``: the run's typed ``eval`` node, default read from ``cfg``)."""
  timer = timing.RunTimer()
  settings = common.eval_settings(cfg) if settings is None else settings
  name, pipe, spec = check(cfg, settings)
  common.enable_compile_cache(cfg)
  ds = cfg.dataset
  metrics = checks.metrics_for(cfg, ds, settings)
  with timer.phase('load'):
    episodes, _ = common.load_dataset(cfg, ds)
  check_size(settings, spec, sum(len(e.questions) for e in episodes), metrics)  # before any embedding
  # the helper imports matplotlib on the core this job leaves idle in its serial phases; stopped if the job fails
  with grid_figure.FigureWorker() as figure:
    return _grid_files(cfg, settings, out_dir, name, pipe, spec, metrics, figure, timer, episodes)


def _grid_files(
  cfg: DictConfig,
  settings: EvalConfig,
  out_dir: Path,
  name: str,
  pipe: Pipeline,
  spec: dict[str, list[Any]],
  metrics: list[str],
  figure: grid_figure.FigureWorker,
  timer: timing.RunTimer,
  episodes: list,
) -> dict[str, Any]:
  """:func:`run` past its checks: evaluate the grid on the loaded ``episodes``, write its files, the figure by
  ``figure``."""
  ds = cfg.dataset
  embed_fn = common.make_embedder(cfg, progress=settings.progress)
  with timer.phase('embed'):
    embeddings = evaluation.embed_episodes(episodes, embed_fn)
  result = grid.evaluate_grid(
    episodes,
    embeddings,
    pipe,
    spec,
    k=settings.k,
    metrics=metrics,
    seed=cfg.seed,
    episode_metrics=common.dataset_metrics(ds),
    chunk=settings.grid_chunk,
    max_waste=settings.max_waste,
    timer=timer,
    devices=settings.devices,
  )
  t0 = time.perf_counter()
  metric = metrics[0]
  # the helper process draws the heatmaps while the bootstrap runs here (NumPy, two threads) and the npz is written
  figure.slices(view(result, metric))
  out_dir.mkdir(parents=True, exist_ok=True)
  grid.save_npz(result, out_dir / 'grid.npz')
  t1 = time.perf_counter()
  ranked = grid.rank_points(result, metric, seed=cfg.seed, n_resamples=settings.n_resamples, top=settings.grid_ranked)
  timer.add('report', t1 - t0)
  timer.add('statistics', time.perf_counter() - t1)
  t0 = time.perf_counter()
  text = markdown(result, ranked, metric=metric)
  summary = {
    'dataset': ds.name,
    'pipeline': name,
    'metric': metric,
    'metrics': metrics,
    'k': settings.k,
    'seed': cfg.seed,
    'grid': spec,
    'n_points': result.n_points,
    'ranked': ranked,
    'info': result.info,
  }
  figure.finish(ranked, out_dir / 'grid.png')  # panel (a) and the PNG, in the helper, while the text files are written
  report.write_files(
    out_dir,
    {
      'grid.md': text,
      'grid.json': json.dumps(summary, indent=1),
      'config_resolved.yaml': OmegaConf.to_yaml(cfg, resolve=True),
    },
  )
  figure.wait()
  timer.add('report', time.perf_counter() - t0)
  spent = timer.stop()
  report.write_files(out_dir, {'run_info.json': json.dumps({'timing': spent, 'info': result.info}, indent=1)})
  print(text)
  print(timing.markdown(spent))
  log.info('wrote %s', out_dir / 'grid.npz')
  return summary
