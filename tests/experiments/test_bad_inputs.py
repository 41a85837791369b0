"""The last bad inputs of issue 20, each a one-line error before any work (or a counted normalisation): an empty
scored set, every pipeline skipped, empty folds, n_resamples=0, a negative seed, an empty conversation list, a
turn-level k too small for its metrics, copied conversations (evaluate refuses; the fit names both), pilot ids
missing from the data."""

import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data import io, splits
from engram_jax.eval import checks as data_checks
from engram_jax.metrics import stats
from experiments import evaluate
from experiments.lib import checks

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
real = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')


def _compose(overrides=(), name='config'):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(config_name=name, overrides=list(overrides))


def _one_line(e):
  assert '\n' not in str(e.value)


@pytest.mark.parametrize(
  'overrides, match',
  [
    (['seed=-1'], r'seed must be an integer >= 0, got -1'),
    (['eval.n_resamples=0'], r'eval.n_resamples must be an integer >= 100 .*got 0'),
    (['dataset.loader.conversations=[]'], r'dataset.loader.conversations is empty'),
    (
      ['dataset=fc_sh_32k', 'pipeline=[tide_dense]'],
      r"dataset fc_sh_32k: every selected pipeline skips it \(\['tide_dense'\]",
    ),
    (['dataset=longmemeval_s_turn', 'eval.k=10'], r'dataset longmemeval_s_turn: its metrics need eval.k >= 50'),
  ],
)
def test_bad_evaluate_inputs_fail_before_any_work(overrides, match):
  with pytest.raises(ValueError, match=match) as e:
    checks.check_evaluate(_compose(overrides))
  _one_line(e)


@pytest.mark.parametrize(
  'overrides, match',
  [
    (['seed=-1'], r'seed must be an integer >= 0'),
    (['eval.n_resamples=0'], r'eval.n_resamples must be an integer >= 100'),
    (['dataset.loader.conversations=[]'], r'dataset.loader.conversations is empty'),
    (['dataset=longmemeval_s_turn', 'eval.k=20', 'pipeline=rrf_cos_bm25'], r'its metrics need eval.k >= 50'),
  ],
)
def test_bad_fit_inputs_fail_before_any_work(overrides, match):
  with pytest.raises(ValueError, match=match) as e:
    checks.check_fit(_compose(overrides, name='fit'))
  _one_line(e)


def test_turn_level_default_k_fits_its_metrics():
  cfg = _compose(['dataset=longmemeval_s_turn'])
  assert cfg.eval.k == 50
  checks.check_evaluate(cfg)
  assert _compose().eval.k == 10  # every other dataset keeps k = 10


def _ep(i, n_q=1, text=None):
  return Episode(
    id=f'e{i}',
    items=(Item(f'i{i}', text or f'text {i}', 'p', 0),),
    questions=tuple(Question(f'q{i}_{j}', f'question {i} {j}', (f'i{i}',), ('p',), 'c') for j in range(n_q)),
  )


def test_empty_folds_are_refused_naming_the_fold():
  eps = [_ep(0), _ep(1, n_q=0), _ep(2)]
  data_checks.check_folds(eps, [['e0'], ['e2']])
  with pytest.raises(ValueError, match=r"fold \['e1'\]: its scored episodes have 0 questions") as e:
    data_checks.check_folds(eps, [['e0'], ['e1']])
  _one_line(e)
  with pytest.raises(ValueError, match=r"fold \['e0'\]: the episodes outside it have 0 questions"):
    data_checks.check_folds([_ep(0), _ep(1, n_q=0)], [['e0']])
  with pytest.raises(ValueError, match='dataset x: 0 questions to score'):
    data_checks.check_scored_questions([_ep(1, n_q=0)], 'dataset x')


def test_an_empty_paired_comparison_is_nan_not_zero():
  res = stats.paired_tests(np.zeros((2, 0)), np.zeros((2, 0)), seed=0, n_resamples=100)
  assert all(np.isnan([r.delta, r.lo, r.hi, r.p]).all() and r.n == 0 for r in res)
  zero = stats.paired_tests(np.ones((1, 3)), np.ones((1, 3)), seed=0, n_resamples=100)[0]
  assert (zero.delta, zero.p) == (0.0, 1.0)  # a real zero difference stays a zero


def test_identical_corpora_are_refused_naming_both():
  eps = [_ep(0), _ep(1), _ep(2, text='text 0')]
  with pytest.raises(ValueError, match=r"dataset d: episodes 'e0' and 'e2' have identical content") as e:
    data_checks.check_distinct_corpora(eps, 'dataset d')
  _one_line(e)
  data_checks.check_distinct_corpora(eps[:2], 'dataset d')


def test_content_overlap_names_the_two_episodes():
  train, scored = [_ep(0), _ep(1)], [_ep(2, text='text 1')]
  with pytest.raises(ValueError, match=r"'e1' \(training\) = 'e2' \(scored\)"):
    splits.assert_disjoint_content(train, scored)
  copy = Episode(id='e9', items=(Item('i2', 'other text', 'p', 0),), questions=scored[0].questions)
  with pytest.raises(
    ValueError,
    match=r"question id\(s\) are both in training and in scored episodes: 'e9' "
    r"\(training\) and 'e2' \(scored\)",
  ):
    splits.assert_disjoint_content([copy], scored)


def test_pilot_ids_missing_from_the_data_are_counted():
  ids = splits.pilot_ids('longmemeval_s')
  have = ids[:90]  # a damaged copy: 10 pilot questions gone
  eps = [
    Episode(
      id=f'e{i}',
      items=(Item(f'i{i}', f't{i}', 'p', 0),),
      questions=(Question(q, f'question {q}', (f'i{i}',), ('p',), 'c'),),
    )
    for i, q in enumerate(have)
  ]
  kept, report = splits.load_part(load=lambda root: (eps, LoadReport('toy')), part='pilot', pilot='longmemeval_s')
  assert sum(len(e.questions) for e in kept) == 90
  assert report.counts['pilot_ids_not_in_data'] == 10
  assert report.examples['pilot_ids_not_in_data'] == sorted(ids[90:])[:5]
  # ids the loader read but excluded by its own rules (counted there) are in the data: not counted again
  read = LoadReport('toy', read_ids=frozenset(ids[:95]))
  _, report = splits.load_part(load=lambda root: (eps, read), part='pilot', pilot='longmemeval_s')
  assert report.counts['pilot_ids_not_in_data'] == 5


def _damaged_root(tmp_path: Path) -> Path:
  """conv-30 without questions, conv-26, and conv-26 again under the new id conv-26-copy."""
  data = json.loads((io.resolve_data_root() / 'locomo' / 'locomo10.json').read_text())
  keep = {s['sample_id']: s for s in data if s['sample_id'] in ('conv-30', 'conv-26')}
  empty = dict(keep['conv-30'], qa=[])
  copy = dict(keep['conv-26'], sample_id='conv-26-copy')
  (tmp_path / 'locomo').mkdir(parents=True)
  (tmp_path / 'locomo' / 'locomo10.json').write_text(json.dumps([empty, keep['conv-26'], copy]))
  return tmp_path


@real
@pytest.mark.slow
def test_damaged_data_is_refused_before_retrieval(tmp_path, monkeypatch):
  root = _damaged_root(tmp_path / 'data')
  base = [
    'embedder=hashing',
    f'paths.data_root={root}',
    'eval.n_resamples=100',
    'eval.progress=false',
    f'paths.cache_dir={tmp_path}/cache',
    'paths.compile_cache_dir=null',
  ]
  monkeypatch.setattr(evaluate.evaluation, 'embed_episodes', lambda *a, **k: pytest.fail('embedded'))
  with pytest.raises(ValueError, match='dataset locomo: 0 questions to score after loading'):
    evaluate.run(_compose(base + ['dataset.loader.conversations=[conv-30]']), tmp_path / 'o1')
  with pytest.raises(ValueError, match="episodes 'conv-26' and 'conv-26-copy' have identical content"):
    evaluate.run(_compose(base), tmp_path / 'o2')


@real
@pytest.mark.slow
def test_fit_refuses_an_empty_test_conversation_and_names_a_copied_one(tmp_path, monkeypatch):
  from engram_jax import fit as fit_lib
  from experiments import fit as fit_exp

  root = _damaged_root(tmp_path / 'data')
  base = [
    'embedder=hashing',
    f'paths.data_root={root}',
    'pipeline=rrf_cos_bm25',
    'fit.steps=1',
    'fit.batch_size=8',
    'eval.n_resamples=100',
    'eval.progress=false',
    'fit.baselines=[cosine]',
    f'paths.cache_dir={tmp_path}/cache',
    'paths.compile_cache_dir=null',
  ]
  monkeypatch.setattr(fit_lib, 'crossfit', lambda *a, **k: pytest.fail('fitted'))
  monkeypatch.setattr(fit_lib, 'holdout_split', lambda ids, n_test, seed: (['conv-26'], ['conv-30']))
  with pytest.raises(ValueError, match=r"fold \['conv-30'\]: its scored episodes have 0 questions"):
    fit_exp.run(_compose(base + ['fit.split=holdout', 'fit.n_test=1'], name='fit'), tmp_path / 'o1')
  monkeypatch.setattr(fit_lib, 'holdout_split', lambda ids, n_test, seed: (['conv-30', 'conv-26'], ['conv-26-copy']))
  with pytest.raises(ValueError, match=r"'conv-26' \(training\) = 'conv-26-copy' \(scored\)"):
    fit_exp.run(_compose(base + ['fit.split=holdout', 'fit.n_test=1'], name='fit'), tmp_path / 'o2')


# ------------------------------------------------------------------------------------------ issue 31's inputs


def test_near_copies_of_a_conversation_are_refused():
  """A conversation copied with one trailing space (a near copy) scored its questions twice: the corpus fingerprint
  now compares texts up to case and whitespace."""
  eps = [_ep(0), _ep(1), _ep(2, text='text 0 ')]
  with pytest.raises(ValueError, match=r"episodes 'e0' and 'e2' have identical content up to case and whitespace"):
    data_checks.check_distinct_corpora(eps, 'dataset d')
  data_checks.check_distinct_corpora([_ep(0), _ep(2, text='text 0 more')], 'dataset d')


def test_conversations_without_brackets_and_a_knob_listed_twice_are_refused():
  """`dataset.loader.conversations=conv-30` (no brackets) became ['-', '0', '3', 'c', 'n', 'o', 'v']."""
  with pytest.raises(ValueError, match=r"got the string 'conv-30' .*write dataset.loader.conversations=\[conv-30\]"):
    checks.check_evaluate(_compose(['dataset.loader.conversations=conv-30']))
  from engram_jax.data.locomo import load_locomo

  with pytest.raises(ValueError, match=r"got the string 'conv-30'"):
    load_locomo(conversations='conv-30')
  with pytest.raises(ValueError, match=r'fit.params lists legs.cfsr.lam twice'):
    checks.check_fit(_compose(['fit.params=[k0,legs.cfsr.lam,legs.cfsr.lam]'], name='fit'))


def _locomo_root(tmp_path, samples):
  (tmp_path / 'locomo').mkdir(parents=True)
  (tmp_path / 'locomo' / 'locomo10.json').write_text(json.dumps(samples))
  return tmp_path


@real
def test_locomo_dates_are_checked_and_an_empty_list_is_called_empty(tmp_path):
  from engram_jax.data.locomo import load_locomo

  data = json.loads((io.resolve_data_root() / 'locomo' / 'locomo10.json').read_text())
  _, report = load_locomo()
  conv = [s['conversation'] for s in data]
  with_turns = sum(1 for c in conv for k in c if k.endswith('_date_time') and c.get(k[: -len('_date_time')]))
  assert report.counts['session_dates_checked'] == with_turns == 272
  bad = json.loads(json.dumps(data[:1]))
  bad[0]['conversation']['session_2_date_time'] = 'not a date'
  with pytest.raises(ValueError, match=r"conv-26: session_2_date_time 'not a date' is not a LoCoMo date") as e:
    load_locomo(_locomo_root(tmp_path / 'a', bad))
  _one_line(e)
  with pytest.raises(ValueError, match=r'holds no conversations \(an empty list\)'):
    load_locomo(_locomo_root(tmp_path / 'b', []))


def test_fc_facts_repeated_under_new_serials_are_counted():
  from engram_jax.data.factconsolidation import parse_facts

  report = LoadReport('fc')
  facts = parse_facts(
    'Here is a list of facts:\n0. Ann lives in Paris.\n1. Bob is 3.\n2. ann lives in  Paris.', report=report, source='s'
  )
  assert len(facts) == 3 and report.counts['fact_repeated_under_new_serial'] == 1
  assert report.examples['fact_repeated_under_new_serial'][0] == ('s', 0, 2)


def test_a_fit_on_one_training_question_is_warned(caplog):
  eps = [_ep(0), _ep(1), _ep(2, n_q=30)]
  with caplog.at_level('WARNING'):
    data_checks.check_folds(eps, [['e2']])
  assert 'trains on only 2 question(s)' in caplog.text
  caplog.clear()
  with caplog.at_level('WARNING'):
    data_checks.check_folds(eps, [['e0']])
  assert 'trains on only' not in caplog.text


def test_a_training_set_the_user_never_named_says_why_it_is_read(tmp_path):
  """`pipeline=[bm25_recency]` on FactConsolidation without LongMemEval data failed on lme_train, unexplained."""
  from engram_jax.core.errors import DataNotFoundError
  from experiments.lib import common

  cfg = _compose([f'paths.data_root={tmp_path}'])
  (tmp_path / 'longmemeval').mkdir()
  with pytest.raises(
    DataNotFoundError, match=r'pipeline p is tuned on lme_train, and its data is missing: no LongMemEval'
  ):
    common.load_dataset(cfg, cfg.train_sets.lme_train, purpose='pipeline p is tuned on lme_train')
  with pytest.raises(DataNotFoundError, match=r'^no LongMemEval s file'):  # the loader's own error, not Hydra's repr
    common.load_dataset(cfg, cfg.train_sets.lme_train)


def test_a_damaged_answer_cache_entry_is_discarded_and_answered_again(tmp_path, caplog):
  from engram_jax.answer import cache as answer_cache

  cache = answer_cache.AnswerCache(tmp_path, {'model': 'm'})
  m = [{'role': 'user', 'content': 'hi'}]
  cache.put(m, 'hello')
  assert cache.get(m) == 'hello'
  for damage in (b'', b'{"answer": "hel'):
    cache.path(m).write_bytes(damage)
    with caplog.at_level('WARNING'):
      assert cache.get(m) is None
    assert 'is damaged' in caplog.text and not cache.path(m).exists()
    cache.put(m, 'hello')
  assert cache.damaged == 2 and cache.get(m) == 'hello'
