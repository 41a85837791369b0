"""experiments.research.reader_compare on the real FactConsolidation and LoCoMo data with the deterministic fake
reader: the oracle row is scored, the answers land in the answer cache, LoCoMo reports the category-5 positions;
the timing prompts hold k items."""

import json

import pytest

from engram_jax.answer import reader as R
from engram_jax.answer.reader import FakeReader, LoadInfo
from engram_jax.core.types import Episode, Item, Question
from experiments.research import reader_compare as RC


@pytest.fixture
def fake_reader(monkeypatch):
  made = []

  def load(name, **kw):
    made.append(FakeReader(batch_size=kw.get('batch_size', 4)))
    return made[-1], LoadInfo(f'fake {name}', 0.5, False, None)

  monkeypatch.setattr(R, 'load_reader', load)
  return made


def _data_or_skip(dataset):
  from engram_jax.data.io import resolve_data_root

  try:
    root = resolve_data_root(None)
  except FileNotFoundError:
    pytest.skip('no data root')
  sub = 'locomo' if dataset.startswith('locomo') else 'memoryagentbench'
  if not (root / sub).is_dir():
    pytest.skip(f'{dataset} data not found')


@pytest.mark.parametrize('dataset', ['fc_sh_6k', 'locomo_answer'])
def test_the_oracle_row_is_scored_timed_and_cached(dataset, fake_reader, tmp_path, capsys):
  _data_or_skip(dataset)
  RC.main(
    [
      '--reader',
      'smollm2',
      '--dataset',
      dataset,
      '--questions',
      '12',
      '--one-at-a-time',
      '2',
      '--batch-size',
      '4',
      '--timing-k',
      '10',
      '--timing-prompts',
      '3',
      '--out',
      str(tmp_path / 'out'),
      f'paths.cache_dir={tmp_path / "cache"}',
    ]
  )
  res = json.loads((tmp_path / 'out' / f'reader_compare_smollm2_{dataset}.json').read_text())
  assert res['n_questions'] == 12 and res['subset'] == {'n': 12, 'seed': res['subset']['seed']}
  assert 0.0 <= res['oracle']['lo'] <= res['oracle']['mean'] <= res['oracle']['hi'] <= 1.0
  assert res['batched']['answers'] == 12 and res['one_at_a_time']['answers'] == 2
  assert res['one_at_a_time']['replies_differing_from_batched'] == 0
  assert res['timing_k']['k'] == 10 and res['timing_k']['answers'] == 3
  assert res['timing_k']['mean_prompt_chars'] > res['mean_prompt_chars']
  assert len(list((tmp_path / 'cache' / 'answers').rglob('*.json'))) == 12  # the oracle answers, for a Tier-1 run
  assert 'oracle (12 questions)' in capsys.readouterr().out
  if dataset == 'locomo_answer':
    assert res['metric'] == 'F1' and ('position_bias' in res) == ('5' in res['by_category'])
  else:
    assert res['metric'] == 'SubEM' and res['oracle']['mean'] > 0.5  # the fake reads the gold fact back (mostly)


def test_timing_prompts_pad_the_gold_with_its_neighbours():
  items = tuple(Item(id=f'i{j}', text=f't{j}', parent='p', position=j) for j in range(6))
  q = Question(id='q', text='?', gold=('i4',), gold_parents=('p',), category=1)
  ep = Episode(id='e', items=items, questions=(q,))
  assert RC.padded(ep, q, 3) == ['i4', 'i3', 'i5']
  assert RC.padded(ep, q, 5) == ['i4', 'i3', 'i5', 'i2', 'i1']
  assert sorted(RC.padded(ep, q, 99)) == sorted(it.id for it in items)
