"""LoCoMo loader on the real file (when present) and on small malformed files."""

import json

import pytest

from engram_jax.data import io, locomo
from engram_jax.types import LoadReport

try:
  ROOT = io.resolve_data_root()
  HAVE = (ROOT / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
real = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root (set ENGRAM_DATA_ROOT)')


@real
def test_real_counts_and_normalisations():
  eps, rep = locomo.load_locomo(template='speaker')
  assert len(eps) == 10
  assert sum(len(e.questions) for e in eps) == 1982
  assert sum(e.n_items for e in eps) == 5882
  c = rep.counts
  assert c['excluded_no_evidence'] == 4
  assert c['split_multi_id'] == 4 and c['fixed_extra_colon'] == 1 and c['fixed_leading_zero'] == 1
  assert c['dropped_unresolved_id'] == 3
  cats = {}
  for e in eps:
    for q in e.questions:
      cats[q.category] = cats.get(q.category, 0) + 1
  assert cats == {1: 282, 2: 321, 3: 92, 4: 841, 5: 446}
  conv49 = next(e for e in eps if e.id == 'conv-49')
  q = next(q for q in conv49.questions if q.id == 'conv-49/q38')
  assert set(q.gold) == {'D22:1', 'D22:2', 'D9:10', 'D9:11'} and set(q.gold_parents) == {'session_22', 'session_9'}


@real
def test_templates_render_speaker_date_and_caption():
  eps, _ = locomo.load_locomo(template='dated', conversations=['conv-26'])
  it = eps[0].items[4]
  assert it.id == 'D1:5' and it.parent == 'session_1' and it.position == 4
  assert it.text.startswith('[1:56 pm on 8 May, 2023] Caroline: ') and '[shares a photo: a photo of a dog' in it.text
  eps, _ = locomo.load_locomo(template='text', conversations=['conv-26'])
  assert eps[0].items[0].text == 'Hey Mel! Good to see you! How have you been?'


def _write(tmp_path, obj_or_text):
  d = tmp_path / 'locomo'
  d.mkdir()
  (d / 'locomo10.json').write_text(obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text))
  return tmp_path


def _sample(evidence):
  return [{'sample_id': 's1', 'conversation': {
      'speaker_a': 'A', 'speaker_b': 'B', 'session_1_date_time': 'd1',
      'session_1': [{'speaker': 'A', 'dia_id': 'D1:1', 'text': 'hi'}, {'speaker': 'B', 'dia_id': 'D1:2', 'text': 'yo'}],
      'session_2_date_time': 'd2', 'session_2': [{'speaker': 'A', 'dia_id': 'D2:1', 'text': 'later'}]},
      'qa': [{'question': 'q?', 'answer': 'a', 'evidence': evidence, 'category': 4},
             {'question': 'q2?', 'answer': 'a', 'evidence': ['D9:9'], 'category': 2}]}]


def test_normalisation_counted(tmp_path):
  root = _write(tmp_path, _sample(['D1:01; D:2:1', 'D1:2 D1:2', 'nope']))
  eps, rep = locomo.load_locomo(root)
  assert eps[0].questions[0].gold == ('D1:1', 'D2:1', 'D1:2')
  assert rep.counts['fixed_leading_zero'] == 1 and rep.counts['fixed_extra_colon'] == 1
  assert rep.counts['split_multi_id'] == 2 and rep.counts['dropped_duplicate_id'] == 1
  assert rep.counts['dropped_unresolved_id'] == 2 and rep.counts['excluded_no_evidence'] == 1
  assert [it.position for it in eps[0].items] == [0, 1, 2]


def test_malformed_json_names_file_and_position(tmp_path):
  root = _write(tmp_path, '[{"sample_id": "s1",, }]')
  with pytest.raises(ValueError, match=r'locomo10\.json: malformed JSON at line 1 column'):
    locomo.load_locomo(root)


def test_missing_field_and_missing_root(tmp_path):
  bad = _sample(['D1:1'])
  del bad[0]['qa'][0]['question']
  with pytest.raises(ValueError, match='s1/q0'):
    locomo.load_locomo(_write(tmp_path, bad))
  with pytest.raises(FileNotFoundError, match='ENGRAM_DATA_ROOT'):
    locomo.load_locomo(tmp_path / 'nowhere')
  (tmp_path / 'empty').mkdir()
  with pytest.raises(FileNotFoundError, match='snap-research/locomo'):
    locomo.load_locomo(tmp_path / 'empty')


def test_load_report_summary_lists_every_reason():
  r = LoadReport('x')
  r.add('a', 1)
  r.add('b', n=3)
  assert 'a: 1' in r.summary() and 'b: 3' in r.summary() and r.to_dict()['counts'] == {'a': 1, 'b': 3}
