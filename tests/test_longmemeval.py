"""LongMemEval loader: small synthetic entries, malformed input, and the real S / oracle files when present."""

import collections
import copy
import gzip
import json

import pytest

from engram_jax import official
from engram_jax.data import longmemeval as L
from engram_jax.data.io import resolve_data_root
from engram_jax.types import LoadReport


def _entry(**over):
  e = {
      'question_id': 'q1', 'question_type': 'single-session-user', 'question': 'What degree?',
      'question_date': '2023/05/30 (Tue) 23:40', 'answer': 'Business Administration',
      'answer_session_ids': ['answer_aa'],
      'haystack_dates': ['2023/05/21 (Sun) 10:00', '2023/05/20 (Sat) 09:00', '2023/05/22 (Mon) 08:00'],
      'haystack_session_ids': ['answer_aa', 'sharegpt_x_0', 'f1'],
      'haystack_sessions': [
          [{'role': 'user', 'content': 'I graduated in BA', 'has_answer': True},
           {'role': 'assistant', 'content': 'Congrats', 'has_answer': False},
           {'role': 'user', 'content': 'thanks', 'has_answer': False}],
          [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'},
           {'role': 'user', 'content': '  '}],
          [{'role': 'assistant', 'content': 'only me'}],
      ],
  }
  e.update(over)
  return e


def test_turn_level_ids_order_and_gold():
  report = LoadReport('t')
  ep = L.episode_from_entry(_entry(), level='turn', report=report)
  assert [it.id for it in ep.items] == ['sharegpt_x_0_1', 'answer_aa_1', 'noans_aa_3']
  assert [it.parent for it in ep.items] == ['sharegpt_x_0', 'answer_aa', 'answer_aa']
  assert [it.position for it in ep.items] == [0, 1, 2]
  assert ep.items[1].text == 'I graduated in BA' and ep.items[1].speaker == 'user'
  assert ep.items[1].time == '2023/05/21 (Sun) 10:00'
  (q,) = ep.questions
  assert q.gold == ('answer_aa_1',) and q.gold_parents == ('answer_aa',)
  assert q.category == 'single-session-user' and q.time == '2023/05/30 (Tue) 23:40'
  assert report.counts['haystack_out_of_order'] == 1 and report.counts['empty_turn_dropped'] == 1
  assert official.longmemeval_correct_docs([it.id for it in ep.items]) == list(q.gold)


def test_turn_level_template_roles_and_keep_empty():
  ep = L.episode_from_entry(_entry(), level='turn', template='role', roles=('user', 'assistant'), drop_empty=False)
  ids = [it.id for it in ep.items]
  assert ids == ['sharegpt_x_0_1', 'sharegpt_x_0_2', 'sharegpt_x_0_3', 'answer_aa_1', 'noans_aa_2', 'noans_aa_3',
                 'f1_1']
  assert ep.items[3].text == 'user: I graduated in BA'


def test_session_level_text_ids_and_gold():
  report = LoadReport('t')
  ep = L.episode_from_entry(_entry(), level='session', report=report)
  assert [it.id for it in ep.items] == ['sharegpt_x_0', 'answer_aa']  # 'f1' has no user text: dropped
  assert ep.items[0].text == 'hi   '  # official: ' '.join of the user contents, blanks included
  assert ep.items[1].text == 'I graduated in BA thanks'
  assert ep.questions[0].gold == ('answer_aa',)
  assert report.counts['empty_session_dropped'] == 1
  # An evidence session whose evidence is only on the assistant side gets the official 'noans' id.
  e = _entry()
  e['haystack_sessions'][0][0]['has_answer'] = False
  e['haystack_sessions'][0][1]['has_answer'] = True
  ep = L.episode_from_entry(e, level='session')
  assert ep.items[1].id == 'noans_aa' and ep.items[1].parent == 'answer_aa'
  assert ep.questions[0].gold == ('noans_aa',) and ep.questions[0].gold_parents == ('answer_aa',)
  assert official.official_skip_reason('q1', [it.id for it in ep.items]) == 'no_user_evidence'
  assert L.entry_skip_reason(e) == 'no_user_evidence'
  # ... and at turn level (user turns) such a question has no gold: excluded and counted.
  report = LoadReport('t')
  assert L.episode_from_entry(e, level='turn', report=report) is None
  assert report.counts['excluded_no_gold'] == 1


def test_abstention_kept_with_skip_reason_and_int_answer():
  report = LoadReport('t')
  ep = L.episode_from_entry(_entry(question_id='q1_abs', answer=3), level='session', report=report)
  assert ep.questions[0].answer == '3'
  assert report.counts['abstention_kept'] == 1 and report.counts['answer_int_stringified'] == 1
  assert official.official_skip_reason(ep.questions[0].id, [it.id for it in ep.items]) == 'abstention'


def test_duplicate_session_and_unknown_answer_session():
  e = _entry()
  e['haystack_session_ids'] = e['haystack_session_ids'] + ['sharegpt_x_0']
  e['haystack_dates'] = e['haystack_dates'] + ['2023/05/19 (Fri) 09:00']
  e['haystack_sessions'] = e['haystack_sessions'] + [copy.deepcopy(e['haystack_sessions'][1])]
  e['answer_session_ids'] = ['answer_aa', 'answer_zz']
  report = LoadReport('t')
  ep = L.episode_from_entry(e, level='session', report=report)
  assert [it.id for it in ep.items] == ['sharegpt_x_0', 'answer_aa']
  assert ep.items[0].time == '2023/05/19 (Fri) 09:00'  # the earliest copy is kept
  assert report.counts['duplicate_session_dropped'] == 1 and report.counts['unknown_answer_session_id'] == 1
  assert ep.questions[0].gold_parents == ('answer_aa',)


@pytest.mark.parametrize('mutate, match', [
    (lambda e: e.pop('answer_session_ids'), r'q1: missing fields \[.answer_session_ids.\]'),
    (lambda e: e['haystack_dates'].pop(), 'q1: haystack_session_ids/dates/sessions have lengths'),
    (lambda e: e['haystack_dates'].__setitem__(0, 'May 21'), 'q1: unparsable haystack date'),
    (lambda e: e['haystack_sessions'][0][0].pop('content'), 'q1: session answer_aa turn 0 lacks role/content'),
    (lambda e: e['haystack_sessions'][0][0].__setitem__('has_answer', 'yes'), 'q1: .* is not a bool'),
])
def test_malformed_entries_name_the_question(mutate, match):
  e = _entry()
  mutate(e)
  with pytest.raises(ValueError, match=match):
    L.episode_from_entry(e, level='turn')


def test_bad_level_and_duplicate_question_ids():
  with pytest.raises(ValueError, match='level'):
    L.episode_from_entry(_entry(), level='doc')
  with pytest.raises(ValueError, match='q1: duplicate question id'):
    L.episodes_from_entries([_entry(), _entry()], level='turn')


def test_malformed_json_names_the_file(tmp_path):
  folder = tmp_path / 'longmemeval'
  folder.mkdir()
  with gzip.open(folder / L.FILES['s'], 'wt', encoding='utf-8') as f:
    f.write('[{"question_id": "q1",')
  with pytest.raises(ValueError, match=r'longmemeval_s_cleaned_498of500\.json\.gz: malformed JSON'):
    L.load_longmemeval(tmp_path, split='s')
  (folder / L.FILES['oracle']).write_text(json.dumps({'not': 'a list'}))
  with pytest.raises(ValueError, match='expected a JSON list'):
    L.load_longmemeval(tmp_path, split='oracle')
  with pytest.raises(ValueError, match='Unknown LongMemEval split'):
    L.load_longmemeval(tmp_path, split='m')


def test_small_file_round_trip(tmp_path):
  folder = tmp_path / 'longmemeval'
  folder.mkdir()
  (folder / L.FILES['oracle']).write_text(json.dumps([_entry(), _entry(question_id='q2_abs')]))
  episodes, report = L.load_longmemeval(tmp_path, split='oracle', level='session')
  assert [e.id for e in episodes] == ['q1', 'q2_abs'] and report.counts['questions_kept'] == 2


# ---------------------------------------------------------------------------------------------- real data


def _real_root():
  try:
    root = resolve_data_root(None)
  except FileNotFoundError:
    return None
  return root if (root / 'longmemeval' / L.FILES['s']).is_file() else None


REAL = _real_root()
needs_data = pytest.mark.skipif(REAL is None, reason='LongMemEval data not found under the data root '
                                '(set ENGRAM_DATA_ROOT); real-data checks skipped')


@pytest.fixture(scope='module')
def s_entries():
  return L.read_longmemeval(REAL, split='s')


@needs_data
def test_real_s_both_levels(s_entries):
  assert len(s_entries) == 498
  assert sum(len(s) for e in s_entries for s in e['haystack_sessions']) == 245625
  turn_eps, turn_rep = L.episodes_from_entries(s_entries, level='turn')
  sess_eps, sess_rep = L.episodes_from_entries(s_entries, level='session')
  for rep in (turn_rep, sess_rep):
    assert rep.counts['haystack_out_of_order'] == 210
    assert rep.counts['duplicate_session_dropped'] == 13
    assert rep.counts['answer_int_stringified'] == 32
  # Turn level (user turns): the 71 questions without user-side evidence have no gold.
  assert len(turn_eps) == 427 and turn_rep.counts['excluded_no_gold'] == 71
  assert turn_rep.counts['empty_turn_dropped'] == 9
  assert sum(e.n_items for e in turn_eps) == turn_rep.counts['items'] == 104154
  assert len(sess_eps) == 498 and sess_rep.counts['abstention_kept'] == 30
  by_id = {e['question_id']: e for e in s_entries}
  reasons = collections.Counter()
  for ep in sess_eps:
    q = ep.questions[0]
    ids = [it.id for it in ep.items]
    reason = official.official_skip_reason(q.id, ids)
    assert reason == L.entry_skip_reason(by_id[q.id])
    reasons[reason] += 1
    assert set(q.gold_parents) == set(by_id[q.id]['answer_session_ids'])
    times = [L.parse_haystack_date(it.time) for it in ep.items]
    assert times == sorted(times)
  assert reasons == {None: 418, 'abstention': 30, 'no_user_evidence': 50}
  for ep in turn_eps:
    ids = [it.id for it in ep.items]
    assert official.longmemeval_correct_docs(ids) == sorted(ep.questions[0].gold)
  # An oracle ranking (gold first) scores 1 on the official session metrics.
  ep = sess_eps[0]
  gold = set(official.longmemeval_correct_docs([it.id for it in ep.items]))
  ranking = sorted(range(ep.n_items), key=lambda i: ep.items[i].id not in gold)
  scores = official.longmemeval_scores(ranking, [it.id for it in ep.items], level='session')
  assert scores['session']['recall_all@10'] == 1.0 and scores['session']['ndcg_any@10'] == 1.0


@needs_data
def test_real_oracle():
  episodes, report = L.load_longmemeval(REAL, split='oracle', level='session')
  assert len(episodes) == 500 and report.counts['haystack_out_of_order'] == 34
  assert sum(e.n_items for e in episodes) == 948
