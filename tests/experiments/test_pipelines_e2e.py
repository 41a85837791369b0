"""Every pipeline in conf/pipeline/ and every experiment in conf/experiment/ runs end to end.

Each case composes the real config (as ``python -m experiments.evaluate`` does) with the hashing embedder and runs
``experiments.evaluate.run`` on a tiny data root cut from the real data (tests/tiny_data.py: 2 LoCoMo
conversations, 14 LongMemEval_S entries of which 6 are pilot questions, the FactConsolidation files as they are).
A pipeline whose ``tune.train`` names training sets (Tide) is fit on them too. Skipped only when the real data the
tiny root is cut from is missing.
"""

import json
import math
from pathlib import Path

import jax
import pytest
import tiny_data
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from jax.experimental.compilation_cache import compilation_cache
from omegaconf import OmegaConf

from experiments import evaluate

CONF = Path(__file__).resolve().parents[2] / 'conf'
PIPELINES = sorted(Path(CONF, 'pipeline').glob('*.yaml'))
EXPERIMENTS = sorted(Path(CONF, 'experiment').glob('*.yaml'))
N_TRAIN = 4  # LongMemEval training questions drawn from the tiny root's 8 non-pilot entries
MISSING = tiny_data.have_real_data()
pytestmark = pytest.mark.slow  # every case is a whole evaluate / fit run

# Cases that fail because of a library or config bug (not this test): name -> the error, as recorded.
KNOWN_FAILURES: dict[str, str] = {}


def _params(paths):
  out = []
  for p in paths:
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[p.stem])] if p.stem in KNOWN_FAILURES else []
    out.append(pytest.param(p.stem, id=p.stem, marks=marks))
  return out


@pytest.fixture(scope='module', autouse=True)
def _compile_once(tmp_path_factory):
  """A persistent compilation cache in a temporary folder while this module runs: the experiments re-run the
  programs the single-pipeline cases compiled (same pipelines, same padded shapes), so most of their compile time
  is saved. The previous settings are restored afterwards."""
  settings = {
    'jax_compilation_cache_dir': str(tmp_path_factory.mktemp('jax_cache')),
    'jax_persistent_cache_min_compile_time_secs': 0.0,
    'jax_persistent_cache_min_entry_size_bytes': 0,
  }
  old = {name: getattr(jax.config, name) for name in settings}
  for name, value in settings.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()
  yield
  for name, value in old.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()


@pytest.fixture(scope='session')
def tiny_root(tmp_path_factory):
  if MISSING:
    pytest.skip(f'cannot build the tiny data root: {MISSING}')
  return tiny_data.build_tiny_root(tmp_path_factory.mktemp('tiny_data'))


@pytest.fixture(scope='session')
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('embedding_cache')


def _train_overrides(node, path=()):
  """``<path>.n_train=N_TRAIN`` for every loader that draws a training part (``part: train``)."""
  out = []
  if isinstance(node, dict):
    if node.get('part') == 'train' and 'n_train' in node:
      out.append('.'.join(path + ('n_train',)) + f'={N_TRAIN}')
    for key, value in node.items():
      if key != 'hydra':
        out += _train_overrides(value, path + (str(key),))
  return out


def _compose(overrides, root, cache):
  base = [
    'embedder=hashing',
    'eval.progress=false',
    'eval.n_resamples=200',
    f'paths.data_root={root}',
    f'paths.cache_dir={cache}',
  ] + list(overrides)
  with initialize_config_dir(config_dir=str(CONF), version_base='1.3'):
    cfg = compose(config_name='config', overrides=base)
    extra = _train_overrides(OmegaConf.to_container(cfg, resolve=False))
    return compose(config_name='config', overrides=base + extra) if extra else cfg


def _check_dataset(cfg, ds, saved, *, expect):
  """One dataset's results: every expected pipeline row with finite metrics in [0, 1], and exactly k distinct
  retrieved ids per question, each an item of that question's episode."""
  k = cfg.eval.k
  episodes, _ = instantiate(ds.loader, root=cfg.paths.data_root)
  items = {ep.id: {it.id for it in ep.items} for ep in episodes}
  n_questions = sum(len(ep.questions) for ep in episodes)
  assert saved['dataset'] == ds.name and saved['k'] == k
  assert saved['n_questions'] == len(saved['per_question']) == n_questions > 0
  assert list(saved['pipelines']) == expect
  for name in expect:
    row = saved['pipelines'][name]
    for m in saved['metrics']:
      assert math.isfinite(row[m]) and 0.0 <= row[m] <= 1.0, (name, m, row[m])
      lo, hi = row['ci95'][m]
      assert lo <= row[m] + 1e-9 and row[m] <= hi + 1e-9, (name, m, row[m], lo, hi)
  for q in saved['per_question']:
    for name in expect:
      ids = q['retrieved'][name]
      assert len(ids) == len(set(ids)) == k, (name, q['id'], ids)
      assert set(ids) <= items[q['episode']], (name, q['id'], ids)
      for m, v in q['scores'][name].items():
        assert math.isfinite(v) and 0.0 <= v <= 1.0, (name, q['id'], m, v)


def _check_run(cfg, out, res):
  saved = json.loads((out / 'results.json').read_text())
  assert (out / 'results.md').read_text().strip() and (out / 'config_resolved.yaml').is_file()
  datasets = dict(cfg.datasets) if cfg.get('datasets') else {cfg.dataset.name: cfg.dataset}
  per_ds = saved['datasets'] if cfg.get('datasets') else {cfg.dataset.name: saved}
  assert list(per_ds) == list(datasets)
  for name, ds in datasets.items():
    skip = [p for p in cfg.pipeline if ds.name in cfg.pipeline[p].get('skip_datasets', [])]
    assert per_ds[name]['not_run'] == sorted(skip)
    _check_dataset(cfg, ds, per_ds[name], expect=[p for p in cfg.pipeline if p not in skip])
  trained = [p for p in cfg.pipeline if cfg.pipeline[p].get('tune') and cfg.pipeline[p].tune.get('train')]
  assert sorted(saved['fitted']) == sorted(trained)
  for p in trained:
    fit = saved['fitted'][p]
    assert fit['train_sets'] == list(cfg.pipeline[p].tune.train)
    assert len(fit['grid']) == len(cfg.pipeline[p].tune.grid) and fit['chosen'] in fit['grid']
    assert all(0.0 <= v <= 1.0 for v in fit['grid'].values()) and fit['n_train_questions'] > 0
  assert sorted(res) == sorted(saved)


@pytest.mark.parametrize('name', _params(PIPELINES))
def test_pipeline_runs_alone(name, tiny_root, cache_dir, tmp_path):
  over = [f'pipeline=[{name}]']
  if 'op: trec_run' in (CONF / 'pipeline' / f'{name}.yaml').read_text():  # an external run: rank_bm25's, written here
    from experiments.research.external_run import write_run

    episodes, _ = instantiate(_compose([], tiny_root, cache_dir).dataset.loader, root=str(tiny_root))
    over.append(f'ext_run={write_run(episodes, tmp_path / "ext.trec")}')
  cfg = _compose(over, tiny_root, cache_dir)
  assert list(cfg.pipeline) == [name]
  res = evaluate.run(cfg, tmp_path / 'out')
  _check_run(cfg, tmp_path / 'out', res)


@pytest.mark.parametrize('name', _params(EXPERIMENTS))
def test_experiment_runs(name, tiny_root, cache_dir, tmp_path):
  cfg = _compose([f'experiment={name}'], tiny_root, cache_dir)
  res = evaluate.run(cfg, tmp_path / 'out')
  _check_run(cfg, tmp_path / 'out', res)


def test_tiny_root_shapes(tiny_root):
  """The tiny root is what the cases above rely on: every episode holds more than k items, and the training
  part of LongMemEval is drawn from questions outside the pilot set."""
  cfg = _compose(['dataset=longmemeval_s'], tiny_root, tiny_root)
  sets = {
    'locomo': _compose([], tiny_root, tiny_root).dataset,
    'lme_pilot': cfg.dataset,
    **{n: cfg.train_sets[n] for n in cfg.train_sets},
  }
  loaded = {n: instantiate(ds.loader, root=str(tiny_root))[0] for n, ds in sets.items()}
  for n, eps in loaded.items():
    assert eps, n
    assert all(ep.n_items >= cfg.eval.k for ep in eps), n
  assert len(loaded['locomo']) == 2 and len(loaded['lme_pilot']) == tiny_data.LME_PILOT
  assert sum(len(e.questions) for e in loaded['lme_train']) == N_TRAIN
  assert not {e.id for e in loaded['lme_train']} & {e.id for e in loaded['lme_pilot']}


def test_protocol_fits_on_train_and_scores_confirm_once(tiny_root, cache_dir, tmp_path):
  """``+protocol=lme_session`` on the tiny root: fit on the train part, score the confirm part (disjoint), record
  the protocol's hash in results.json and the ledger, and refuse a second scoring unless forced."""
  from experiments import fit as fit_exp

  ledger = tmp_path / 'scored.jsonl'
  over = [
    '+protocol=lme_session',
    'embedder=hashing',
    'eval.n_resamples=200',
    f'paths.data_root={tiny_root}',
    f'paths.cache_dir={cache_dir}',
    'fit.steps=2',
    'dataset.loader.n_train=4',
    'fit.train.loader.n_train=4',
    f'protocol_ledger={ledger}',
    'protocol_force=true',
  ]  # forced: the file may be uncommitted while developing
  with initialize_config_dir(config_dir=str(CONF), version_base='1.3'):
    cfg = compose(config_name='fit', overrides=over)
    again = compose(config_name='fit', overrides=over[:-1])
  res = fit_exp.run(cfg, tmp_path / 'run')
  split = json.loads((tmp_path / 'run' / 'split.json').read_text())
  scored = set(split['folds'][0]['scored_questions'])
  train, _ = instantiate(cfg.fit.train.loader, root=str(tiny_root))
  assert scored and not scored & {q.id for e in train for q in e.questions}
  assert res['protocol']['name'] == 'lme_session' and len(res['protocol']['sha256']) == 64
  assert res['best_hand_set']['metric'] == 'ndcg_any@10'
  assert [json.loads(l)['protocol'] for l in ledger.read_text().splitlines()] == ['lme_session']
  if res['protocol']['committed']:
    with pytest.raises(ValueError, match='already scored'):
      fit_exp.run(again, tmp_path / 'run2')
