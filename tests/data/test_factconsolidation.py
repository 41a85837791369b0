"""FactConsolidation loader: fact parsing, derived gold, malformed input, and the real 6K/32K files when present."""

import json

import pytest

from engram_jax.core.types import LoadReport
from engram_jax.data import factconsolidation as F
from engram_jax.data.io import resolve_data_root
from engram_jax.metrics import official

CONTEXT = (
  'Here is a list of facts:\n'
  '0. Charles Darwin is married to Emma Darwin.\n'
  '1. The author of Our Mutual Friend is Charles Dickens.\n'
  '2. Emma Darwin is a citizen of United Kingdom.\n'
  '3. The author of Our Mutual Friend is Charles Darwin.\n'
  '4. Charles Darwin is married to Amala Paul.\n'
  '5. Amala Paul is a citizen of India.\n'
  '6. Amala Paul is a citizen of Belgium.\n'
  "7. Walter Chrysler's child is Walter Percy Chrysler Jr..\n"
  '8. The Prime Minister of Sweden is Stefan Löfven.\n'
)


def _row(source, questions, answers, context=CONTEXT):
  return {
    'context': context,
    'questions': questions,
    'answers': answers,
    'metadata': {'source': source, 'qa_pair_ids': [f'{source}_no{i}' for i in range(len(questions))]},
  }


def test_parse_facts_reports_irregularities():
  ctx = (
    'Facts follow\n3. C is a citizen of X.\n1. A is a citizen of Y.\nnot a fact\n\n'
    '1. dup line.\n4. D was founded by Z.\n'
  )
  report = LoadReport('t')
  facts = F.parse_facts(ctx, report=report, source='s')
  assert [f.serial for f in facts] == [1, 3, 4]
  assert facts[0].text == 'A is a citizen of Y.'
  for reason in ('header_missing', 'unparsed_line', 'duplicate_serial_dropped', 'serial_out_of_order'):
    assert report.counts[reason] == 1, reason
  assert report.counts['serial_gap'] == 2  # 1 -> 3 and a list not starting at 0
  assert report.examples['unparsed_line'][0][2] == 'not a fact'


def test_parse_triple_templates():
  assert F.parse_triple('The univeristy where Wilhelm II was educated is Baldwin Wallace University.') == (
    'P69',
    'Wilhelm II',
    'Baldwin Wallace University',
  )
  assert F.parse_triple('Pedro Pierluisi worked in the city of Washington, D.C..') == (
    'P937',
    'Pedro Pierluisi',
    'Washington, D.C.',
  )
  assert F.parse_triple("Walter Chrysler's child is Walter Percy Chrysler Jr..").subject == 'Walter Chrysler'
  assert F.parse_triple('The Prime Minister of Sweden is Stefan Löfven.') == (
    'title:Prime Minister',
    'Sweden',
    'Stefan Löfven',
  )
  assert F.parse_triple('no template here') is None
  assert F.match_key("Walter Chrysler's child, the Heir") == 'walter chrysler s child heir'


def test_single_hop_gold_is_newest_matching_fact():
  row = _row(
    'factconsolidation_sh_tiny',
    [
      'Who is Charles Darwin married to?',
      "Who is Walter Chrysler's child?",
      'Who leads the government?',
      'Where is Amala Paul a citizen?',
      'Who is nobody?',
    ],
    [['Amala Paul'], ['Walter Percy Chrysler Jr.'], ['Stefan Löfven'], ['India'], ['Nobody Atall']],
  )
  report = LoadReport('t')
  ep = F.episode_from_row(row, report=report)
  assert ep.id == 'factconsolidation_sh_tiny' and ep.n_items == 9
  assert [it.position for it in ep.items] == list(range(9)) and ep.items[4].parent == '4'
  gold = {q.id.rsplit('_', 1)[1]: q.gold for q in ep.questions}
  assert gold == {'no0': ('4',), 'no1': ('7',), 'no2': ('8',), 'no3': ('5',)}
  assert report.counts['gold_sh_subject_object'] == 3  # 'Who leads the government?' names no subject ...
  assert report.counts['gold_answer_text_fallback'] == 1  # ... so the answer-text fallback finds fact 8
  assert report.counts['excluded_no_gold'] == 1 and report.counts['questions_kept'] == 4
  # 'India' is the superseded citizenship of Amala Paul: counted as an anomaly.
  assert report.counts['gold_not_newest_in_slot'] == 1
  q0 = ep.questions[0]
  assert F.answers_of(q0) == ('Amala Paul',) and q0.category == 'single-hop'
  v = F.asked_fact_versions(ep, q0)
  assert v == F.FactVersions(newest='4', superseded=('0',), anomalous=False)
  assert official.newest_outranks_superseded(['4', '0'], newest=v.newest, superseded=v.superseded) is True
  v3 = F.asked_fact_versions(ep, ep.questions[3])
  assert v3 == F.FactVersions(newest='5', superseded=('6',), anomalous=True)
  assert report.counts['asked_slot_has_conflict'] == 2


def test_multi_hop_gold_is_the_chain_over_newest_facts():
  row = _row(
    'factconsolidation_mh_tiny',
    [
      'What is the country of citizenship of the spouse of the author of Our Mutual Friend?',
      'What is the country of citizenship of the spouse of Charles Darwin?',
    ],
    [['Belgium'], ['United Kingdom']],
  )
  report = LoadReport('t')
  ep = F.episode_from_row(row, report=report)
  q0, q1 = ep.questions
  assert q0.gold == ('3', '4', '6') and q0.category == 'multi-hop'
  assert F.asked_fact_versions(ep, q0) == F.FactVersions('6', ('5',), False)
  # Only a superseded spouse fact leads to 'United Kingdom': the relaxed rule finds it.
  assert q1.gold == ('0', '2')
  assert report.counts['gold_mh_chain_valid'] == 1 and report.counts['gold_mh_chain_any_version'] == 1


def test_malformed_rows_raise_value_error():
  with pytest.raises(ValueError, match='has 1 questions, 2 answer lists'):
    F.episode_from_row(
      {**_row('factconsolidation_sh_x', ['q'], [['a']]), 'answers': [['a'], ['b']]}, report=LoadReport('t')
    )
  with pytest.raises(ValueError, match='factconsolidation_sh_x_no0 has answers'):
    F.episode_from_row(_row('factconsolidation_sh_x', ['q'], [[]]), report=LoadReport('t'))
  with pytest.raises(ValueError, match="lacks field 'context'"):
    F.episode_from_row({'questions': []}, report=LoadReport('t'))
  with pytest.raises(ValueError, match='single- from multi-hop'):
    F.episode_from_row(_row('factconsolidation_xx', ['q'], [['a']]), report=LoadReport('t'))


def test_malformed_json_names_the_file(tmp_path):
  folder = tmp_path / 'memoryagentbench'
  folder.mkdir()
  (folder / F.FILES['6k']).write_text('{"data": [')
  with pytest.raises(ValueError, match=r'factconsolidation_official_6k\.json: malformed JSON'):
    F.load_factconsolidation(tmp_path, size='6k', hop='sh')
  (folder / F.FILES['6k']).write_text(json.dumps({'data': [_row('factconsolidation_mh_6k', ['q'], [['a']])]}))
  with pytest.raises(ValueError, match="one row with source 'factconsolidation_sh_6k', found 0"):
    F.load_factconsolidation(tmp_path, size='6k', hop='sh')
  with pytest.raises(ValueError, match='Unknown FactConsolidation size'):
    F.load_factconsolidation(tmp_path, size='64k')
  with pytest.raises(FileNotFoundError):
    F.load_factconsolidation(tmp_path, size='32k')


def test_answers_of_rejects_non_json():
  from engram_jax.core.types import Question

  with pytest.raises(ValueError, match='not a JSON array'):
    F.answers_of(Question('x', 't', ('1',), ('1',), 'single-hop', answer='Belgium'))


# ---------------------------------------------------------------------------------------------- real data


def _real_root():
  try:
    root = resolve_data_root(None)
  except FileNotFoundError:
    return None
  return root if (root / 'memoryagentbench' / F.FILES['6k']).is_file() else None


REAL = _real_root()
needs_data = pytest.mark.skipif(
  REAL is None,
  reason='FactConsolidation data not found under the data root (set ENGRAM_DATA_ROOT); real-data checks skipped',
)

# (size, hop) -> (facts, questions kept, strict-rule gold, answer-not-newest anomalies)
EXPECTED = {
  ('6k', 'sh'): (455, 100, 100, 0),
  ('6k', 'mh'): (455, 100, 96, 3),
  ('32k', 'sh'): (2310, 100, 100, 2),
  ('32k', 'mh'): (2310, 100, 87, 7),
}


@needs_data
@pytest.mark.parametrize('size, hop', sorted(EXPECTED))
def test_real_counts_and_gold_coverage(size, hop):
  (ep,), report = F.load_factconsolidation(REAL, size=size, hop=hop)
  n_facts, n_q, strict, anomalies = EXPECTED[(size, hop)]
  assert ep.id == f'factconsolidation_{hop}_{size}'
  assert ep.n_items == report.counts['facts'] == n_facts
  assert [int(it.id) for it in ep.items] == list(range(n_facts))
  assert len(ep.questions) == report.counts['questions_kept'] == n_q
  rule = 'gold_sh_subject_object' if hop == 'sh' else 'gold_mh_chain_valid'
  assert report.counts[rule] == strict
  assert report.counts['gold_not_newest_in_slot'] == anomalies
  assert report.counts['questions_read'] == n_q
  for reason in (
    'unparsed_line',
    'header_missing',
    'serial_gap',
    'fact_no_template',
    'excluded_no_gold',
    'answer_string_wrapped',
    'duplicate_serial_dropped',
    'serial_out_of_order',
  ):
    assert report.counts[reason] == 0, reason
  for q in ep.questions:
    answers = F.answers_of(q)
    texts = [ep.items[int(g)].text for g in q.gold]
    assert official.answer_in_topk(texts, answers, k=len(texts))  # some gold fact holds the answer
  if (size, hop) == ('6k', 'sh'):
    q0 = ep.questions[0]
    assert q0.text == 'Which sport is goaltender associated with?' and q0.gold == ('310',)
    assert F.asked_fact_versions(ep, q0) == F.FactVersions('310', ('223',), False)


# ------------------------------------------------------------------- malformed input: errors or counted


def _write_file(tmp_path, rows):
  folder = tmp_path / 'memoryagentbench'
  folder.mkdir(exist_ok=True)
  (folder / F.FILES['6k']).write_text(json.dumps({'data': rows}))
  return tmp_path


def _sh_row(**changes):
  row = _row(
    'factconsolidation_sh_6k',
    ['Who is Charles Darwin married to?', "Who is Walter Chrysler's child?"],
    [['Amala Paul'], ['Walter Percy Chrysler Jr.']],
  )
  row.update(changes)
  return row


def test_duplicate_rows_and_qa_ids_rejected(tmp_path):
  with pytest.raises(ValueError, match=r'factconsolidation_official_6k\.json: duplicate rows .*found 2'):
    F.load_factconsolidation(_write_file(tmp_path, [_sh_row(), _sh_row()]), size='6k', hop='sh')
  row = _sh_row()
  row['metadata']['qa_pair_ids'] = ['x', 'x']
  with pytest.raises(
    ValueError,
    match=r'factconsolidation_official_6k\.json: factconsolidation_sh_6k: duplicate '
    r"qa_pair_ids \['x'\]",
  ):
    F.load_factconsolidation(_write_file(tmp_path, [row]), size='6k', hop='sh')


@pytest.mark.parametrize(
  'changes, match',
  [
    ({'questions': None}, r'factconsolidation_sh_6k: questions is NoneType, expected a list'),
    ({'answers': 'a'}, r'factconsolidation_sh_6k: answers is str, expected a list'),
    ({'context': None}, r'factconsolidation_sh_6k: context is NoneType, expected a string'),
    ({'context': 'Here is a list of facts:\n'}, r'factconsolidation_sh_6k: context holds no numbered fact'),
    ({'metadata': {'source': 'factconsolidation_sh_6k', 'qa_pair_ids': None}}, r'qa_pair_ids is NoneType'),
    (
      {'metadata': {'source': 'factconsolidation_sh_6k', 'qa_pair_ids': ['a', 7]}},
      r'factconsolidation_sh_6k: question 1 has qa_pair_id 7, expected a non-empty string',
    ),
    ({'answers': [['Amala Paul'], ['']]}, r'question factconsolidation_sh_6k_no1 has answers'),
    ({'answers': [['Amala Paul'], None]}, r'question factconsolidation_sh_6k_no1 has answers'),
    ({'questions': ['Who?', 5]}, r'question factconsolidation_sh_6k_no1 has question 5'),
    ({'metadata': None}, r'data row 0 has no metadata\.source'),
  ],
)
def test_malformed_row_fields_name_file_and_question(tmp_path, changes, match):
  with pytest.raises(ValueError, match=match) as info:
    F.load_factconsolidation(_write_file(tmp_path, [_sh_row(**changes)]), size='6k', hop='sh')
  assert 'factconsolidation_official_6k.json' in str(info.value)


def test_row_errors_without_a_path_name_the_row():
  with pytest.raises(ValueError, match=r'^FactConsolidation row factconsolidation_sh_6k: questions is NoneType'):
    F.episode_from_row(_sh_row(questions=None), report=LoadReport('t'))


def test_string_answer_wrapping_and_questions_read_counted(tmp_path):
  (ep,), report = F.load_factconsolidation(
    _write_file(tmp_path, [_sh_row(answers=['Amala Paul', ['Nobody']])]), size='6k', hop='sh'
  )
  assert report.counts['answer_string_wrapped'] == 1 and F.answers_of(ep.questions[0]) == ('Amala Paul',)
  assert report.counts['questions_read'] == 2 and report.counts['questions_kept'] == 1
  assert report.counts['excluded_no_gold'] == 1
