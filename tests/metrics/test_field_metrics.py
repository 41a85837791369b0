"""The field's headline protocol (``field_session_recall_any@k``, docs/peers.md) against an independent plain-Python
transcription of the packages' scripts on hand-made cases, its registration in both dataset modules, and the
LongMemEval loader's ``gold='answer_sessions'`` (every question kept, gold = ``answer_session_ids``)."""

import random

import numpy as np
import pytest

from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, Item, Question
from engram_jax.data import locomo, longmemeval
from engram_jax.eval import evaluation
from engram_jax.metrics import boundary


def reference_session_recall_any(ranked_ids, session_of, gold_sessions, k):
  """As the packages' scripts score it, written independently: fold the ranked ids to their sessions (first
  occurrence wins), then 1 when any gold session is among the first k sessions, else 0."""
  order = []
  for rid in ranked_ids:
    sid = session_of[rid]
    if sid not in order:
      order.append(sid)
  hit = False
  for sid in order[:k]:
    if sid in gold_sessions:
      hit = True
  return 1.0 if hit else 0.0


def _episode(sessions, questions):
  """``sessions``: [(session id, n turns)] in write order; items ``<session>:<t>``."""
  items = []
  for sid, n in sessions:
    for t in range(n):
      items.append(Item(id=f'{sid}:{t}', text=f'turn {t} of {sid}', parent=sid, position=len(items)))
  return Episode(id='e', items=tuple(items), questions=tuple(questions))


def _score(ep, q, ranked_ids, k):
  index = ep.index_of()
  return boundary.field_session_recall_any_at(ep, q, [index[i] for i in ranked_ids], k)


def test_by_hand():
  ep = _episode([('S1', 3), ('S2', 2), ('S3', 2), ('S4', 1)], [Question('q', '?', ('S3:1',), ('S3',), 1)])
  q = ep.questions[0]
  # three turns of S1 first: collapsed, S3 is the second session
  assert _score(ep, q, ['S1:0', 'S1:2', 'S1:1', 'S3:0', 'S2:0'], 2) == 1.0
  assert _score(ep, q, ['S1:0', 'S1:2', 'S1:1', 'S3:0', 'S2:0'], 1) == 0.0
  # a turn-level cut at 2 would miss; the session cut counts sessions, not turns
  assert _score(ep, q, ['S1:0', 'S2:0', 'S2:1', 'S1:1', 'S3:0', 'S4:0'], 3) == 1.0
  assert _score(ep, q, ['S1:0', 'S2:0', 'S2:1', 'S1:1', 'S3:0', 'S4:0'], 2) == 0.0
  # any gold session is enough (several gold sessions: recall_any, not the fraction)
  q2 = Question('q2', '?', ('S2:0', 'S4:0'), ('S2', 'S4'), 1)
  assert _score(ep, q2, ['S4:0', 'S1:0', 'S3:0'], 1) == 1.0
  # no gold_parents given: the gold items' parents
  q3 = Question('q3', '?', ('S4:0',), (), 1)
  assert _score(ep, q3, ['S1:0', 'S4:0', 'S2:0'], 2) == 1.0
  # padding (-1) is skipped
  index = ep.index_of()
  ranked = [index['S1:0'], -1, index['S3:1'], -1]
  assert boundary.field_session_recall_any_at(ep, q, ranked, 2) == 1.0
  assert boundary.parent_ranking(ep, ranked) == ['S1', 'S3']


def test_short_ranking_is_refused_unless_it_covers_the_episode():
  ep = _episode([('S1', 3), ('S2', 1), ('S3', 1)], [Question('q', '?', ('S3:0',), ('S3',), 1)])
  q = ep.questions[0]
  with pytest.raises(EngramError, match='raise eval.k'):
    _score(ep, q, ['S1:0', 'S1:1', 'S2:0'], 3)  # 3 turns, 2 sessions: the third session was never ranked
  # the whole episode ranked: fewer sessions than k is all there is
  assert _score(ep, q, ['S1:0', 'S1:1', 'S1:2', 'S2:0', 'S3:0'], 5) == 1.0
  with pytest.raises(EngramError):
    boundary.field_session_recall_any_at(ep, q, [0, 1, -1, -1, -1], 2)


def test_against_reference_on_random_cases():
  rng = random.Random(20261008)
  for case in range(200):
    sessions = [(f'S{s}', rng.randint(1, 4)) for s in range(rng.randint(1, 7))]
    ids = [f'{sid}:{t}' for sid, n in sessions for t in range(n)]
    session_of = {i: i.split(':')[0] for i in ids}
    gold_sessions = set(rng.sample([s for s, _ in sessions], rng.randint(1, len(sessions))))
    gold = tuple(i for i in ids if session_of[i] in gold_sessions)[:1]
    q = Question(f'q{case}', '?', gold, tuple(sorted(gold_sessions)), 1)
    ep = _episode(sessions, [q])
    ranked = rng.sample(ids, len(ids))  # the whole episode ranked: never short
    for k in range(1, len(sessions) + 2):
      want = reference_session_recall_any(ranked, session_of, gold_sessions, k)
      assert _score(ep, q, ranked, k) == want, (case, k)
    cut = rng.randint(1, len(ids))  # a prefix that reaches k sessions
    n_sessions = len(dict.fromkeys(session_of[i] for i in ranked[:cut]))
    for k in range(1, n_sessions + 1):
      assert _score(ep, q, ranked[:cut], k) == reference_session_recall_any(ranked[:cut], session_of, gold_sessions, k)


def test_registered_and_in_evaluate():
  assert longmemeval.METRICS['field_session_recall_any'] is boundary.field_session_recall_any_at
  assert locomo.METRICS['field_session_recall_any'] is boundary.field_session_recall_any_at
  from engram_jax.data import embed
  from engram_jax.eval import pipeline

  ep = _episode(
    [('S1', 3), ('S2', 2), ('S3', 3)],
    [Question('q0', 'turn 2 of S3', ('S3:2',), ('S3',), 1), Question('q1', 'turn 0 of S1', ('S2:1',), ('S2',), 2)],
  )
  embs = evaluation.embed_episodes([ep], embed.hashing_encoder(16))
  pipes = {'bm25': pipeline.make_pipeline(legs={'bm25': {'op': 'bm25'}}, name='bm25')}
  res = evaluation.evaluate(
    [ep],
    embs,
    pipes,
    k=8,
    metrics=['field_session_recall_any@1', 'field_session_recall_any@2', 'hit@2'],
    seed=0,
    progress=False,
    episode_metrics=locomo.METRICS,
  )
  session_of = {it.id: it.parent for it in ep.items}
  for i, q in enumerate(ep.questions):
    for k in (1, 2):
      want = reference_session_recall_any(res.retrieved['bm25'][i], session_of, set(q.gold_parents), k)
      assert res.scores['bm25'][f'field_session_recall_any@{k}'][i] == want
  assert np.all(res.scores['bm25']['field_session_recall_any@2'] >= res.scores['bm25']['hit@2'])


def _entry(qid, sessions, answer_sessions, qtype='single-session-user'):
  """A raw LongMemEval entry: ``sessions`` = [(session id, [(role, content, has_answer)])]."""
  return {
    'question_id': qid,
    'question_type': qtype,
    'question': f'question {qid}?',
    'answer': 'x',
    'question_date': '2023/05/30 (Tue) 23:40',
    'haystack_dates': [f'2023/05/{10 + i:02d} (Wed) 10:00' for i in range(len(sessions))],
    'haystack_session_ids': [sid for sid, _ in sessions],
    'haystack_sessions': [
      [{'role': r, 'content': c, **({'has_answer': h} if h is not None else {})} for r, c, h in turns]
      for _, turns in sessions
    ],
    'answer_session_ids': answer_sessions,
  }


def test_longmemeval_answer_sessions_gold():
  filler = ('sharegpt_1', [('user', 'hello there', None), ('assistant', 'hi', None)])
  entries = [
    # user-side evidence: gold under both definitions
    _entry(
      'q_user',
      [filler, ('answer_a1', [('user', 'I adopted a dog', True), ('assistant', 'nice', False)])],
      ['answer_a1'],
    ),
    # the answer on the assistant side only: the official definition has no gold (excluded), the field keeps it
    _entry(
      'q_asst',
      [filler, ('answer_b1', [('user', 'any tips?', False), ('assistant', 'try yoga', True)])],
      ['answer_b1'],
      qtype='single-session-assistant',
    ),
    # an abstention question: kept by both loaders (the official skip is applied at the metric step)
    _entry('q_abs', [filler, ('answer_c1', [('user', 'I like tea', True)])], ['answer_c1']),
  ]
  entries[2]['question_id'] = 'q1_abs'
  official, rep_o = longmemeval.episodes_from_entries(entries, level='session')
  assert [e.id for e in official] == ['q_user', 'q1_abs']
  assert rep_o.counts['excluded_no_gold'] == 1
  field, rep_f = longmemeval.episodes_from_entries(entries, level='session', gold='answer_sessions')
  assert [e.id for e in field] == ['q_user', 'q_asst', 'q1_abs']
  assert rep_f.counts['kept_without_official_gold'] == 1 and rep_f.counts['excluded_no_gold'] == 0
  asst = field[1].questions[0]
  assert asst.gold == ('noans_b1',) and asst.gold_parents == ('answer_b1',)  # the session's official (noans) id
  assert field[0].questions[0].gold == official[0].questions[0].gold == ('answer_a1',)
  turns, _ = longmemeval.episodes_from_entries(entries, level='turn', gold='answer_sessions')
  assert [e.id for e in turns] == ['q_user', 'q_asst', 'q1_abs']
  assert turns[1].questions[0].gold == ('noans_b1_1',)  # the answer session's user turn(s)
  with pytest.raises(EngramError, match='gold must be one of'):
    longmemeval.episodes_from_entries(entries, gold='sessions')
