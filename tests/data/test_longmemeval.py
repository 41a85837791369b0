"""LongMemEval loader: small synthetic entries, malformed input, and the real S / oracle files when present."""

import collections
import copy
import gzip
import json
import random
import zlib

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from engram_jax.core import batch
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data import longmemeval as L
from engram_jax.data import splits
from engram_jax.data.io import resolve_data_root
from engram_jax.eval import evaluation, pipeline
from engram_jax.metrics import labels as metrics_lib
from engram_jax.metrics import official
from engram_jax.ops import bm25 as bm25_ops
from tests.metrics.test_official_metrics import upstream_corpus, upstream_eval


def _entry(**over):
  e = {
    'question_id': 'q1',
    'question_type': 'single-session-user',
    'question': 'What degree?',
    'question_date': '2023/05/30 (Tue) 23:40',
    'answer': 'Business Administration',
    'answer_session_ids': ['answer_aa'],
    'haystack_dates': ['2023/05/21 (Sun) 10:00', '2023/05/20 (Sat) 09:00', '2023/05/22 (Mon) 08:00'],
    'haystack_session_ids': ['answer_aa', 'sharegpt_x_0', 'f1'],
    'haystack_sessions': [
      [
        {'role': 'user', 'content': 'I graduated in BA', 'has_answer': True},
        {'role': 'assistant', 'content': 'Congrats', 'has_answer': False},
        {'role': 'user', 'content': 'thanks', 'has_answer': False},
      ],
      [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}, {'role': 'user', 'content': '  '}],
      [{'role': 'assistant', 'content': 'only me'}],
    ],
  }
  e.update(over)
  return e


def test_turn_level_ids_order_and_gold():
  report = LoadReport('t')
  ep = L.episode_from_entry(_entry(), level='turn', corpus='clean', report=report)
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
  ep = L.episode_from_entry(_entry(), level='turn', template='role', roles=('user', 'assistant'), corpus='official')
  ids = [it.id for it in ep.items]
  assert ids == [
    'sharegpt_x_0_1',
    'sharegpt_x_0_2',
    'sharegpt_x_0_3',
    'answer_aa_1',
    'noans_aa_2',
    'noans_aa_3',
    'f1_1',
  ]
  assert ep.items[3].text == 'user: I graduated in BA'


def test_session_level_text_ids_and_gold():
  report = LoadReport('t')
  ep = L.episode_from_entry(_entry(), level='session', corpus='clean', report=report)
  assert [it.id for it in ep.items] == ['sharegpt_x_0', 'answer_aa']  # 'f1' has no user text: dropped
  assert ep.items[0].text == 'hi   '  # official: ' '.join of the user contents, blanks included
  assert ep.items[1].text == 'I graduated in BA thanks'
  assert ep.questions[0].gold == ('answer_aa',)
  assert report.counts['empty_session_dropped'] == 1
  # An evidence session whose evidence is only on the assistant side gets the official 'noans' id; it is not
  # gold (official correct_docs), so a question whose only evidence session is such is excluded, at both levels.
  e = _entry()
  e['haystack_sessions'][0][0]['has_answer'] = False
  e['haystack_sessions'][0][1]['has_answer'] = True
  assert L.entry_skip_reason(e) == 'no_user_evidence'
  for level in ('session', 'turn'):
    report = LoadReport('t')
    assert L.episode_from_entry(e, level=level, report=report) is None
    assert report.counts['excluded_no_gold'] == 1
  assert report.counts['answer_session_not_gold_noans'] == 0  # turn level: counted at session level only
  report = LoadReport('t')
  L.episode_from_entry(e, level='session', report=report)
  assert report.counts['answer_session_not_gold_noans'] == 1


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
  ep = L.episode_from_entry(e, level='session', corpus='clean', report=report)
  assert [it.id for it in ep.items] == ['sharegpt_x_0', 'answer_aa']
  assert ep.items[0].time == '2023/05/19 (Fri) 09:00'  # the earliest copy is kept
  assert report.counts['duplicate_session_dropped'] == 1 and report.counts['unknown_answer_session_id'] == 1
  assert ep.questions[0].gold_parents == ('answer_aa',)


def _two_evidence_entry():
  """q1 with two evidence sessions: answer_aa (user-side evidence) and answer_bb (assistant-side only)."""
  e = _entry(answer_session_ids=['answer_aa', 'answer_bb'])
  e['haystack_session_ids'] = e['haystack_session_ids'] + ['answer_bb']
  e['haystack_dates'] = e['haystack_dates'] + ['2023/05/23 (Tue) 08:00']
  e['haystack_sessions'] = e['haystack_sessions'] + [
    [
      {'role': 'user', 'content': 'what about my degree?', 'has_answer': False},
      {'role': 'assistant', 'content': 'You said BA.', 'has_answer': True},
    ]
  ]
  return e


def test_session_gold_is_the_official_correct_docs_never_noans():
  report = LoadReport('t')
  ep = L.episode_from_entry(_two_evidence_entry(), level='session', report=report)
  ids = [it.id for it in ep.items]
  assert 'noans_bb' in ids and 'answer_aa' in ids
  (q,) = ep.questions
  assert q.gold == ('answer_aa',)  # answer_bb has no user-side evidence: official id noans_bb, not gold
  assert q.gold_parents == ('answer_aa', 'answer_bb')  # parent-level gold keeps every answer session
  assert list(q.gold) == official.longmemeval_correct_docs(ids)
  assert report.counts['answer_session_not_gold_noans'] == 1
  assert report.examples['answer_session_not_gold_noans'] == [('q1', 'answer_bb')]


def test_turn_gold_is_the_official_correct_docs():
  e = _two_evidence_entry()
  # has_answer on a turn of a session whose id lacks 'answer': upstream's correct_docs ignore it.
  e['haystack_sessions'][1][0]['has_answer'] = True
  report = LoadReport('t')
  ep = L.episode_from_entry(e, level='turn', report=report)
  ids = [it.id for it in ep.items]
  (q,) = ep.questions
  assert q.gold == ('answer_aa_1',)  # the has_answer user turn of an evidence session is gold
  assert 'noans_bb_1' in ids and 'sharegpt_x_0_1' in ids
  assert list(q.gold) == official.longmemeval_correct_docs(ids)
  assert report.counts['has_answer_turn_not_gold'] == 1


def test_official_corpus_keeps_empty_and_duplicate_sessions():
  e = _two_evidence_entry()
  e['haystack_session_ids'] = e['haystack_session_ids'] + ['sharegpt_x_0', 'f1']
  e['haystack_dates'] = e['haystack_dates'] + ['2023/05/19 (Fri) 09:00', '2023/05/24 (Wed) 09:00']
  e['haystack_sessions'] = e['haystack_sessions'] + [
    copy.deepcopy(e['haystack_sessions'][1]),
    copy.deepcopy(e['haystack_sessions'][2]),
  ]
  for level in ('session', 'turn'):
    report = LoadReport('t')
    ep = L.episode_from_entry(e, level=level, corpus='official', report=report)
    texts, up_ids, correct = upstream_corpus(e, level)
    ours = [it.id.split('#dup')[0] for it in ep.items]
    assert collections.Counter(ours) == collections.Counter(up_ids)  # the official corpus, as a multiset
    assert sorted(it.text for it in ep.items) == sorted(texts)
    assert sorted(ep.questions[0].gold) == sorted(correct)
    assert all('#dup' not in g for g in ep.questions[0].gold)
    assert report.counts['duplicate_session_kept'] == 2  # sharegpt_x_0 and f1, once each
    assert report.counts['duplicate_session_dropped'] == 0
  # Session level: the later copies (in write order) get '#dup<n>' ids and the plain parent; empty text kept.
  report = LoadReport('t')
  ep = L.episode_from_entry(e, level='session', report=report)  # 'official' is the default
  by_id = {it.id: it for it in ep.items}
  assert by_id['sharegpt_x_0'].time == '2023/05/19 (Fri) 09:00'
  assert by_id['sharegpt_x_0#dup1'].parent == 'sharegpt_x_0' and by_id['sharegpt_x_0#dup1'].text == 'hi   '
  assert by_id['f1'].text == '' and by_id['f1#dup1'].text == ''
  assert report.counts['empty_session_kept'] == 2 and report.counts['empty_session_dropped'] == 0
  # Turn level: the blank user turn is an (empty) document too.
  report = LoadReport('t')
  ep = L.episode_from_entry(e, level='turn', report=report)
  assert {'sharegpt_x_0_3', 'sharegpt_x_0_3#dup1'} <= {it.id for it in ep.items}
  assert report.counts['empty_turn_kept'] == 2 and report.counts['empty_turn_dropped'] == 0
  # The clean corpus drops both, counted as before.
  report = LoadReport('t')
  ep = L.episode_from_entry(e, level='session', corpus='clean', report=report)
  assert [it.id for it in ep.items] == ['sharegpt_x_0', 'answer_aa', 'noans_bb']
  assert report.counts['duplicate_session_dropped'] == 2 and report.counts['empty_session_dropped'] == 1
  assert report.counts['duplicate_session_kept'] == 0
  with pytest.raises(ValueError, match='corpus'):
    L.episode_from_entry(e, level='session', corpus='raw')


def test_official_corpus_refuses_a_duplicated_gold_session():
  e = _entry()
  e['haystack_session_ids'] = e['haystack_session_ids'] + ['answer_aa']
  e['haystack_dates'] = e['haystack_dates'] + ['2023/05/25 (Thu) 08:00']
  e['haystack_sessions'] = e['haystack_sessions'] + [copy.deepcopy(e['haystack_sessions'][0])]
  with pytest.raises(ValueError, match='q1: evidence session answer_aa is repeated'):
    L.episode_from_entry(e, level='session')
  # A repeated evidence session without user-side evidence is never gold: kept.
  e['haystack_sessions'][0][0]['has_answer'] = False
  e['haystack_sessions'][3][0]['has_answer'] = False
  report = LoadReport('t')
  assert L.episode_from_entry(e, level='session', report=report) is None
  assert report.counts['duplicate_session_kept'] == 1


# ------------------------------------------------------------------------------------------- flat BM25


_FLAT_TEXT = st.text(alphabet='abAB ', max_size=14)


def _bm25_episode(docs, query):
  items = tuple(Item(id=f'i{j}', text=t, parent='p', position=j) for j, t in enumerate(docs))
  return Episode(
    id='e', items=items, questions=(Question(id='q', text=query, gold=('i0',), gold_parents=('p',), category='x'),)
  )


@pytest.mark.slow
@given(docs=st.lists(_FLAT_TEXT, min_size=1, max_size=10), query=_FLAT_TEXT)
def test_flat_bm25_equals_official_rank_bm25(docs, query):
  """Upstream flat-bm25: ``BM25Okapi([d.split(' ') for d in corpus]).get_scores(q.split(' '))`` (case kept,
  '' tokens from double/leading/trailing spaces kept, an empty document is [''])."""
  expected = BM25Okapi([d.split(' ') for d in docs]).get_scores(query.split(' '))
  toks = [bm25_ops.flat_tokenize(d) for d in docs]
  assert toks == [d.split(' ') for d in docs]
  vocab = bm25_ops.build_vocab(toks)
  q_tf = bm25_ops.term_counts([bm25_ops.flat_tokenize(query)], vocab, n_cols=256).astype(np.float64)
  d_tf = bm25_ops.term_counts(toks, vocab, n_rows=16, n_cols=256).astype(np.float64)  # fixed shapes: one compile
  got = bm25_ops.bm25_scores(q_tf, d_tf, where=np.arange(16) < len(docs))
  np.testing.assert_allclose(np.asarray(got)[0, : len(docs)], expected, rtol=1e-9, atol=1e-12)
  ep = _bm25_episode(docs, query)
  emb = np.ones((len(docs) + 1, 4), np.float32) / 2
  arr = batch.episode_arrays(ep, emb[:-1], emb[-1:], tokenizers=('words', 'flat'))
  flat = np.asarray(bm25_ops.bm25_leg(arr, jax.random.key(0), tokenizer='flat'))[0, : len(docs)]
  np.testing.assert_allclose(flat, expected, rtol=1e-5, atol=1e-5)
  # The default ('words') leg is unchanged by the extra lexicon, and finite (0) on empty documents.
  words = np.asarray(bm25_ops.bm25_leg(arr, jax.random.key(0)))[0, : len(docs)]
  base = batch.episode_arrays(ep, emb[:-1], emb[-1:])
  np.testing.assert_array_equal(words, np.asarray(bm25_ops.bm25_leg(base, jax.random.key(0)))[0, : len(docs)])
  assert np.all(np.isfinite(words)) and np.all(words[[not bm25_ops.tokenize(d) for d in docs]] == 0)


def test_flat_bm25_leg_needs_flat_arrays_and_evaluate_builds_them():
  docs = ['paris trip', 'Paris', '', 'budget']
  ep = _bm25_episode(docs, 'Paris trip')
  emb = np.ones((len(docs) + 1, 4), np.float32) / 2
  arr = batch.episode_arrays(ep, emb[:-1], emb[-1:])
  with pytest.raises(ValueError, match="tokenizer 'flat'.*tokenizers"):
    bm25_ops.bm25_leg(arr, jax.random.key(0), tokenizer='flat')
  with pytest.raises(ValueError, match='Unknown tokenizer'):
    batch.episode_arrays(ep, emb[:-1], emb[-1:], tokenizers=('words', 'nltk'))
  pipes = {
    'flat_bm25': pipeline.make_pipeline(legs={'flat_bm25': {'op': 'bm25', 'tokenizer': 'flat'}}),
    'bm25': pipeline.make_pipeline(legs={'bm25': {'op': 'bm25'}}),
  }
  res = evaluation.evaluate([ep], [(emb[:-1], emb[-1:])], pipes, k=4, metrics=['recall_any@1'], seed=0, progress=False)
  expected = BM25Okapi([d.split(' ') for d in docs]).get_scores('Paris trip'.split(' '))
  assert res.retrieved['flat_bm25'][0][0] == f'i{int(np.argmax(expected))}' == 'i1'  # case-sensitive: 'Paris'
  assert res.retrieved['bm25'][0][0] == 'i0'  # lower-cased words: the doc with both words


# ------------------------------------------------------------- per-question equality with the official eval


def _upstream_index(item_ids, up_ids):
  """Our item row -> upstream corpus index: the n-th copy of an official id (``#dup`` suffix stripped) is the
  n-th occurrence of that id in upstream's corpus. Asserts the map is a bijection (same corpus multiset)."""
  where = collections.defaultdict(list)
  for j, cid in enumerate(up_ids):
    where[cid].append(j)
  seen = collections.Counter()
  out = []
  for iid in item_ids:
    base = iid.split('#dup')[0]
    out.append(where[base][seen[base]])
    seen[base] += 1
  assert sorted(out) == list(range(len(up_ids)))
  return out


def _random_ranking(labels, seed):
  """A seeded ranking, sometimes cosine-like (gold pushed up by a random margin), else uniform."""
  rng = np.random.default_rng(seed)
  scores = rng.random(labels.shape[0]) + labels * rng.choice([0.0, 0.3, 0.8])
  return np.argsort(-scores, kind='stable')


WIDTH = 128  # rankings and labels are padded to one width (-1 / False), so the metrics compile once per k


def _upstream_case(entry, ep, level, labels, ranking):
  """One question as ``(topk [WIDTH], labels [WIDTH], {k: (recall_any, ndcg_any)} from the literal upstream
  eval on upstream's own corpus, with our ranking mapped onto it)``."""
  texts, up_ids, correct = upstream_corpus(entry, level)
  to_up = _upstream_index([it.id for it in ep.items], up_ids)
  assert [it.text for it in ep.items] == [texts[j] for j in to_up]
  up_ranking = [to_up[i] for i in ranking]
  expected = {}
  for k in official.LONGMEMEVAL_KS:
    up_any, _, up_ndcg = upstream_eval(up_ranking, correct, up_ids, k)
    expected[k] = (up_any, up_ndcg)
  topk = np.full(WIDTH, -1)
  topk[: len(ranking)] = ranking
  padded = np.zeros(WIDTH, bool)
  padded[: ep.n_items] = np.asarray(labels)[: ep.n_items]
  return topk, padded, expected


def _assert_cases_match(cases):
  """engram_jax.metrics.labels (recall_any@k, ndcg_any@k over the labels, as evaluation.evaluate scores) == upstream."""
  topk = np.stack([c[0] for c in cases])
  labels = np.stack([c[1] for c in cases])
  for k in official.LONGMEMEVAL_KS:
    got_any = np.asarray(metrics_lib.METRICS['recall_any'](topk, labels, k=k))
    got_ndcg = np.asarray(metrics_lib.METRICS['ndcg_any'](topk, labels, k=k))
    want = np.array([c[2][k] for c in cases])
    bad = np.flatnonzero((got_any != want[:, 0]) | ~np.isclose(got_ndcg, want[:, 1], rtol=1e-6, atol=1e-9))
    assert bad.size == 0, f'k={k}: {bad.size} questions differ, first rows {bad[:5].tolist()}'


def _synthetic_entry(rng, qid):
  """A random raw entry shaped like LongMemEval_S: evidence sessions with user- or assistant-side evidence (or
  none), fillers (one repeated), sessions without user turns, blank user turns, dates out of order."""
  sids, dates, sessions, answers = [], [], [], []
  words = ['degree', 'Paris', 'budget', 'dog', '', 'the']
  for s in range(rng.randint(3, 8)):
    evidence = rng.random() < 0.4
    sid = f'answer_{qid}_{s}' if evidence else f'sharegpt_{qid}_{s}'
    turns = []
    for t in range(rng.randint(0, 5)):
      turn = {'role': rng.choice(['user', 'assistant']), 'content': ' '.join(rng.choices(words, k=rng.randint(0, 4)))}
      if evidence:
        turn['has_answer'] = rng.random() < 0.3
      turns.append(turn)
    sids.append(sid)
    dates.append(f'2023/05/{rng.randint(10, 28):02d} (Sun) {rng.randint(0, 23):02d}:00')
    sessions.append(turns)
    if evidence:
      answers.append(sid)
  filler = [i for i, sid in enumerate(sids) if 'answer' not in sid]
  if filler:
    i = rng.choice(filler)
    sids.append(sids[i])
    dates.append('2023/05/29 (Mon) 10:00')
    sessions.append(copy.deepcopy(sessions[i]))
  return {
    'question_id': qid,
    'question_type': 'multi-session',
    'question': 'Where?',
    'answer': 'x',
    'question_date': '2023/05/30 (Tue) 23:40',
    'answer_session_ids': answers,
    'haystack_dates': dates,
    'haystack_session_ids': sids,
    'haystack_sessions': sessions,
  }


@pytest.mark.parametrize('level', ['session', 'turn'])
def test_metrics_equal_official_eval_per_question_synthetic(level):
  rng = random.Random(7)
  n_scored = 0
  cases = []
  for e_i in range(150):
    entry = _synthetic_entry(rng, f'q{e_i}')
    ep = L.episode_from_entry(entry, level=level)
    _, up_ids, correct = upstream_corpus(entry, level)
    if ep is None:
      assert not correct  # excluded exactly when upstream has no correct_docs
      continue
    n_scored += 1
    emb = np.ones((ep.n_items + 1, 4), np.float32) / 2
    labels = np.asarray(batch.episode_arrays(ep, emb[:-1], emb[-1:]).labels)[0, : ep.n_items]  # evaluate's path
    for r in range(3):
      cases.append(_upstream_case(entry, ep, level, labels, _random_ranking(labels, seed=1000 * e_i + r)))
  assert n_scored > 40
  _assert_cases_match(cases)


@pytest.mark.parametrize(
  'mutate, match',
  [
    (lambda e: e.pop('answer_session_ids'), r'q1: missing fields \[.answer_session_ids.\]'),
    (lambda e: e['haystack_dates'].pop(), 'q1: haystack_session_ids/dates/sessions have lengths'),
    (lambda e: e['haystack_dates'].__setitem__(0, 'May 21'), 'q1: unparsable haystack date'),
    (lambda e: e['haystack_sessions'][0][0].pop('content'), 'q1: session answer_aa turn 0 lacks role/content'),
    (lambda e: e['haystack_sessions'][0][0].__setitem__('has_answer', 'yes'), 'q1: .* is not a bool'),
    (
      lambda e: e.__setitem__('question_type', '  '),
      '^LongMemEval question q1: question_type is blank, expected a non-blank string$',
    ),
    (lambda e: e.__setitem__('question_date', ''), '^LongMemEval question q1: unparsable question_date'),
    (
      lambda e: e.__setitem__('answer', None),
      '^LongMemEval question q1: answer is NoneType, expected a string or an integer$',
    ),
    (lambda e: e.__setitem__('answer', ['BA']), 'q1: answer is list, expected a string or an integer$'),
    (
      lambda e: e['haystack_session_ids'].__setitem__(2, ' '),
      '^LongMemEval question q1: haystack_session_ids entry 2 is blank, expected a non-blank string$',
    ),
    (
      lambda e: e['haystack_dates'].__setitem__(1, None),
      '^LongMemEval question q1: haystack_dates entry 1 is NoneType, expected a string$',
    ),
    (
      lambda e: e['haystack_sessions'].__setitem__(1, {}),
      '^LongMemEval question q1: session sharegpt_x_0 is dict, expected a list$',
    ),
    (
      lambda e: e.__setitem__('question_id', 7),
      '^LongMemEval entry 0: question_id is int, expected a non-blank string$',
    ),
  ],
)
def test_malformed_entries_name_the_question(mutate, match):
  e = _entry()
  mutate(e)
  with pytest.raises(ValueError, match=match):
    L.episode_from_entry(e, level='turn')
  with pytest.raises(ValueError, match=match):  # the raw-entry skip rule checks the entry the same way
    L.entry_skip_reason(e)


def test_malformed_entry_list_names_the_entry():
  with pytest.raises(ValueError, match='^LongMemEval entries are NoneType, expected a list of entries$'):
    L.episodes_from_entries(None)
  with pytest.raises(ValueError, match='^LongMemEval entries are dict, expected a list of entries$'):
    L.episodes_from_entries({'question_id': 'q1'})
  with pytest.raises(ValueError, match=r'^LongMemEval entry 1: expected an object, got str$'):
    L.episodes_from_entries([_entry(), 'q2'])
  with pytest.raises(ValueError, match=r'^LongMemEval question <entry 1>: missing fields \[.question_id.\]$'):
    L.episodes_from_entries([_entry(), {k: v for k, v in _entry().items() if k != 'question_id'}])
  with pytest.raises(ValueError, match='^LongMemEval entry 1: question_id is NoneType, expected a non-blank string$'):
    L.episodes_from_entries([_entry(), _entry(question_id=None)])


def test_repeated_answer_session_id_is_counted_once():
  report = LoadReport('t')
  ep = L.episode_from_entry(_entry(answer_session_ids=['answer_aa', 'answer_aa']), level='session', report=report)
  assert ep.questions[0].gold_parents == ('answer_aa',)
  assert report.counts['duplicate_answer_session_id'] == 1


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


@pytest.mark.parametrize('name', ['longmemeval_s_cleaned.json', 'longmemeval_s_cleaned.json.gz', L.FILES['s']])
def test_the_official_file_name_gzip_and_our_copy_are_found(tmp_path, name):
  """The probe: a data root holding upstream's longmemeval_s_cleaned.json was refused (our copy's name was
  hard-coded); upstream's name (plain or gzipped) and our copy's are read, the official name first."""
  folder = tmp_path / 'longmemeval'
  folder.mkdir()
  text = json.dumps([_entry(), _entry(question_id='q2')])
  if name.endswith('.gz'):
    with gzip.open(folder / name, 'wt', encoding='utf-8') as f:
      f.write(text)
  else:
    (folder / name).write_text(text)
  assert L.find_file(tmp_path, 's') == folder / name
  episodes, _ = L.load_longmemeval(tmp_path, split='s', level='session')
  assert [e.id for e in episodes] == ['q1', 'q2']
  (folder / 'mine.json').write_text(json.dumps([_entry(question_id='q3')]))
  assert [e.id for e in L.load_longmemeval(tmp_path, split='s', level='session', file='mine.json')[0]] == ['q3']


def test_no_file_names_every_name_looked_for(tmp_path):
  (tmp_path / 'longmemeval').mkdir()
  with pytest.raises(
    FileNotFoundError, match=r'looked for longmemeval_s_cleaned.json, longmemeval_s_cleaned.json.gz, '
  ):
    L.load_longmemeval(tmp_path, split='s')


# ---------------------------------------------------------------------------------------------- real data


def _real_root():
  try:
    root = resolve_data_root(None)
  except FileNotFoundError:
    return None
  return root if (root / 'longmemeval' / L.FILES['s']).is_file() else None


REAL = _real_root()
needs_data = pytest.mark.skipif(
  REAL is None, reason='LongMemEval data not found under the data root (set ENGRAM_DATA_ROOT); real-data checks skipped'
)


@pytest.fixture(scope='module')
def s_entries():
  return L.read_longmemeval(REAL, split='s')


@pytest.mark.slow
@needs_data
def test_real_s_both_levels(s_entries):
  assert len(s_entries) == 498
  assert sum(len(s) for e in s_entries for s in e['haystack_sessions']) == 245625
  turn_eps, turn_rep = L.episodes_from_entries(s_entries, level='turn', corpus='clean')
  sess_eps, sess_rep = L.episodes_from_entries(s_entries, level='session', corpus='clean')
  for rep in (turn_rep, sess_rep):
    assert rep.counts['haystack_out_of_order'] == 210
    assert rep.counts['duplicate_session_dropped'] == 13
    assert rep.counts['answer_int_stringified'] == 32
  # Gold = the official correct_docs at both levels: the 71 questions without user-side evidence have none.
  assert len(turn_eps) == 427 and turn_rep.counts['excluded_no_gold'] == 71
  assert len(sess_eps) == 427 and sess_rep.counts['excluded_no_gold'] == 71
  assert turn_rep.counts['empty_turn_dropped'] == 9
  assert sum(e.n_items for e in turn_eps) == turn_rep.counts['items'] == 104154
  assert sess_rep.counts['abstention_kept'] == 9
  assert sess_rep.counts['answer_session_not_gold_noans'] == 144  # answer sessions without user-side evidence
  by_id = {e['question_id']: e for e in s_entries}
  reasons = collections.Counter()
  for ep in sess_eps:
    q = ep.questions[0]
    ids = [it.id for it in ep.items]
    reason = official.official_skip_reason(q.id, ids)
    assert reason == L.entry_skip_reason(by_id[q.id])
    reasons[reason] += 1
    assert set(q.gold_parents) == set(by_id[q.id]['answer_session_ids'])
    assert sorted(q.gold) == official.longmemeval_correct_docs(ids)
    times = [L.parse_haystack_date(it.time) for it in ep.items]
    assert times == sorted(times)
  assert reasons == {None: 418, 'abstention': 9}
  for ep in turn_eps:
    ids = [it.id for it in ep.items]
    assert official.longmemeval_correct_docs(ids) == sorted(ep.questions[0].gold)
  # An oracle ranking (gold first) scores 1 on the official session metrics.
  ep = sess_eps[0]
  gold = set(official.longmemeval_correct_docs([it.id for it in ep.items]))
  ranking = sorted(range(ep.n_items), key=lambda i: ep.items[i].id not in gold)
  scores = official.longmemeval_scores(ranking, [it.id for it in ep.items], level='session')
  assert scores['session']['recall_all@10'] == 1.0 and scores['session']['ndcg_any@10'] == 1.0


@pytest.mark.slow
@needs_data
def test_real_s_official_corpus_counts_and_skips(s_entries):
  eps, rep = L.episodes_from_entries(s_entries, level='session')  # corpus='official' by default
  assert rep.counts['duplicate_session_kept'] == 13 and rep.counts['duplicate_session_dropped'] == 0
  assert rep.counts['empty_session_kept'] == 71 and rep.counts['empty_session_dropped'] == 0
  assert rep.counts['answer_session_not_gold_noans'] == 144 and rep.counts['excluded_no_gold'] == 71
  assert rep.counts['items'] == 20313  # clean: 20241; the 427 kept haystacks hold 60 empty and 12 repeated sessions
  assert sum(e.n_items for e in eps) == rep.counts['items']
  # Every kept haystack is upstream's whole session corpus (23744 slots over all 498 questions).
  assert rep.counts['turns_read'] == 245625
  # The official skip rules still leave 418 scored questions of 498 (part=all).
  scored, part_rep = splits.load_part(None, load=lambda root: (eps, rep), part='all', official_skips=True)
  assert sum(len(e.questions) for e in scored) == part_rep.counts['questions_in_all'] == 418
  assert len(eps) + rep.counts['excluded_no_gold'] == 498


@pytest.mark.slow
@needs_data
def test_real_s_metrics_equal_official_eval_per_question(s_entries):
  """Session level, every question the official skip rules score: engram_jax's recall_any@k / ndcg_any@k over
  the episode's gold labels equal upstream eval_utils on upstream's own corpus ids, for seeded rankings.

  Labels are built as :func:`engram_jax.core.batch.episode_arrays` builds them (one row per question, True at the
  gold items); running that function itself would spend most of the time tokenising for BM25."""
  by_id = {e['question_id']: e for e in s_entries}
  eps, rep = L.episodes_from_entries(s_entries, level='session')
  scored, _ = splits.load_part(None, load=lambda root: (eps, rep), part='all', official_skips=True)
  assert sum(len(e.questions) for e in scored) == 418
  cases = []
  for ep in scored:
    (q,) = ep.questions
    gold = set(q.gold)
    labels = np.array([it.id in gold for it in ep.items])
    ranking = _random_ranking(labels, seed=zlib.crc32(q.id.encode()))
    cases.append(_upstream_case(by_id[q.id], ep, 'session', labels, ranking))
  _assert_cases_match(cases)


@needs_data
def test_real_oracle():
  episodes, report = L.load_longmemeval(REAL, split='oracle', level='session')
  assert report.counts['haystack_out_of_order'] == 34
  # 72 questions have no user-side evidence, hence no official gold: excluded (their sessions are not counted).
  assert len(episodes) == 428 and report.counts['excluded_no_gold'] == 72
  assert sum(e.n_items for e in episodes) == report.counts['items'] == 857
