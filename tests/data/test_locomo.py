"""LoCoMo loader on the real file (when present) and on small malformed files."""

import json

import pytest

from engram_jax.core.types import LoadReport
from engram_jax.data import io, locomo

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
  assert c['questions_read'] == 1986 and c['turns_read'] == c['items'] == 5882
  assert c['duplicate_qa_kept'] == 11 and c['answer_number_stringified'] == 6  # upstream conv-48 repeats 11 qa
  for reason in (
    'blank_turn_dropped',
    'blank_text_with_caption',
    'empty_session',
    'evidence_null',
    'caption_null',
    'evidence_missing',
    'empty_evidence_id',
    'answer_missing',
    'session_without_date',
  ):
    assert c[reason] == 0, reason
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
  return [
    {
      'sample_id': 's1',
      'conversation': {
        'speaker_a': 'A',
        'speaker_b': 'B',
        'session_1_date_time': '1:56 pm on 8 May, 2023',
        'session_1': [
          {'speaker': 'A', 'dia_id': 'D1:1', 'text': 'hi'},
          {'speaker': 'B', 'dia_id': 'D1:2', 'text': 'yo'},
        ],
        'session_2_date_time': '2:00 pm on 9 May, 2023',
        'session_2': [{'speaker': 'A', 'dia_id': 'D2:1', 'text': 'later'}],
      },
      'qa': [
        {'question': 'q?', 'answer': 'a', 'evidence': evidence, 'category': 4},
        {'question': 'q2?', 'answer': 'a', 'evidence': ['D9:9'], 'category': 2},
      ],
    }
  ]


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


# ------------------------------------------------------------------- malformed input: errors or counted


def _load_err(tmp_path, data, match):
  with pytest.raises(ValueError, match=match) as info:
    locomo.load_locomo(_write(tmp_path, data))
  assert 'locomo10.json' in str(info.value)
  return str(info.value)


def test_duplicate_sample_id_rejected(tmp_path):
  data = _sample(['D1:1']) * 2
  msg = _load_err(tmp_path, data, r'duplicate sample_id')
  assert "'s1'" in msg


def test_null_or_missing_evidence_is_counted_and_excluded(tmp_path):
  data = _sample(None)
  del data[0]['qa'][1]['evidence']
  eps, rep = locomo.load_locomo(_write(tmp_path, data))
  assert eps[0].questions == ()
  assert rep.counts['evidence_null'] == 1 and rep.counts['evidence_missing'] == 1
  assert rep.counts['excluded_no_evidence'] == 2 and rep.counts['questions_read'] == 2
  assert rep.examples['evidence_null'] == ['s1/q0']


def test_empty_session_counted(tmp_path):
  data = _sample(['D1:1'])
  data[0]['conversation'].update(session_3=[], session_3_date_time='3:00 pm on 10 May, 2023')
  eps, rep = locomo.load_locomo(_write(tmp_path, data))
  assert rep.counts['empty_session'] == 1 and rep.examples['empty_session'] == [('s1', 'session_3')]
  assert eps[0].n_items == 3


def test_blank_turns_dropped_and_gold_on_them_counted(tmp_path):
  data = _sample(['D1:2', 'D1:1'])
  conv = data[0]['conversation']
  conv['session_1'][1]['text'] = '  '
  conv['session_2'].append({'speaker': 'B', 'dia_id': 'D2:2', 'text': '', 'blip_caption': 'a dog'})
  data[0]['qa'].append({'question': 'q3?', 'answer': 'a', 'evidence': ['D1:2'], 'category': 1})
  eps, rep = locomo.load_locomo(_write(tmp_path, data))
  assert [it.id for it in eps[0].items] == ['D1:1', 'D2:1', 'D2:2']  # the captioned photo turn stays
  assert eps[0].items[2].text == '[2:00 pm on 9 May, 2023] B:  [shares a photo: a dog]'
  assert rep.counts['blank_turn_dropped'] == 1 and rep.counts['blank_text_with_caption'] == 1
  assert rep.counts['dropped_blank_turn_id'] == 2 and rep.counts['dropped_unresolved_id'] == 1
  assert [q.id for q in eps[0].questions] == ['s1/q0'] and eps[0].questions[0].gold == ('D1:1',)
  assert rep.counts['turns_read'] == 4 and rep.counts['items'] == 3
  # Without the caption in the template the photo turn has no content: dropped as well.
  eps, rep = locomo.load_locomo(tmp_path, template='text')
  assert [it.id for it in eps[0].items] == ['D1:1', 'D2:1'] and rep.counts['blank_turn_dropped'] == 2


@pytest.mark.parametrize(
  'damage, match',
  [
    (lambda d: d[0].update(sample_id=7), r'sample 0: sample_id is int'),
    (lambda d: d[0].update(conversation=[]), r's1: conversation is list'),
    (lambda d: d[0].update(qa=None), r's1: qa is NoneType'),
    (lambda d: d[0]['conversation'].update(session_1=None), r's1: session_1 is NoneType'),
    (lambda d: d[0]['conversation']['session_1'][0].pop('text'), r"s1: session_1 turn 0 lacks field 'text'"),
    (lambda d: d[0]['conversation']['session_1'][0].update(text=3), r's1: session_1 turn 0 has text 3'),
    (lambda d: d[0]['conversation']['session_1'][0].update(dia_id=None), r's1: session_1 turn 0 has dia_id None'),
    (lambda d: d[0]['conversation']['session_1'][1].update(dia_id='D1:1'), r"s1: duplicate dia_id \['D1:1'\]"),
    (lambda d: d[0]['conversation']['session_1'][0].update(blip_caption=[]), r'blip_caption'),
    (lambda d: d[0]['conversation'].update(session_1_date_time=5), r's1: session_1_date_time is int'),
    (lambda d: d[0]['conversation'].update(session_01=[]), r's1: session_01 and session_1'),
    (lambda d: d[0]['conversation'].update(session_1=[], session_2=[]), r's1: no turns'),
    (lambda d: d[0]['qa'][0].update(evidence='D1:1'), r's1/q0: evidence is str'),
    (lambda d: d[0]['qa'][0].update(evidence=['D1:1', 5]), r's1/q0: evidence entry 5'),
    (lambda d: d[0]['qa'][0].update(category=1.5), r's1/q0: category 1.5'),
    (lambda d: d[0]['qa'][0].update(category=True), r's1/q0: category True'),
    (lambda d: d[0]['qa'][0].update(question=''), r's1/q0: question'),
    (lambda d: d[0]['qa'][0].update(answer=['a']), r's1/q0: answer'),
    (lambda d: d[0]['qa'].__setitem__(0, 'q'), r's1/q0 is str'),
  ],
  ids=lambda v: v if isinstance(v, str) else 'damage',
)
def test_malformed_fields_name_file_and_place(tmp_path, damage, match):
  """Each malformed field gives a ValueError naming the file and the sample / session / turn / question."""
  data = _sample(['D1:1'])
  damage(data)
  _load_err(tmp_path, data, match)


def test_other_normalisations_counted(tmp_path):
  data = _sample(['D1:1', ''])
  data[0]['qa'][0]['answer'] = 4
  del data[0]['qa'][1]['answer']
  data[0]['qa'].append(dict(data[0]['qa'][0]))
  data[0]['conversation']['session_2_date_time'] = ' '
  data[0]['conversation']['session_1'][0]['blip_caption'] = None
  eps, rep = locomo.load_locomo(_write(tmp_path, data))
  assert rep.counts['empty_evidence_id'] == 2 and 'split_multi_id' not in rep.counts
  assert rep.counts['answer_number_stringified'] == 2 and eps[0].questions[0].answer == '4'
  assert rep.counts['answer_missing'] == 1
  assert rep.counts['duplicate_qa_kept'] == 1 and rep.examples['duplicate_qa_kept'] == [('s1/q2', 's1/q0')]
  assert rep.counts['session_without_date'] == 1 and eps[0].items[2].time is None
  assert rep.examples['caption_null'] == [('s1', 'D1:1')]
