"""Official metrics against hand-computed cases and a literal transcription of the upstream code."""

import math
import random

import numpy as np
import pytest

from engram_jax.metrics import official as O


def upstream_eval(rankings, correct_docs, corpus_ids, k):
  """A literal transcription of LongMemEval eval_utils.evaluate_retrieval (np.asfarray -> float64 array)."""

  def dcg(rel, k):
    rel = np.asarray(rel, dtype=np.float64)[:k]
    if rel.size:
      return rel[0] + np.sum(rel[1:] / np.log2(np.arange(2, rel.size + 1)))
    return 0.0

  def ndcg(rankings, correct_docs, corpus_ids, k):
    relevances = [1 if d in correct_docs else 0 for d in corpus_ids]
    ideal = dcg(sorted(relevances, reverse=True), k)
    actual = dcg([relevances[i] for i in rankings[:k]], k)
    return 0.0 if ideal == 0 else actual / ideal

  recalled = set(corpus_ids[i] for i in rankings[:k])
  return (
    float(any(d in recalled for d in correct_docs)),
    float(all(d in recalled for d in correct_docs)),
    ndcg(rankings, correct_docs, corpus_ids, k),
  )


def _upstream_flat_index(data, granularity, sess_id):
  """A literal transcription of LongMemEval run_retrieval.process_item_flat_index (timestamps left out)."""
  corpus = []
  if granularity == 'session':
    text = ' '.join([interact['content'] for interact in data if interact['role'] == 'user'])
    corpus.append(text)
    ids = [sess_id]
    if 'answer' in sess_id and all([not turn['has_answer'] for turn in [x for x in data if x['role'] == 'user']]):
      ids = [sess_id.replace('answer', 'noans')]
  elif granularity == 'turn':
    ids = []
    for i_turn, turn in enumerate(data):
      if turn['role'] == 'user':
        corpus.append(turn['content'])
        if 'answer' not in sess_id:
          ids.append(sess_id + '_' + str(i_turn + 1))
        else:
          assert 'has_answer' in turn
          assert turn['has_answer'] in [True, False]
          if turn['has_answer']:
            ids.append(sess_id + '_' + str(i_turn + 1))
          else:
            ids.append((sess_id + '_' + str(i_turn + 1)).replace('answer', 'noans'))
            assert 'answer' not in ids[-1]
  else:
    raise NotImplementedError
  return corpus, ids


def upstream_corpus(entry, granularity):
  """Upstream's per-question ``(corpus, corpus_ids, correct_docs)``: file order, no de-duplication, empty
  documents kept, ``correct_docs = list(set(doc_id for doc_id in corpus_ids if "answer" in doc_id))``."""
  corpus, corpus_ids = [], []
  for cur_sess_id, sess_entry in zip(entry['haystack_session_ids'], entry['haystack_sessions']):
    cur_items, cur_ids = _upstream_flat_index(sess_entry, granularity, cur_sess_id)
    corpus += cur_items
    corpus_ids += cur_ids
  correct_docs = list(set([doc_id for doc_id in corpus_ids if 'answer' in doc_id]))
  return corpus, corpus_ids, correct_docs


def _upstream_turn2session(rankings, correct_docs, corpus_ids, k):
  strip = lambda d: '_'.join(d.split('_')[:-1])  # noqa: E731
  correct_docs = list(set(strip(x) for x in correct_docs))
  corpus_ids = [strip(x) for x in corpus_ids]
  eff = k
  uniq = set(corpus_ids[i] for i in rankings[:eff])
  while eff <= len(corpus_ids) and len(uniq) < k:
    eff += 1
    uniq = set(corpus_ids[i] for i in rankings[:eff])
  return upstream_eval(rankings, correct_docs, corpus_ids, eff)


def test_dcg_any_does_not_discount_rank_two():
  assert O.dcg_any([1, 1, 1], k=3) == pytest.approx(1 + 1 + 1 / math.log2(3))
  assert O.dcg_any([0, 1], k=2) == pytest.approx(1.0)
  assert O.dcg_any([1, 1, 1], k=1) == pytest.approx(1.0)
  assert O.dcg_any([], k=5) == 0.0


def test_ndcg_any_three_items_by_hand():
  corpus = ['a', 'b', 'c']
  # Gold at rank 2: undiscounted, so a perfect score although standard NDCG would give 1/log2(3).
  assert O.ndcg_any([0, 1, 2], ['b'], corpus, k=3) == pytest.approx(1.0)
  assert O.ndcg_any([0, 1, 2], ['c'], corpus, k=3) == pytest.approx(1 / math.log2(3))
  # Two gold: DCG = 1 (rank 2) + 1/log2(3) (rank 3); ideal = 1 + 1.
  assert O.ndcg_any([0, 1, 2], ['b', 'c'], corpus, k=3) == pytest.approx((1 + 1 / math.log2(3)) / 2)
  assert O.ndcg_any([0, 1, 2], ['c'], corpus, k=2) == 0.0
  assert O.ndcg_any([0, 1, 2], ['zz'], corpus, k=3) == 0.0


def test_evaluate_retrieval_recall_any_all():
  corpus = ['a', 'b', 'c', 'd']
  s = O.evaluate_retrieval([3, 1, 0, 2], ['b', 'c'], corpus, k=2)
  assert (s.recall_any, s.recall_all) == (1.0, 0.0)
  s = O.evaluate_retrieval([3, 1, 0, 2], ['b', 'c'], corpus, k=4)
  assert (s.recall_any, s.recall_all) == (1.0, 1.0)


def test_recall_all_over_empty_gold_is_not_a_hit():
  s = O.evaluate_retrieval([0, 1], [], ['a', 'b'], k=2)
  assert s == (0.0, 0.0, 0.0)
  assert upstream_eval([0, 1], [], ['a', 'b'], 2)[1] == 1.0  # the upstream pitfall being guarded
  s = O.evaluate_retrieval_turn2session([0, 1], [], ['s1_1', 's2_1'], k=1)
  assert s.recall_all == 0.0


def test_turn2session_grows_k_until_k_distinct_sessions():
  corpus = ['s1_1', 's1_3', 's2_1', 'answer_a_2', 'noans_a_4', 's3_1']
  rankings = [0, 1, 2, 4, 3, 5]
  sessions = [O.turn_to_session_id(c) for c in corpus]
  assert sessions == ['s1', 's1', 's2', 'answer_a', 'noans_a', 's3']
  assert O.turn2session_k(rankings, sessions, k=1) == 1
  assert O.turn2session_k(rankings, sessions, k=2) == 3
  assert O.turn2session_k(rankings, sessions, k=3) == 4
  assert O.turn2session_k(rankings, sessions, k=4) == 5
  gold = ['answer_a_2']
  # k=3: the 'noans_a' turn of the evidence session is not a hit (upstream renames it).
  assert O.evaluate_retrieval_turn2session(rankings, gold, corpus, k=3).recall_any == 0.0
  s = O.evaluate_retrieval_turn2session(rankings, gold, corpus, k=4)
  assert s.recall_any == 1.0 and s.recall_all == 1.0
  assert s.ndcg_any == pytest.approx(1 / math.log2(5))  # the gold turn sits at 0-based position 4
  # Fewer sessions (5) than k: the cutoff runs one past the corpus, or stays at a k already beyond it, as upstream.
  assert O.turn2session_k(rankings, sessions, k=6) == len(corpus) + 1
  assert O.turn2session_k(rankings, sessions, k=10) == 10


def test_turn2session_ndcg_counts_duplicate_session_turns():
  corpus = ['answer_a_1', 'answer_a_3', 's1_1']
  s = O.evaluate_retrieval_turn2session([2, 0, 1], ['answer_a_1', 'answer_a_3'], corpus, k=2)
  # Session corpus ['answer_a', 'answer_a', 's1']: ranked rel [0, 1] -> DCG 1; ideal [1, 1] -> 2.
  assert s == pytest.approx((1.0, 1.0, 0.5))
  assert O.evaluate_retrieval_turn2session([2, 0, 1], ['answer_a_1'], corpus, k=1) == (0.0, 0.0, 0.0)


def test_turn2session_refuses_a_too_short_ranking():
  corpus = ['s1_1', 's1_2', 's1_3', 's2_1']
  with pytest.raises(ValueError, match='longer ranking'):
    O.evaluate_retrieval_turn2session([0, 1], ['s2_1'], corpus, k=2)
  # Long enough: fine, and equal to the full ranking's result.
  assert O.evaluate_retrieval_turn2session([0, 1, 2, 3], ['s2_1'], corpus, k=2) == O.evaluate_retrieval_turn2session(
    [0, 1, 2, 3], ['s2_1'], corpus, k=2
  )


def test_matches_literal_upstream_on_random_cases():
  rng = random.Random(0)
  for _ in range(300):
    n_sess = rng.randint(1, 6)
    corpus = []
    for s in range(n_sess):
      ev = rng.random() < 0.4
      for t in range(rng.randint(1, 4)):
        hit = ev and rng.random() < 0.5
        corpus.append(f'{"answer" if hit else ("noans" if ev else "sess")}_{s}_{2 * t + 1}')
    rankings = list(range(len(corpus)))
    rng.shuffle(rankings)
    gold = O.longmemeval_correct_docs(corpus)
    if not gold:
      continue
    for k in (1, 2, 3, 5, 10):
      assert tuple(O.evaluate_retrieval(rankings, gold, corpus, k=k)) == pytest.approx(
        upstream_eval(rankings, gold, corpus, k)
      )
      assert tuple(O.evaluate_retrieval_turn2session(rankings, gold, corpus, k=k)) == pytest.approx(
        _upstream_turn2session(rankings, gold, corpus, k)
      )


def test_correct_docs_and_skip_reason():
  corpus = ['answer_a_1', 'noans_a_3', 'sharegpt_x_1', 'answer_a_1']
  assert O.longmemeval_correct_docs(corpus) == ['answer_a_1']
  assert O.official_skip_reason('e47becba', corpus) is None
  assert O.official_skip_reason('e47becba_abs', corpus) == 'abstention'
  assert O.official_skip_reason('e47becba', ['noans_a', 'sharegpt_x']) == 'no_user_evidence'


def test_longmemeval_scores_layout():
  corpus = ['s1_1', 'answer_a_2', 's2_1']
  out = O.longmemeval_scores([1, 0, 2], corpus, level='turn', ks=(1, 2))
  assert out['turn'] == {
    'recall_any@1': 1.0,
    'recall_all@1': 1.0,
    'ndcg_any@1': 1.0,
    'recall_any@2': 1.0,
    'recall_all@2': 1.0,
    'ndcg_any@2': 1.0,
  }
  assert set(out['session']) == set(out['turn'])
  out = O.longmemeval_scores([0, 1], ['s1', 'answer_a'], level='session')
  assert out['turn'] == {} and out['session']['recall_any@1'] == 0.0 and out['session']['ndcg_any@50'] == 1.0
  with pytest.raises(ValueError):
    O.longmemeval_scores([0], ['a'], level='doc')


@pytest.mark.parametrize(
  'text, expected',
  [
    ('The  Eiffel-Tower!', 'eiffeltower'),
    ('An apple a day', 'apple day'),
    ('  Washington, D.C..', 'washington dc'),
    ('THEATRE of the Absurd', 'theatre of absurd'),
    ('pesäpallo', 'pesäpallo'),
    ('', ''),
  ],
)
def test_normalize_answer(text, expected):
  assert O.normalize_answer(text) == expected


def test_subem():
  assert O.subem("It's Belgium.", ['belgium']) == 1.0
  assert O.subem('It is the Netherlands', ['Belgium']) == 0.0
  assert O.subem('fairly oddparents, I think', ['The Fairly OddParents']) == 1.0
  assert O.subem('Paris', 'paris') == 1.0
  assert O.subem('Rome', [['Paris'], ['Rome', 'Roma']]) == 1.0
  assert O.subem('Belgian', ['Belgium']) == 0.0
  with pytest.raises(ValueError):
    O.subem('x', [])


def _up_parse_output(output_text, answer_prefix='Answer:'):
  """A literal transcription of MemoryAgentBench utils/eval_other_utils.py parse_output at commit
  455306dcabc3842526eb83cd4e225e5d486c5c5d (lines 144-169)."""
  import re

  extraction_patterns = [
    re.compile(f'(?:{answer_prefix})(.*)(?:\n|$)', flags=re.IGNORECASE),
    re.compile(r'(?:^)(.*)(?:\n|$)'),
  ]
  for pattern in extraction_patterns:
    match = pattern.search(output_text)
    if match:
      extracted_text = match[1].strip()
      clean_answer = re.sub(f'^{re.escape(answer_prefix)}', '', extracted_text, flags=re.IGNORECASE).strip()
      return clean_answer
  return None


def test_parse_output_matches_upstream_on_fuzzed_replies():
  rng = random.Random(0)
  pieces = ['Answer:', 'answer:', 'ANSWER: ', 'Paris', ' Rome', '\n', '\n\n', ' the ', 'Donald Trump', '.', ' ']
  for _ in range(2000):
    reply = ''.join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
    assert O.parse_output(reply) == _up_parse_output(reply), repr(reply)
  assert O.parse_output('Answer: Paris\nThe answer is Rome') == 'Paris'  # one line, as upstream (no DOTALL)
  assert O.parse_output('\nAnswer: Paris') == 'Paris'
  assert O.parse_output('Rome\nParis') == 'Rome'


def test_parse_output_and_official_subem():
  assert O.parse_output('Let me think.\nAnswer: Paris\n') == 'Paris'
  assert O.parse_output('answer: answer: Rome') == 'Rome'
  assert O.parse_output('  Rome ') == 'Rome'
  assert O.subem_official('Answer: Belgium', ['Belgium']) == 1.0
  assert O.subem_official('Answer: France', ['Belgium']) == 0.0


def test_answer_in_topk():
  texts = ['X is married to A.', 'X is married to Belgium Jones.', 'Y is a citizen of Belgium.']
  assert O.answer_in_topk(texts, ['Belgium'], k=2)
  assert not O.answer_in_topk(texts, ['Peru'], k=3)
  assert not O.answer_in_top1(texts, ['Belgium'])
  assert O.answer_in_top1(texts, ['a'])  # 'a' normalises to '' (an article): matches, as upstream
  assert O.answer_in_top1(texts, ['X is married'])


def test_newest_outranks_superseded():
  f = O.newest_outranks_superseded
  assert f(['1', '7', '3'], newest='7', superseded=()) is None
  assert f(['1', '7', '3'], newest='7', superseded=['3']) is True
  assert f(['3', '7'], newest='7', superseded=['3']) is False
  assert f(['1', '2'], newest='7', superseded=['3']) is False
  assert f(['7', '9'], newest='7', superseded=['3', '5']) is True
  assert f(['1', '3', '7'], newest='7', superseded=['3'], k=2) is False


def test_reader_protocol_and_offline_reader():
  reader = O.FirstContextReader()
  assert isinstance(reader, O.Reader)
  assert reader('Who?', ['Charles Darwin is married to Amala Paul.', 'x']) == 'Charles Darwin is married to Amala Paul.'
  assert reader('Who?', []) == ''
  assert O.subem(reader('Who is Darwin married to?', ['Charles Darwin is married to Amala Paul.']), ['Amala Paul'])


def test_turn_level_session_metrics_are_upstreams_turn2session():
  """The dataset metrics ``session_recall_any@k`` / ``session_ndcg_any@k`` of a turn-level episode equal the literal
  upstream transcription on random rankings (retrieved top turns), and a too-short ranking is refused."""
  from engram_jax.core.types import Episode, Item, Question
  from engram_jax.data import longmemeval as L

  ids = ['s1_1', 's1_3', 'answer_a_2', 'noans_a_4', 's2_1', 's2_3', 'answer_b_1', 's3_1', 's3_3', 's4_1']
  ep = Episode(
    id='q',
    items=tuple(Item(id=i, text=i, parent=O.turn_to_session_id(i), position=n) for n, i in enumerate(ids)),
    questions=(Question(id='q', text='x', gold=('answer_a_2', 'answer_b_1'), gold_parents=(), category='c'),),
  )
  correct = O.longmemeval_correct_docs(ids)
  rng = np.random.default_rng(0)
  for _ in range(30):
    ranking = rng.permutation(len(ids)).tolist()
    for k in (1, 2, 3, 5):
      want = _upstream_turn2session(ranking, correct, ids, k)
      assert L.METRICS['session_recall_any'](ep, ep.questions[0], ranking, k) == want[0]
      assert L.METRICS['session_ndcg_any'](ep, ep.questions[0], ranking, k) == pytest.approx(want[2])
  with pytest.raises(ValueError, match='raise eval.k'):
    L.METRICS['session_recall_any'](ep, ep.questions[0], [0, 1], 2)
