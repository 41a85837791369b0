"""Evaluate retrieval pipelines on a dataset and write results.json + results.md to the Hydra run folder.

Kept short on purpose: the logic lives in the library (engram_jax.evaluation / report).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from engram_jax import analysis, embed, evaluation, pipeline, report
from engram_jax.data import splits
from experiments import checks

log = logging.getLogger(__name__)


def build_pipelines(cfg: DictConfig) -> tuple[dict[str, pipeline.Pipeline], dict[str, tuple[list[str], str]]]:
  """Instantiate every selected pipeline config into a library Pipeline.

  A pipeline node may expand into variants, one per value of one parameter (named
  ``name[param=value]``), merged after evaluation:
  ``tune: {param, grid, metric}`` is cross-fitted by episode (``evaluation.merge_tuned``);
  ``replicate: {param, values}`` (seeds of a stochastic leg) is averaged (``evaluation.merge_replicates``).

  Returns:
    ``(pipelines, expanded)`` with ``expanded[name] = (kind, variant names, tuning metric)``.
  """
  pipes: dict[str, pipeline.Pipeline] = {}
  expanded: dict[str, tuple[str, list[str], str]] = {}
  fitted = json.loads(Path(cfg.fitted).read_text()) if cfg.get('fitted') else None
  if fitted is not None and fitted['pipeline'] not in cfg.pipeline:
    raise ValueError(f'fitted parameters are for pipeline {fitted["pipeline"]!r}, which is not selected')
  for name, node in cfg.pipeline.items():
    node = OmegaConf.to_container(node)
    node.pop('skip_datasets', None)
    if fitted is not None and name == fitted['pipeline']:
      node.pop('tune', None)
      variant_of = {}
      for episode, params in fitted['folds'].items():
        variant = OmegaConf.create(node)
        for path, value in params.items():
          if OmegaConf.select(variant, path) is None:
            raise ValueError(f'fitted parameter {path!r} does not exist in pipeline {name}')
          OmegaConf.update(variant, path, value)
        vname = f'{name}[fold={episode}]'
        pipes[vname] = pipeline.make_pipeline(name=vname, **instantiate(variant))
        variant_of[episode] = vname
      expanded[name] = ('fitted', list(variant_of.values()), variant_of)
      continue
    tune, rep = node.pop('tune', None), node.pop('replicate', None)
    if tune is None and rep is None:
      pipes[name] = pipeline.make_pipeline(name=name, **instantiate(node))
      continue
    if tune is not None and rep is not None:
      raise ValueError(f'pipeline {name}: tune and replicate cannot be combined')
    kind, spec = ('tune', tune) if tune is not None else ('replicate', rep)
    values = spec['grid'] if kind == 'tune' else spec['values']
    variants = []
    for value in values:
      variant = OmegaConf.create(node)
      OmegaConf.update(variant, spec['param'], value)
      vname = f'{name}[{spec["param"].rsplit(".", 1)[-1]}={value}]'
      pipes[vname] = pipeline.make_pipeline(name=vname, **instantiate(variant))
      variants.append(vname)
    expanded[name] = (kind, variants, spec.get('metric', cfg.eval.metrics[0]))
  return pipes, expanded


def _embedder(cfg: DictConfig):
  """``texts -> [T, D]`` through the embedding cache, keyed by the instantiated encoder's spec (read from files:
  a warm cache never loads the model). ``embed_fn.cache_reports`` collects each call's ``CacheReport.as_dict()``
  (texts cached / embedded, bad shards rebuilt) for the results."""
  e = cfg.embedder
  encoder = instantiate(e.encoder)
  reports: list[dict[str, Any]] = []

  def embed_fn(texts):
    vecs, report = embed.embed_with_report(texts, cache_dir=cfg.paths.cache_dir, model_id=e.model_id,
                                           encoder=encoder, progress=cfg.eval.progress)
    reports.append(report.as_dict())
    return vecs
  embed_fn.cache_reports = reports
  return embed_fn


def _load(cfg: DictConfig, ds: DictConfig):
  episodes, load_report = instantiate(ds.loader, root=cfg.paths.data_root)
  log.info('%s', load_report.summary())
  return episodes, load_report


def fit_on_train(cfg: DictConfig, pipes: dict, expanded: dict, embed_fn, scored: dict[str, list]) -> dict:
  """Resolve ``tune`` specs that name training sets (``tune.train``): choose the grid value with the best pooled
  metric on those training questions, asserted disjoint from every scored dataset's questions. Mutates
  ``pipes``/``expanded`` (the variants collapse to the chosen pipeline) and returns what was fitted."""
  fits = {}
  train_cache: dict[str, tuple[list, list]] = {}
  for name, (kind, variants, _) in list(expanded.items()):
    node = cfg.pipeline[name]
    if kind != 'tune' or not node.tune.get('train'):
      continue
    per_value = [[] for _ in variants]
    for tname in node.tune.train:
      tcfg = cfg.train_sets[tname]
      if tname not in train_cache:
        eps, _ = _load(cfg, tcfg)
        train_cache[tname] = (eps, evaluation.embed_episodes(eps, embed_fn))
      eps, embs = train_cache[tname]
      for ds_name, ds_eps in scored.items():
        if ds_name not in node.get('skip_datasets', []):
          splits.assert_disjoint_content(eps, ds_eps)
      res = evaluation.evaluate(eps, embs, {v: pipes[v] for v in variants}, k=cfg.eval.k,
                                metrics=[tcfg.metric], seed=cfg.seed, progress=False)
      for g, v in enumerate(variants):
        per_value[g].append(res.scores[v][tcfg.metric])
    means = [float(np.concatenate(v).mean()) for v in per_value]
    best = int(np.argmax(means))
    fits[name] = {'train_sets': list(node.tune.train), 'grid': {v: m for v, m in zip(variants, means)},
                  'chosen': variants[best], 'n_train_questions': int(sum(len(x) for x in per_value[0]))}
    log.info('fitted %s on %s: %s', name, list(node.tune.train), variants[best])
    pipes[name] = pipes[variants[best]]
    for v in variants:
      del pipes[v]
    del expanded[name]
  return fits


def run_dataset(cfg: DictConfig, ds: DictConfig, episodes, load_report, pipes: dict, expanded: dict, embed_fn,
                ) -> tuple[dict[str, Any], str]:
  """Evaluate the pipelines on one dataset; returns (results dict, Markdown table)."""
  metrics = checks.metrics_for(cfg, ds)
  baselines = checks.resolve_baselines(cfg)
  skip = {n for n in cfg.pipeline if ds.name in cfg.pipeline[n].get('skip_datasets', [])}
  pipes = {n: p for n, p in pipes.items() if n.split('[')[0] not in skip}
  if any(kind == 'tune' for kind, _, _ in expanded.values()):
    splits.assert_distinct_episodes(episodes)  # cross-fitting by episode: no content on both sides
  embeddings = evaluation.embed_episodes(episodes, embed_fn)
  only = {v: {ep for ep, vv in extra.items() if vv == v}
          for kind, variants, extra in expanded.values() if kind == 'fitted' for v in variants}
  result = evaluation.evaluate(episodes, embeddings, pipes, k=cfg.eval.k, metrics=metrics, seed=cfg.seed,
                               progress=cfg.eval.progress, only=only)
  merged = {}
  for name, (kind, variants, extra) in expanded.items():
    if name in skip:
      continue
    if kind == 'tune':
      merged[name] = evaluation.merge_tuned(result, name, variants, metric=extra)
    elif kind == 'replicate':
      merged[name] = evaluation.merge_replicates(result, name, variants)
    else:
      merged[name] = evaluation.merge_by_episode(result, name, extra)
  order = [n for n in cfg.pipeline if n not in skip]
  result.scores = {n: result.scores[n] for n in order}
  result.retrieved = {n: result.retrieved[n] for n in order}
  categories = OmegaConf.to_container(ds.categories) if ds.get('categories') else {}
  summary = report.summarize(result, category_names=categories, seed=cfg.seed, n_resamples=cfg.eval.n_resamples,
                             baselines=baselines)
  reference = OmegaConf.to_container(cfg.reference) if cfg.get('reference') else None
  table = report.markdown_table(
      summary, metrics=metrics, reference=reference if not cfg.get('datasets') else None,
      reference_label=cfg.get('reference_label', 'published'),
      title=f'{ds.name}: {len(result.question_ids)} questions, k={cfg.eval.k}, embedder {cfg.embedder.model_id}')
  if skip:
    table += f'\nNot run here (their parameters were fit on questions of this dataset): {sorted(skip)}\n'
  pileup = None
  if cfg.eval.get('pileup'):
    pileup = analysis.pileup_report(episodes, embeddings, result, categories=[4, 1],
                                    baselines=baselines, seed=cfg.seed,
                                    n_resamples=cfg.eval.n_resamples)
    table += analysis.pileup_markdown(pileup, categories)
  results = {'dataset': ds.name, 'n_questions': len(result.question_ids), 'k': cfg.eval.k,
             'seed': cfg.seed, 'metrics': metrics, 'load_report': load_report.to_dict(), 'pipelines': summary,
             'reference': reference, 'expanded': merged, 'pileup': pileup, 'not_run': sorted(skip),
             'per_question': report.per_question(result)}
  return results, table


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
  """Evaluate ``cfg.pipeline`` on ``cfg.dataset`` (or on every entry of ``cfg.datasets``) and write the results."""
  checks.check_evaluate(cfg)
  datasets = checks.datasets_of(cfg)
  pipes, expanded = build_pipelines(cfg)
  embed_fn = _embedder(cfg)
  loaded = {name: _load(cfg, ds) for name, ds in datasets.items()}
  fits = fit_on_train(cfg, pipes, expanded, embed_fn, {n: eps for n, (eps, _) in loaded.items()})
  per_ds, tables = {}, []
  for name, ds in datasets.items():
    per_ds[name], table = run_dataset(cfg, ds, *loaded[name], pipes, expanded, embed_fn)
    tables.append(table)
  if len(datasets) == 1:
    results = next(iter(per_ds.values()))
    results['fitted'] = fits
  else:
    reference = OmegaConf.to_container(cfg.reference) if cfg.get('reference') else None
    combined = report.combined_table(per_ds, order=list(cfg.pipeline), reference=reference,
                                     reference_label=cfg.get('reference_label', 'published'))
    tables.insert(0, combined)
    results = {'datasets': per_ds, 'fitted': fits, 'reference': reference}
  if fits:
    tables.append(report.fits_markdown(fits))
  text = '\n'.join(tables)
  run_info = {'embedding_cache': embed_fn.cache_reports}  # varies between a cold and a warm run
  report.write_files(out_dir, {'results.json': json.dumps(results, indent=1), 'results.md': text,
                               'run_info.json': json.dumps(run_info, indent=1),
                               'config_resolved.yaml': OmegaConf.to_yaml(cfg, resolve=True)})
  print(text)
  log.info('wrote %s', out_dir / 'results.json')
  return results


@hydra.main(version_base='1.3', config_path='../conf', config_name='config')
def main(cfg: DictConfig) -> float:
  results = run(cfg, Path(HydraConfig.get().runtime.output_dir))
  one = results if 'pipelines' in results else next(iter(results['datasets'].values()))
  first = next(iter(one['pipelines'].values()))
  return float(first[one['metrics'][0]])


if __name__ == '__main__':
  main()  # pylint: disable=no-value-for-parameter
