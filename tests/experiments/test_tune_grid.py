"""``tune:`` evaluates its candidate values through :func:`engram_jax.eval.grid.evaluate_grid`: on training sets
(``tune.train``, scored by each set's metric, FactConsolidation's ``answer@1`` a dataset-owned one) and cross-fitted on
the scored set. The fitted means, the choice and every per-question score and top-k equal evaluating the variants one
by one (``evaluation.evaluate``, then the pooled mean / ``merge_tuned``), on a tiny data root cut from the real data."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tiny_data
from hydra import compose, initialize_config_dir

from engram_jax.eval import evaluation, timing
from experiments import evaluate
from experiments.lib import common

CONF = Path(__file__).resolve().parents[2] / 'conf'
MISSING = tiny_data.have_real_data()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(MISSING), reason=f'no tiny data root: {MISSING}')]


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  return tiny_data.build_tiny_root(tmp_path_factory.mktemp('tiny_data'))


def _cfg(pipe, dataset, root, cache):
  with initialize_config_dir(config_dir=str(CONF), version_base='1.3'):
    return compose(
      config_name='config',
      overrides=[
        f'pipeline=[{pipe}]',
        f'dataset={dataset}',
        'embedder=hashing',
        'eval.progress=false',
        'eval.n_resamples=200',
        f'paths.data_root={root}',
        f'paths.cache_dir={cache}',
        'train_sets.lme_train.loader.n_train=4',
      ],
    )


def test_tune_on_training_sets_equals_variants_one_by_one(root, tmp_path):
  cfg = _cfg('tide_dense', 'locomo', root, tmp_path)
  pipes, expanded = common.build_pipelines(cfg)
  variants = list(expanded['tide_dense'][1])
  by_value = {v: pipes[v] for v in variants}
  embed_fn = common.make_embedder(cfg)
  scored, _ = common.load_dataset(cfg, cfg.dataset)
  run = evaluate.Run(cfg, common.eval_settings(cfg), pipes, expanded, embed_fn, timing.RunTimer())
  fits = evaluate.fit_on_train(run, {'locomo': scored})['tide_dense']
  pooled = [[] for _ in variants]
  metrics = set()
  for tname in cfg.pipeline.tide_dense.tune.train:
    tcfg = cfg.train_sets[tname]
    metrics.add(tcfg.metric)
    eps, _ = common.load_dataset(cfg, tcfg)
    want = evaluation.evaluate(
      eps,
      evaluation.embed_episodes(eps, embed_fn),
      by_value,
      k=cfg.eval.k,
      metrics=[tcfg.metric],
      seed=cfg.seed,
      progress=False,
      episode_metrics=common.dataset_metrics(tcfg),
    )
    for g, v in enumerate(variants):
      pooled[g].append(want.scores[v][tcfg.metric])
  assert metrics == {'ndcg_any@10', 'answer@1'}  # a label metric and a dataset-owned one
  means = {v: float(np.concatenate(p).mean()) for v, p in zip(variants, pooled)}
  assert fits['grid'] == means  # every value's pooled mean, to the last bit
  assert fits['chosen'] == variants[int(np.argmax(list(means.values())))]
  assert fits['n_train_questions'] == sum(len(x) for x in pooled[0])
  assert 'tide_dense' in pipes and not set(variants) & set(pipes)


@pytest.mark.parametrize(
  'pipe,dataset',
  [
    ('tide_dense_xfit', 'locomo'),
    ('rrf_cos_bm25_mmr_tuned', 'locomo'),
    ('rrf_cos_bm25_mmr_tuned', 'longmemeval_s'),  # tuned by ndcg@10, which the dataset does not report
  ],
)
def test_crossfitted_tune_equals_variants_one_by_one(pipe, dataset, root, tmp_path):
  cfg = _cfg(pipe, dataset, root, tmp_path / 'cache')
  evaluate.run(cfg, tmp_path / 'out')
  saved = json.loads((tmp_path / 'out' / 'results.json').read_text())
  pipes, expanded = common.build_pipelines(cfg)
  kind, variants, metric = expanded[pipe]
  eps, _ = common.load_dataset(cfg, cfg.dataset)
  want = evaluation.evaluate(
    eps,
    evaluation.embed_episodes(eps, common.make_embedder(cfg)),
    pipes,
    k=cfg.eval.k,
    metrics=list(dict.fromkeys([*cfg.eval.metrics, metric])),
    seed=cfg.seed,
    progress=False,
    episode_metrics=common.dataset_metrics(cfg.dataset),
  )
  chosen = evaluation.merge_tuned(want, pipe, variants, metric=metric)
  assert (metric in cfg.eval.metrics) == (dataset == 'locomo')
  assert saved['expanded'][pipe] == json.loads(json.dumps(chosen))
  assert [q['id'] for q in saved['per_question']] == want.question_ids
  for i, q in enumerate(saved['per_question']):
    assert q['retrieved'][pipe] == want.retrieved[pipe][i]
    assert sorted(q['scores'][pipe]) == sorted(cfg.eval.metrics)
    for m in cfg.eval.metrics:
      assert q['scores'][pipe][m] == float(want.scores[pipe][m][i]), (q['id'], m)
  assert os.path.isfile(tmp_path / 'out' / 'results.md')
