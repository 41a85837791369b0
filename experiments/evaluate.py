"""Evaluate retrieval pipelines on a dataset and write results.json + results.md to the Hydra run folder.

Kept short on purpose: the logic lives in the library (engram_jax.eval.evaluation / report).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from engram_jax.core import runfolder
from engram_jax.core.batch import episode_arrays
from engram_jax.core.errors import EngramError
from engram_jax.data import splits
from engram_jax.eval import checks as data_checks
from engram_jax.eval import evaluation, grid, pipeline, timing, trec
from engram_jax.eval.config import EvalConfig
from engram_jax.metrics import report
from engram_jax.ops import trec_run
from experiments.lib import answer, checks, common
from experiments.lib import grid as grid_run
from experiments.lib import pileup as analysis

log = logging.getLogger(__name__)
# what a run writes into its folder (an earlier run's copies are removed first: engram_jax.core.runfolder.begin)
OUTPUTS = ('results.json', 'results.md', 'config_resolved.yaml', 'run_info.json', 'runs', 'qrels')


def fit_on_train(run: Run, scored: dict[str, list]) -> dict:
  """Resolve ``tune`` specs that name training sets (``tune.train``): choose the grid value with the best pooled
  metric on those training questions, asserted disjoint from every scored dataset's questions (ties: the first
  value). Each training set's grid is one :func:`engram_jax.eval.grid.evaluate_grid` call, its metric (e.g. the
  dataset's ``answer@1``) read from every value's top-k. Mutates ``pipes``/``expanded`` (the variants collapse to the
  chosen pipeline) and returns what was fitted."""
  cfg, pipes, expanded, embed_fn = run.cfg, run.pipes, run.expanded, run.embed_fn
  fits = {}
  train_cache: dict[str, tuple[list, list]] = {}
  for name, (kind, variants, _) in list(expanded.items()):
    node = cfg.pipeline[name]
    if kind != 'tune' or not node.tune.get('train'):
      continue
    per_value = [[] for _ in variants]
    values = list(OmegaConf.to_container(node.tune.grid, resolve=True))
    for tname in node.tune.train:
      tcfg = cfg.train_sets[tname]
      if tname not in train_cache:
        why = f'pipeline {name} is tuned on training set {tname} (its tune.train: {list(node.tune.train)})'
        eps, _ = common.load_dataset(cfg, tcfg, purpose=why)
        train_cache[tname] = (eps, evaluation.embed_episodes(eps, embed_fn))
      eps, embs = train_cache[tname]
      for ds_name, ds_eps in scored.items():
        if ds_name not in node.get('skip_datasets', []):
          splits.assert_disjoint_content(eps, ds_eps)
      # the tune grid in one call (engram_jax.eval.grid): the dataset's metric read from every value's top-k
      res = grid.evaluate_grid(
        eps,
        embs,
        pipes[variants[0]],
        {node.tune.param: values},
        k=run.settings.k,
        metrics=[tcfg.metric],
        seed=cfg.seed,
        episode_metrics=common.dataset_metrics(tcfg),
        devices=run.settings.devices,
      )
      for g in range(len(variants)):
        per_value[g].append(res.scores[tcfg.metric][g])
    means = [float(np.concatenate(v).mean()) for v in per_value]
    best = int(np.argmax(means))
    fits[name] = {
      'train_sets': list(node.tune.train),
      'grid': {v: m for v, m in zip(variants, means)},
      'chosen': variants[best],
      'n_train_questions': int(sum(len(x) for x in per_value[0])),
    }
    log.info('fitted %s on %s: %s', name, list(node.tune.train), variants[best])
    pipes[name] = pipes[variants[best]]
    for v in variants:
      del pipes[v]
    del expanded[name]
  return fits


def embed(run: Run, ds: DictConfig, episodes) -> list:
  """The episodes' ``(item, question)`` vectors; once per process for this dataset and embedder (the jobs of a
  multirun share them)."""
  cfg, embed_fn = run.cfg, run.embed_fn
  with run.timer.phase('embed'):
    return common.memo(
      run.settings,
      'embeddings',
      {
        'dataset': ds,
        'data_root': cfg.paths.data_root,
        'embedder': cfg.embedder,
        'cache_dir': cfg.paths.cache_dir,
        'content': getattr(embed_fn, 'content_key', None),  # a vectors file: its sha256, not its path
      },
      lambda: evaluation.embed_episodes(episodes, embed_fn),
    )


def needs_vectors(cfg: DictConfig, settings: EvalConfig, pipes: dict) -> bool:
  """Whether this run must embed: a leg reads vectors, or a fit's artifact (its dimension is checked), a pile-up
  report (it reads item vectors) or a fit on training questions comes with it."""
  return pipeline.reads_vectors(pipes.values()) or bool(cfg.get('fitted')) or settings.pileup


@dataclasses.dataclass
class Run:
  """What every dataset of one evaluate run shares: the config, the pipelines (built once; ``expanded``: the nodes
  that expand into variants), the embedder, the timer, the reader (``tier1``) and the artifact ``fitted=RUN``
  applies with what ``fitted_force`` let through (``applying``; loaded and checked once for the run)."""

  cfg: DictConfig
  settings: EvalConfig  # the eval node, typed (read once: experiments.lib.common.eval_settings)
  pipes: dict
  expanded: dict
  embed_fn: Any
  timer: timing.RunTimer
  tier1: answer.Tier1 | None = None
  applying: tuple[Any, list[str]] | None = None


def run_dataset(run: Run, ds: DictConfig, episodes, load_report) -> tuple[dict[str, Any], str]:
  """Evaluate the pipelines on one dataset, as named steps; returns (results dict, Markdown table). With a reader
  (``run.tier1``), also answers from every pipeline's top-k and scores the answers (``results['tier1']``); with an
  artifact (``run.applying``), its pipeline is scored with every learned part."""
  cfg = run.cfg
  metrics = checks.metrics_for(cfg, ds, run.settings)
  skip = {n for n in cfg.pipeline if ds.name in cfg.pipeline[n].get('skip_datasets', [])}
  pipes = {n: p for n, p in run.pipes.items() if n.split('[')[0] not in skip}
  if any(kind == 'tune' for kind, _, _ in run.expanded.values()):
    splits.assert_distinct_episodes(episodes)  # cross-fitting by episode: no content on both sides
  embeddings = embed_step(run, ds, episodes, pipes)
  result = retrieve_step(run, ds, episodes, embeddings, pipes, skip, metrics)
  merged = merge_step(run, result, skip, metrics)
  applied = None
  if run.applying is not None:  # a fit's artifact: every learned part of it applied
    from experiments.lib import fit_artifact  # flax and safetensors: only when an artifact is applied

    applied = fit_artifact.apply(cfg, run.settings, *run.applying, episodes, embeddings, result, metrics=metrics)
  order = [n for n in cfg.pipeline if n not in skip]
  result.scores = {n: result.scores[n] for n in order}
  result.retrieved = {n: result.retrieved[n] for n in order}
  stats_t0 = time.perf_counter()
  summary, table = table_step(run, ds, result, pipes, metrics, applied, skip)
  pileup = None
  if run.settings.pileup:
    pileup, text = pileup_step(run, ds, episodes, embeddings, result)
    table += text
  run.timer.add('statistics', time.perf_counter() - stats_t0)
  results = {
    'dataset': ds.name,
    'n_questions': len(result.question_ids),
    'k': run.settings.k,
    'seed': cfg.seed,
    'metrics': metrics,
    'load_report': load_report.to_dict(),
    'pipelines': summary,
    'reference': OmegaConf.to_container(cfg.reference) if cfg.get('reference') else None,
    'expanded': merged,
    'pileup': pileup,
    'not_run': sorted(skip),
    'per_question': report.per_question(result),
  }
  if applied:
    results['fitted_artifact'] = applied
  if run.tier1 is not None:
    with run.timer.phase('answer'):
      results['tier1'], t1_table = run.tier1.run(ds, episodes, result, labels=answer.labels_for(cfg))
    table += '\n' + t1_table
  return results, table


def embed_step(run: Run, ds: DictConfig, episodes, pipes: dict) -> list:
  """The episodes' vectors (none encoded when no leg reads them), checked against the artifact applied (its embedder
  and dimension) before any retrieval."""
  cfg = run.cfg
  if not needs_vectors(
    cfg, run.settings, pipes
  ):  # a lexical-only run: one constant unit vector per text, nothing encoded
    run.timer.add('embed skipped (no leg reads vectors)', 0.0)
    embeddings = evaluation.embed_episodes(episodes, common.no_embedder())
  else:
    embeddings = embed(run, ds, episodes)
  if run.applying is not None:
    from engram_jax.fit import apply as road  # flax and safetensors: only when an artifact is applied

    dim = int(np.shape(embeddings[0][0])[-1]) if embeddings else None
    node = OmegaConf.to_container(cfg.embedder, resolve=True)
    road.check_vectors(
      run.applying[0], road.Vectors(dim, node=node), force=bool(cfg.get('fitted_force')),
      where=f'fitted={cfg.fitted}', force_hint='fitted_force=true',
    )  # fmt: skip
  return embeddings


def retrieve_step(
  run: Run, ds: DictConfig, episodes, embeddings, pipes: dict, skip: set, metrics: list[str]
) -> evaluation.EvalResult:
  """Every pipeline's top-k and per-question scores: one :func:`engram_jax.eval.evaluation.evaluate` call, and one
  :func:`engram_jax.eval.grid.evaluate_grid` call per cross-fitted tune (every grid value's scores and top-k)."""
  cfg, timer = run.cfg, run.timer
  only = {
    v: {ep for ep, vv in extra.items() if vv == v}
    for kind, variants, extra in run.expanded.values()
    if kind == 'fitted'
    for v in variants
  }
  tuned = {n: (v, by) for n, (kind, v, by) in run.expanded.items() if kind == 'tune' and n not in skip}
  in_grids = {v for variants, _ in tuned.values() for v in variants}
  arrays = None
  if tuned:  # padded once for both calls
    with timer.phase('arrays'):
      options = pipeline.build_options(pipes.values())
      arrays = [episode_arrays(ep, d, q, **options) for ep, (d, q) in zip(episodes, embeddings)]
  shared = dict(
    k=run.settings.k, seed=cfg.seed, episode_metrics=common.dataset_metrics(ds), arrays=arrays, timer=timer,
    max_waste=run.settings.max_waste, devices=run.settings.devices, leg_cache=common.leg_cache(run.settings),
  )  # fmt: skip
  result = evaluation.evaluate(
    episodes, embeddings, {n: p for n, p in pipes.items() if n not in in_grids}, metrics=metrics,
    progress=run.settings.progress, only=only, stacked=run.settings.stacked, **shared,
  )  # fmt: skip
  for name, (variants, by) in tuned.items():
    node = cfg.pipeline[name]
    res = grid.evaluate_grid(
      episodes, embeddings, pipes[variants[0]],
      {node.tune.param: list(OmegaConf.to_container(node.tune.grid, resolve=True))},
      metrics=list(dict.fromkeys([*metrics, by])),  # the tuning metric too, when the dataset's list lacks it
      keep_topk=range(len(variants)), **shared,
    )  # fmt: skip
    for g, v in enumerate(variants):
      result.scores[v] = {m: res.scores[m][g] for m in res.scores}
      result.retrieved[v] = res.retrieved[g]
  return result


def merge_step(run: Run, result: evaluation.EvalResult, skip: set, metrics: list[str]) -> dict[str, Any]:
  """Each expanded node's variants merged into its row: a tune's choice per episode, replicates averaged, per-episode
  fitted parameters; returns what each merge chose."""
  merged = {}
  for name, (kind, variants, extra) in run.expanded.items():
    if name in skip:
      continue
    if kind == 'tune':
      merged[name] = evaluation.merge_tuned(result, name, variants, metric=extra)
      result.scores[name] = {m: result.scores[name][m] for m in metrics}  # the tuning metric chose; not reported
    elif kind == 'replicate':
      merged[name] = evaluation.merge_replicates(result, name, variants)
    else:
      merged[name] = evaluation.merge_by_episode(result, name, extra)
  return merged


def table_step(run: Run, ds, result, pipes: dict, metrics: list[str], applied, skip: set) -> tuple[dict, str]:
  """The summary (means, 95% intervals, paired tests against the baselines) and its Markdown table, with what the
  artifact applied and the pipelines not run here."""
  cfg = run.cfg
  categories = OmegaConf.to_container(ds.categories) if ds.get('categories') else {}
  baselines = checks.resolve_baselines(cfg, run.settings)
  summary = report.summarize(
    result, category_names=categories, seed=cfg.seed, n_resamples=run.settings.n_resamples, baselines=baselines
  )
  reference = OmegaConf.to_container(cfg.reference) if cfg.get('reference') else None
  table = report.markdown_table(
    summary,
    metrics=metrics,
    reference=reference if not cfg.get('datasets') else None,
    reference_label=cfg.get('reference_label', 'published'),
    title=f'{ds.name}: {len(result.question_ids)} questions, k={run.settings.k}, embedder '
    + (cfg.embedder.model_id if needs_vectors(cfg, run.settings, pipes) else 'none (no leg reads vectors)'),
  )
  if applied:
    table += (
      f'\nFitted artifact {applied["artifact"]} (components {applied["components"]}): '
      + ', '.join(f'{label} on {len(eps)} episodes' for label, eps in applied['episodes_by_fit'].items())
      + '\n'
    )
    for why in applied.get('forced', []):
      table += f'Applied with fitted_force=true although {why}.\n'
  if skip:
    table += f'\nNot run here (their parameters were fit on questions of this dataset): {sorted(skip)}\n'
  return summary, table


def pileup_step(run: Run, ds, episodes, embeddings, result) -> tuple[dict, str]:
  """The pile-up report (``eval.pileup``) and its Markdown: how near-duplicate items crowd each pipeline's top-k."""
  cfg = run.cfg
  pileup = analysis.pileup_report(
    episodes, embeddings, result, categories=[4, 1], baselines=checks.resolve_baselines(cfg, run.settings), seed=cfg.seed,
    n_resamples=run.settings.n_resamples,
  )  # fmt: skip
  categories = OmegaConf.to_container(ds.categories) if ds.get('categories') else {}
  return pileup, analysis.pileup_markdown(pileup, categories)


def external_markdown(external: dict[str, dict[str, Any]]) -> str:
  """The external runs' matching, counted (:func:`engram_jax.ops.trec_run.reports`): a line per run file."""
  lines = ['', 'External runs (trec_run legs):']
  for path, r in external.items():
    miss = f' (first: {", ".join(r["first_missing"])})' if r['questions_missing'] else ''
    unk = f' (first: {", ".join(r["first_unknown"])})' if r['unknown_docids'] else ''
    lines.append(
      f'- {path}: {r["questions"] - r["questions_missing"]} of {r["questions"]} questions matched, '
      f'{r["questions_missing"]} missing{miss} (scored by no item of this leg); {r["unknown_docids"]} unknown doc '
      f'ids{unk}; {r["run_qids_unmatched"]} run qids matched no question'
    )
  return '\n'.join(lines) + '\n'


def trec_files(name: str, results: dict[str, Any], episodes) -> dict[str, str]:
  """Dataset ``name``'s files for trec_eval, ir_measures or ranx (:mod:`engram_jax.eval.trec`): per pipeline the
  run of what it scored (``runs/<name>/<pipeline>.trec``, each question's top-k as in ``results['per_question']``)
  and the qrels of the scored questions (``qrels/<name>.qrels``)."""
  rows = results['per_question']
  qids = trec.trec_qids([r['episode'] for r in rows], [r['id'] for r in rows])
  gold = {(e.id, q.id): q.gold for e in episodes for q in e.questions}
  files = {f'qrels/{name}.qrels': trec.trec_qrels(qids, [gold[r['episode'], r['id']] for r in rows])}
  for pipe in rows[0]['retrieved'] if rows else []:
    files[f'runs/{name}/{pipe}.trec'] = trec.trec_run(qids, [r['retrieved'][pipe] for r in rows], tag=pipe)
  return files


def _check_loaded(cfg: DictConfig, settings: EvalConfig, name: str, episodes, art=None) -> None:
  """A loaded dataset refused when it has no question to score or two episodes with equal content (or, with
  ``art``, the artifact applied, an episode it has no fit for). Run on every load, a memoized one included: what
  it checks depends on the run's settings, not only on the data."""
  data_checks.check_scored_questions(episodes, f'dataset {name}')
  data_checks.check_distinct_corpora(episodes, f'dataset {name}')
  checks.check_loaded(cfg, name, episodes, settings)  # k, reader.questions, fitted= episodes: before any embedding
  if art is not None:  # an artifact: a fit for every episode (fold or final)
    from engram_jax.fit import apply as road

    road.check_episodes(art, episodes, f'dataset {name}', prefix=f'fitted={cfg.fitted}')


def begin(cfg: DictConfig, out_dir: Path) -> runfolder.Run:
  """Start writing the run folder ``out_dir`` (:func:`engram_jax.core.runfolder.begin`: an earlier run's marker,
  then its results, removed first), refused when ``fitted=`` lies in it (the run would remove what it applies)."""
  if cfg.get('fitted'):
    src, out = Path(str(cfg.fitted)).resolve(), Path(out_dir).resolve()
    if src == out or out in src.parents:
      raise EngramError(
        f"fitted={cfg.fitted} lies in this run's own output folder {out_dir}: the run would replace what it reads; "
        'write the run elsewhere (hydra.run.dir=...)'
      )
  return runfolder.begin(out_dir, OUTPUTS, expect=common.hydra_own_files(out_dir))


def run(cfg: DictConfig, out_dir: Path, settings: EvalConfig | None = None) -> dict[str, Any]:
  """Evaluate ``cfg.pipeline`` on ``cfg.dataset`` (or on every entry of ``cfg.datasets``) and write the results:
  each file atomically, then the folder's marker (:mod:`engram_jax.core.runfolder`). The run holds the folder
  (one writer: another run into it is refused) until it ends, however it ends. ``settings``: the ``eval`` node as
  read by the caller (default: read here, once)."""
  with begin(cfg, out_dir) as folder:
    return _run(cfg, out_dir, folder, settings)


def _run(cfg: DictConfig, out_dir: Path, folder: runfolder.Run, settings: EvalConfig | None) -> dict[str, Any]:
  """:func:`run` in the folder it holds, as named steps: check the settings, set up the run (pipelines, embedder,
  artifact), load and check the data, fit on training sets, evaluate each dataset, write the outputs."""
  settings = checks.check_evaluate(cfg, settings)
  checks.check_reader_packages(cfg)  # a Tier-1 reader's packages on this machine: before loading and retrieval
  compile_cache = common.enable_compile_cache(cfg)  # before any compilation (an artifact's checks compute)
  run = setup_step(cfg, settings)
  datasets = checks.datasets_of(cfg)
  loaded = load_step(run, datasets)
  with run.timer.phase('fit_on_train'):
    fits = fit_on_train(run, {n: eps for n, (eps, _) in loaded.items()})
  run.tier1 = answer.Tier1(cfg, run.settings) if answer.enabled(cfg) else None
  per_ds, tables = {}, []
  for name, ds in datasets.items():
    per_ds[name], table = run_dataset(run, ds, *loaded[name])
    tables.append(table)
  report_t0 = time.perf_counter()
  results, text, external = report_step(run, per_ds, tables, fits)
  files = {
    'results.json': json.dumps(results, indent=1),
    'results.md': text,
    'config_resolved.yaml': OmegaConf.to_yaml(cfg, resolve=True),
  }
  for name in datasets:  # the runs and qrels in TREC format, beside results.json (not in it)
    files.update(trec_files(name, per_ds[name], loaded[name][0]))
  folder.write_files(files)
  run.timer.add('report', time.perf_counter() - report_t0)
  spent = run.timer.stop()
  spent['n_questions'] = sum(r['n_questions'] for r in per_ds.values())
  folder.write('run_info.json', json.dumps(run_info(run, spent, compile_cache, external), indent=1))
  folder.finish()  # the marker, last: every output above and Hydra's files of the run, by sha256
  print(text)
  print(timing.markdown(spent))
  log.info('wrote %s', out_dir / 'results.json')
  return results


def setup_step(cfg: DictConfig, settings: EvalConfig) -> Run:
  """The run's shared parts: the artifact ``fitted=RUN`` applies (loaded and checked once, before any data is read),
  the pipelines and the embedder (none when no leg reads vectors)."""
  applying = None
  if cfg.get('fitted') and Path(str(cfg.fitted)).is_dir():  # an artifact, loaded and checked once for the run
    from experiments.lib import fit_artifact

    applying = fit_artifact.check(cfg)  # the run folder whole, the pipeline selected and unchanged, the embedder
  pipes, expanded = common.build_pipelines(cfg, settings)
  if needs_vectors(cfg, settings, pipes):
    embed_fn = common.make_embedder(cfg, progress=settings.progress)
  else:
    embed_fn = common.no_embedder()
  return Run(cfg, settings, pipes, expanded, embed_fn, timing.RunTimer(), applying=applying)


def load_step(run: Run, datasets: dict) -> dict[str, tuple]:
  """Every dataset loaded (once per dataset in a process) and checked (on every run), then what needs the data
  but no vectors: a vectors file's ids and the external runs, before any embedding or retrieval."""
  cfg = run.cfg
  art = run.applying[0] if run.applying else None
  with run.timer.phase('load'):
    loaded = {
      name: common.memo(
        run.settings,
        'dataset',
        {'dataset': ds, 'data_root': cfg.paths.data_root},
        functools.partial(common.load_dataset, cfg, ds),
      )
      for name, ds in datasets.items()
    }
  for name, (episodes, _) in loaded.items():
    _check_loaded(cfg, run.settings, name, episodes, art)
    common.check_embeddable(run.embed_fn, episodes)
    checks.check_external_runs(cfg, run.pipes, episodes, run.settings.k)
  return loaded


def report_step(run: Run, per_ds: dict, tables: list[str], fits: dict) -> tuple[dict, str, dict]:
  """results.json's content (one dataset's, or every dataset's beside a combined table), the Markdown of
  results.md (the fits on training sets and the external runs' matching counted in it) and those counts."""
  cfg = run.cfg
  if len(per_ds) == 1:
    results = next(iter(per_ds.values()))
    results['fitted'] = fits
  else:
    reference = OmegaConf.to_container(cfg.reference) if cfg.get('reference') else None
    combined = report.combined_table(
      per_ds, order=list(cfg.pipeline), reference=reference, reference_label=cfg.get('reference_label', 'published')
    )
    tables.insert(0, combined)
    results = {'datasets': per_ds, 'fitted': fits, 'reference': reference}
  if fits:
    tables.append(report.fits_markdown(fits))
  ext = [dict(leg.options)['path'] for p in run.pipes.values() for leg in p.legs if leg.op == 'trec_run']
  external = trec_run.reports(ext) if ext else {}
  if external:  # partial matches counted where the numbers are read, not only in a log
    tables.append(external_markdown(external))
  return results, '\n'.join(tables), external


def run_info(run: Run, spent: dict, compile_cache, external: dict) -> dict[str, Any]:
  """run_info.json: what varies between runs (cold/warm caches, wall times), kept out of results.json so that
  reruns are byte-identical; the external runs' matching counted (and logged)."""
  cfg = run.cfg
  info = {
    'timing': spent,
    'compile_cache': compile_cache,
    'embedding_cache': run.embed_fn.cache_reports,
    'compile_cache_published': len(common.publish_compile_cache(cfg)),
    'leg_cache': (common.leg_cache(run.settings).report() if common.leg_cache(run.settings) else None),
  }
  if run.tier1 is not None:
    info['reader'] = run.tier1.info
  if external:  # the external runs of trec_run legs: questions missing, unknown doc ids, unmatched qids (counted)
    info['external_runs'] = external
    for path, r in external.items():
      log.info(
        'external run %s: %d of %d questions missing (skipped), %d unknown doc ids, %d run qids unmatched',
        path, r['questions_missing'], r['questions'], r['unknown_docids'], r['run_qids_unmatched'],
      )  # fmt: skip
  return info


@hydra.main(version_base='1.3', config_path='../conf', config_name='config')
@common.plain_errors  # the project's errors (EngramError) as one line; ENGRAM_FULL_ERROR=1 for the traceback
def main(cfg: DictConfig) -> float:
  settings = common.eval_settings(cfg)  # the eval node, typed, read once for the run
  common.use_cpu_cores(settings, multirun=HydraConfig.get().mode == RunMode.MULTIRUN)  # before JAX's first computation
  if cfg.get('grid') is not None:  # a grid of one pipeline's knob values in one call (experiments/lib/grid.py)
    settings = checks.check_evaluate(cfg, settings)
    summary = grid_run.run(cfg, Path(HydraConfig.get().runtime.output_dir), settings)
    return float(summary['ranked'][0]['mean'])
  results = run(cfg, Path(HydraConfig.get().runtime.output_dir), settings)
  one = results if 'pipelines' in results else next(iter(results['datasets'].values()))
  first = next(iter(one['pipelines'].values()))
  return float(first[one['metrics'][0]])


if __name__ == '__main__':
  main()
