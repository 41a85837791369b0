"""Structural fuzzing of the dataset loaders.

A small valid record is damaged at random (a key deleted; a value set to None, a wrong type, an empty list / string
or a blank string; a list entry duplicated or dropped; a list or string truncated) and loaded. The loader must
either raise a ``ValueError`` that names the file (LongMemEval: the question id or entry), or return episodes whose
question count the :class:`~engram_jax.core.types.LoadReport` accounts for: ``questions_kept`` equals the questions
returned and the questions read equal the kept ones plus the counted exclusions. Any other exception, or a
question count the report does not explain, fails.
"""

from __future__ import annotations

import copy
import json
import pathlib
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_jax.core.types import Episode, LoadReport
from engram_jax.data import factconsolidation as F
from engram_jax.data import locomo
from engram_jax.data import longmemeval as L

Path = tuple[Any, ...]
REPLACEMENTS = (None, 0, -1, 1.5, True, '', '   ', 'x', [], {}, [None], ['x'], {'x': 1})
OPS = ('delete', 'replace', 'duplicate', 'drop_entry', 'truncate', 'empty', 'blank')
FUZZ = settings(max_examples=80)

# ---------------------------------------------------------------------------------------------- damage


def paths_of(node: Any, prefix: Path = ()) -> list[Path]:
  """Every path (tuple of keys / indices) into a JSON value, the root ``()`` included."""
  out = [prefix]
  if isinstance(node, dict):
    for k, v in node.items():
      out += paths_of(v, prefix + (k,))
  elif isinstance(node, list):
    for i, v in enumerate(node):
      out += paths_of(v, prefix + (i,))
  return out


def _get(node: Any, path: Path) -> Any:
  for k in path:
    node = node[k]
  return node


def damage(data: Any, path: Path, op: str, value: Any = None, k: int = 0) -> Any:
  """A damaged deep copy of ``data``: ``op`` applied at ``path`` (``value``: the replacement, ``k``: an index).

  ``delete`` removes the key / entry; ``replace`` sets ``value``; ``duplicate`` inserts a copy of the node's
  ``k``-th entry (lists only); ``drop_entry`` removes its ``k``-th entry; ``truncate`` keeps the first ``k`` entries /
  characters; ``empty`` sets an empty value of the node's type; ``blank`` sets a whitespace string. An operation
  that does not apply to the node leaves the data unchanged.
  """
  data = copy.deepcopy(data)
  node = _get(data, path)
  new = node
  if op == 'replace':
    new = value
  elif op == 'empty':
    new = type(node)() if isinstance(node, (dict, list, str)) else node
  elif op == 'blank':
    new = '  ' if isinstance(node, str) else node
  elif op == 'truncate' and isinstance(node, (list, str)) and node:
    new = node[: k % len(node)]
  elif op == 'duplicate' and isinstance(node, list) and node:
    new = node[: k % len(node) + 1] + node[k % len(node) :]
  elif op == 'drop_entry' and isinstance(node, list) and node:
    new = node[: k % len(node)] + node[k % len(node) + 1 :]
  elif op == 'delete' and path:
    del _get(data, path[:-1])[path[-1]]
    return data
  if not path:
    return copy.deepcopy(new)
  _get(data, path[:-1])[path[-1]] = copy.deepcopy(new)
  return data


@st.composite
def damaged(draw: st.DrawFn, record: Any, max_damages: int = 2) -> Any:
  """``record`` with 1..``max_damages`` random structural damages."""
  data = record
  for _ in range(draw(st.integers(1, max_damages))):
    path = draw(st.sampled_from(paths_of(data)))
    data = damage(data, path, draw(st.sampled_from(OPS)), draw(st.sampled_from(REPLACEMENTS)), draw(st.integers(0, 5)))
  return data


def test_damage_helper():
  rec = {'a': [1, 2, 3], 'b': 'xyz'}
  assert damage(rec, ('a',), 'duplicate', k=1) == {'a': [1, 2, 2, 3], 'b': 'xyz'}
  assert damage(rec, ('a',), 'drop_entry', k=0) == {'a': [2, 3], 'b': 'xyz'}
  assert damage(rec, ('b',), 'truncate', k=2) == {'a': [1, 2, 3], 'b': 'xy'}
  assert damage(rec, ('a', 2), 'delete') == {'a': [1, 2], 'b': 'xyz'}
  assert damage(rec, (), 'replace', value=None) is None
  assert rec == {'a': [1, 2, 3], 'b': 'xyz'}
  assert len(paths_of(rec)) == 6


# ---------------------------------------------------------------------------------------------- checks


def check_well_typed(episodes: list[Episode]) -> None:
  """The returned episodes carry the declared types (no None / list smuggled in from the file)."""
  for ep in episodes:
    assert isinstance(ep.id, str) and ep.id.strip()
    for it in ep.items:
      assert isinstance(it.id, str) and isinstance(it.text, str) and isinstance(it.parent, str)
      assert it.time is None or isinstance(it.time, str)
      assert it.speaker is None or isinstance(it.speaker, str)
    for q in ep.questions:
      assert isinstance(q.id, str) and q.id.strip() and isinstance(q.text, str) and q.text.strip()
      assert q.gold and all(isinstance(g, str) for g in q.gold)
      assert all(isinstance(p, str) for p in q.gold_parents)
      assert isinstance(q.category, (int, str)) and not isinstance(q.category, bool)
      assert q.answer is None or isinstance(q.answer, str)
      assert q.time is None or isinstance(q.time, str)


def check_accounted(episodes: list[Episode], report: LoadReport, *, read: int, excluded: tuple[str, ...]) -> None:
  """Every question read is either returned or counted under one of the ``excluded`` reasons."""
  kept = sum(len(ep.questions) for ep in episodes)
  assert report.counts['questions_kept'] == kept
  assert read == kept + sum(report.counts[r] for r in excluded), (read, kept, dict(report.counts))


def load_or_value_error(
  load: Callable[[], tuple[list[Episode], LoadReport]], names: tuple[str, ...]
) -> tuple[list[Episode], LoadReport] | None:
  """``load()``, or None when it raised a ValueError whose message contains one of ``names``."""
  try:
    return load()
  except ValueError as e:
    assert any(n in str(e) for n in names), f'ValueError without the file / id: {e}'
    return None


# ---------------------------------------------------------------------------------------------- LoCoMo


def _turn(dia_id: str, speaker: str, text: str, **extra: Any) -> dict[str, Any]:
  return {'speaker': speaker, 'dia_id': dia_id, 'text': text, **extra}


LOCOMO = [
  {
    'sample_id': 's1',
    'conversation': {
      'speaker_a': 'A',
      'speaker_b': 'B',
      'session_1_date_time': '1:56 pm on 8 May, 2023',
      'session_1': [_turn('D1:1', 'A', 'hi there'), _turn('D1:2', 'B', 'look', blip_caption='a dog', img_url=['u'])],
      'session_2_date_time': '2:00 pm on 9 May, 2023',
      'session_2': [_turn('D2:1', 'A', 'later'), _turn('D2:2', 'B', 'sure')],
    },
    'qa': [
      {'question': 'Who said hi?', 'answer': 'A', 'evidence': ['D1:1'], 'category': 4},
      {'question': 'What pet?', 'answer': 'dog', 'evidence': ['D1:2', 'D2:1'], 'category': 1},
      {'question': 'Was it a cat?', 'adversarial_answer': 'no', 'evidence': ['D1:2'], 'category': 5},
    ],
    'session_summary': {'session_1_summary': 'greeting'},
  },
  {
    'sample_id': 's2',
    'conversation': {
      'speaker_a': 'C',
      'speaker_b': 'D',
      'session_1_date_time': '1:56 pm on 8 May, 2023',
      'session_1': [_turn('D1:1', 'C', 'one'), _turn('D1:2', 'D', 'two')],
    },
    'qa': [{'question': 'What first?', 'answer': 1, 'evidence': ['D1:1; D1:2'], 'category': 2}],
  },
]


def _load_locomo(data: Any) -> tuple[list[Episode], LoadReport] | None:
  with tempfile.TemporaryDirectory() as tmp:
    folder = pathlib.Path(tmp) / 'locomo'
    folder.mkdir()
    (folder / 'locomo10.json').write_text(json.dumps(data))
    return load_or_value_error(lambda: locomo.load_locomo(tmp), ('locomo10.json',))


def test_locomo_undamaged_record_loads():
  episodes, report = _load_locomo(LOCOMO)
  assert [len(ep.questions) for ep in episodes] == [3, 1]
  assert report.counts['questions_read'] == 4 and report.counts['items'] == 6
  check_well_typed(episodes)


@FUZZ
@given(damaged(LOCOMO))
def test_locomo_damage_is_an_error_or_counted(data):
  loaded = _load_locomo(data)
  if loaded is None:
    return
  episodes, report = loaded
  check_well_typed(episodes)
  # The loader did not raise, so the damaged file still has the list-of-samples shape it checks.
  assert report.counts['questions_read'] == sum(len(s['qa']) for s in data)
  check_accounted(episodes, report, read=report.counts['questions_read'], excluded=('excluded_no_evidence',))
  assert report.counts['items'] == sum(ep.n_items for ep in episodes)
  assert report.counts['turns_read'] == report.counts['items'] + report.counts['blank_turn_dropped']


# ---------------------------------------------------------------------------------------------- FactConsolidation


_CONTEXT = (
  'Here is a list of facts:\n'
  '0. Charles Darwin is married to Emma Darwin.\n'
  '1. The author of Our Mutual Friend is Charles Darwin.\n'
  '2. Charles Darwin is married to Amala Paul.\n'
  '3. Amala Paul is a citizen of Belgium.\n'
  '4. Emma Darwin is a citizen of India.\n'
)


def _fc_row(source: str, questions: list[str], answers: list[list[str]]) -> dict[str, Any]:
  return {
    'context': _CONTEXT,
    'questions': questions,
    'answers': answers,
    'metadata': {
      'source': source,
      'qa_pair_ids': [f'{source}_no{i}' for i in range(len(questions))],
      'demo': None,
      'question_types': None,
    },
  }


FACTCONSOLIDATION = {
  'dataset': 'ai-hyz/MemoryAgentBench',
  'split': 'Conflict_Resolution',
  'data': [
    _fc_row(
      'factconsolidation_mh_6k',
      ['What is the country of citizenship of the spouse of the author of Our Mutual Friend?'],
      [['Belgium']],
    ),
    _fc_row(
      'factconsolidation_sh_6k',
      ['Who is Charles Darwin married to?', 'Where is Amala Paul a citizen?'],
      [['Amala Paul'], ['Belgium']],
    ),
  ],
}


def _load_fc(data: Any, hop: str) -> tuple[list[Episode], LoadReport] | None:
  with tempfile.TemporaryDirectory() as tmp:
    folder = pathlib.Path(tmp) / 'memoryagentbench'
    folder.mkdir()
    (folder / F.FILES['6k']).write_text(json.dumps(data))
    return load_or_value_error(lambda: F.load_factconsolidation(tmp, size='6k', hop=hop), (F.FILES['6k'],))


@pytest.mark.parametrize('hop, n', [('sh', 2), ('mh', 1)])
def test_factconsolidation_undamaged_record_loads(hop, n):
  (ep,), report = _load_fc(FACTCONSOLIDATION, hop)
  assert len(ep.questions) == report.counts['questions_read'] == n and ep.n_items == 5
  check_well_typed([ep])


@FUZZ
@given(damaged(FACTCONSOLIDATION), st.sampled_from(['sh', 'mh']))
def test_factconsolidation_damage_is_an_error_or_counted(data, hop):
  loaded = _load_fc(data, hop)
  if loaded is None:
    return
  (ep,), report = loaded
  check_well_typed([ep])
  (row,) = [r for r in data['data'] if r['metadata']['source'] == f'factconsolidation_{hop}_6k']
  assert report.counts['questions_read'] == len(row['questions'])
  check_accounted([ep], report, read=len(row['questions']), excluded=('excluded_no_gold',))
  assert report.counts['facts'] == ep.n_items


# ---------------------------------------------------------------------------------------------- LongMemEval


def _lme_entry(qid: str, answer: Any = 'BA') -> dict[str, Any]:
  return {
    'question_id': qid,
    'question_type': 'single-session-user',
    'question': 'What degree?',
    'question_date': '2023/05/30 (Tue) 23:40',
    'answer': answer,
    'answer_session_ids': [f'answer_{qid}'],
    'haystack_dates': ['2023/05/20 (Sat) 09:00', '2023/05/21 (Sun) 10:00'],
    'haystack_session_ids': [f'answer_{qid}', f'filler_{qid}'],
    'haystack_sessions': [
      [
        {'role': 'user', 'content': 'I graduated in BA', 'has_answer': True},
        {'role': 'assistant', 'content': 'Congrats', 'has_answer': False},
      ],
      [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}],
    ],
  }


LONGMEMEVAL = [_lme_entry('q1'), _lme_entry('q2_abs', answer=3)]


def _lme_load(entries: Any, level: str) -> tuple[list[Episode], LoadReport] | None:
  return load_or_value_error(lambda: L.episodes_from_entries(entries, level=level), ('LongMemEval',))


def _lme_check(entries: Any, level: str) -> None:
  loaded = _lme_load(entries, level)
  if loaded is None:
    return
  episodes, report = loaded
  check_well_typed(episodes)
  check_accounted(episodes, report, read=len(entries), excluded=('excluded_no_gold',))
  assert report.counts['items'] == sum(ep.n_items for ep in episodes)
  for ep in episodes:
    (q,) = ep.questions
    assert len(set(q.gold_parents)) == len(q.gold_parents)


@pytest.mark.parametrize('level', ['turn', 'session'])
def test_longmemeval_undamaged_entries_load(level):
  episodes, report = _lme_load(LONGMEMEVAL, level)
  assert len(episodes) == report.counts['questions_kept'] == 2
  check_well_typed(episodes)


@FUZZ
@given(damaged(LONGMEMEVAL), st.sampled_from(['turn', 'session']))
def test_longmemeval_damage_is_an_error_or_counted(entries, level):
  _lme_check(entries, level)


@st.composite
def _lme_field_damaged(draw: st.DrawFn) -> Any:
  """LONGMEMEVAL with one top-level field of one entry damaged (random paths rarely pick these few)."""
  e_i = draw(st.integers(0, len(LONGMEMEVAL) - 1))
  key = draw(st.sampled_from(L.REQUIRED_FIELDS))
  return damage(
    LONGMEMEVAL, (e_i, key), draw(st.sampled_from(OPS)), draw(st.sampled_from(REPLACEMENTS)), draw(st.integers(0, 5))
  )


@FUZZ
@given(_lme_field_damaged(), st.sampled_from(['turn', 'session']))
def test_longmemeval_field_damage_is_an_error_or_counted(entries, level):
  _lme_check(entries, level)


# Damage that once raised TypeError from inside the loader, or passed a non-string (or blank) id / text / category
# / time into the Question: each now raises a one-line ValueError naming the question (or entry) and the field.
@pytest.mark.parametrize(
  'key, value, message',
  [
    ('question_id', None, 'LongMemEval entry 0: question_id is NoneType, expected a non-blank string'),
    ('question_id', ['q'], 'LongMemEval entry 0: question_id is list, expected a non-blank string'),
    ('question_id', '', 'LongMemEval entry 0: question_id is blank, expected a non-blank string'),
    ('question', None, 'LongMemEval question q1: question is NoneType, expected a non-blank string'),
    ('question', '', 'LongMemEval question q1: question is blank, expected a non-blank string'),
    ('question_type', None, 'LongMemEval question q1: question_type is NoneType, expected a non-blank string'),
    ('question_date', 5, 'LongMemEval question q1: question_date is int, expected a string'),
    ('haystack_session_ids', None, 'LongMemEval question q1: haystack_session_ids is NoneType, expected a list'),
    (
      'haystack_session_ids',
      ['a', 1],
      'LongMemEval question q1: haystack_session_ids entry 1 is int, expected a non-blank string',
    ),
    ('haystack_dates', 5, 'LongMemEval question q1: haystack_dates is int, expected a list'),
    ('haystack_sessions', None, 'LongMemEval question q1: haystack_sessions is NoneType, expected a list'),
    ('answer_session_ids', None, 'LongMemEval question q1: answer_session_ids is NoneType, expected a list'),
    ('answer_session_ids', [['x']], 'LongMemEval question q1: answer_session_ids entry 0 is list, expected a string'),
  ],
)
@pytest.mark.parametrize('level', ['turn', 'session'])
def test_longmemeval_bad_field_names_question_and_field(key, value, message, level):
  entries = copy.deepcopy(LONGMEMEVAL)
  entries[0][key] = value
  with pytest.raises(ValueError) as info:
    L.episodes_from_entries(entries, level=level)
  assert str(info.value) == message
