"""Tier 1: official answer prompts/metrics (checked against a literal transcription of upstream), the answer cache
(keys, resume, byte-identical reruns), the harness with a deterministic fake reader (equal k, oracle/no-context,
paired tests), the LoCoMo answer pilot, and one slow test with the real SmolLM2 reader."""

import json
import re
import string
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_jax.answer import cache as answer_cache
from engram_jax.answer import official_qa, tier1
from engram_jax.answer.reader import FakeReader
from engram_jax.core.types import Episode, Item, Question

# ----------------------------------------------------------- literal transcription of snap-research/locomo
# task_eval/evaluation.py (normalize_answer, f1_score, f1, the per-category branch of eval_question_answering) and
# task_eval/gpt_utils.py (get_cat_5_answer), as upstream writes them (regex module -> re; same patterns).


def _up_normalize_answer(s):
  s = s.replace(',', '')

  def remove_articles(text):
    return re.sub(r'\b(a|an|the|and)\b', ' ', text)

  def white_space_fix(text):
    return ' '.join(text.split())

  def remove_punc(text):
    exclude = set(string.punctuation)
    return ''.join(ch for ch in text if ch not in exclude)

  def lower(text):
    return text.lower()

  return white_space_fix(remove_articles(remove_punc(lower(s))))


def _up_f1_score(prediction, ground_truth):
  from nltk.stem import PorterStemmer

  ps = PorterStemmer()
  prediction_tokens = [ps.stem(w) for w in _up_normalize_answer(prediction).split()]
  ground_truth_tokens = [ps.stem(w) for w in _up_normalize_answer(ground_truth).split()]
  common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(prediction_tokens)
  recall = 1.0 * num_same / len(ground_truth_tokens)
  f1 = (2 * precision * recall) / (precision + recall)
  return f1


def _up_f1(prediction, ground_truth):
  predictions = [p.strip() for p in prediction.split(',')]
  ground_truths = [g.strip() for g in ground_truth.split(',')]
  return np.mean([max([_up_f1_score(prediction, gt) for prediction in predictions]) for gt in ground_truths])


def _up_eval_one(output, answer, category):
  answer = str(answer)
  if category == 3:
    answer = answer.split(';')[0].strip()
  if category in [2, 3, 4]:
    return _up_f1_score(output, answer)
  if category in [1]:
    return _up_f1(output, answer)
  if category in [5]:
    if 'no information available' in output.lower() or 'not mentioned' in output.lower():
      return 1
    return 0
  raise ValueError


def _up_get_cat_5_answer(model_prediction, answer_key):
  model_prediction = model_prediction.strip().lower()
  if len(model_prediction) == 1:
    if 'a' in model_prediction:
      return answer_key['a']
    else:
      return answer_key['b']
  elif len(model_prediction) == 3:
    if '(a)' in model_prediction:
      return answer_key['a']
    else:
      return answer_key['b']
  else:
    return model_prediction


WORDS = st.sampled_from(
  [
    'the',
    'a',
    'and',
    'Paris',
    'paris,',
    'running',
    'ran',
    'runs',
    '7',
    'May',
    '2023',
    'an',
    'cats',
    'cat',
    'Not',
    'mentioned',
    'no',
    'information',
    'available',
    '(a)',
    'b',
    ';',
    'x.y',
  ]
)
PHRASE = st.lists(WORDS, min_size=0, max_size=8).map(' '.join)


@settings(max_examples=300, deadline=None)
@given(PHRASE, PHRASE, st.integers(1, 5))
def test_locomo_metrics_match_the_literal_transcription(pred, gold, cat):
  assert official_qa.locomo_normalize(pred) == _up_normalize_answer(pred)
  assert official_qa.locomo_f1_score(pred, gold) == pytest.approx(_up_f1_score(pred, gold))
  assert official_qa.locomo_f1_multi(pred, gold) == pytest.approx(float(_up_f1(pred, gold)))
  assert official_qa.locomo_score(pred, gold, cat) == pytest.approx(float(_up_eval_one(pred, gold, cat)))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(['a', 'b', '(a)', '(b)', ' A ', 'x', 'abc', '(a) Paris', 'Not mentioned', '']))
def test_cat5_decoding_matches_upstream(reply):
  key = {'a': 'Not mentioned in the conversation', 'b': 'Paris'}
  assert official_qa.locomo_decode_cat5(reply, key) == _up_get_cat_5_answer(reply, key)


def test_locomo_prompts_follow_upstream():
  m = official_qa.locomo_messages('When did Caroline go?', 2, ['[1 May 2023] Caroline: hi'], ('Caroline', 'Mel'))
  assert len(m) == 1 and m[0]['role'] == 'user'
  text = m[0]['content']
  assert text.startswith('Below is a conversation between two people: Caroline and Mel. ')
  assert text.endswith(
    'Question: When did Caroline go? Use DATE of CONVERSATION to answer with an approximate date. Short answer:\n'
  )
  assert (
    '[1 May 2023] Caroline: hi\n\n\nBased on the above context, write an answer in the form of a short phrase' in text
  )
  ch = official_qa.locomo_cat5_choices('conv-1/q5', 'Paris', seed=1)
  assert ch == official_qa.locomo_cat5_choices('conv-1/q5', 'Paris', seed=1)
  assert sorted(ch.values()) == sorted(['Paris', 'Not mentioned in the conversation'])
  q5 = official_qa.locomo_messages('Where?', 5, [], ('A', 'B'), ch)[0]['content']
  assert f'Question: Where? Select the correct answer: (a) {ch["a"]} (b) {ch["b"]}.  Short answer:\n' in q5
  assert 'Based on the above context, answer the following question.' in q5
  draws = {official_qa.locomo_cat5_choices(f'q{i}', 'x', seed=3)['a'] for i in range(50)}
  assert len(draws) == 2  # both orders occur
  with pytest.raises(ValueError, match='choices'):
    official_qa.locomo_question('Where?', 5)
  with pytest.raises(ValueError, match='category'):
    official_qa.locomo_score('x', 'y', 6)


def test_fc_prompt_and_subem():
  m = official_qa.fc_messages('Where does Ann live?', [('3', 'Ann lives in Paris.'), ('9', 'Ann lives in Rome.')])
  assert m[0] == {'role': 'system', 'content': official_qa.MAB_SYSTEM}
  user = m[1]['content']
  assert user.startswith(
    'Here is a list of knowledge retrieved from memory: \n3. Ann lives in Paris.\n'
    '9. Ann lives in Rome.\n\nPretend you are a knowledge management system.'
  )
  assert user.endswith('Now Answer the Question: Based on the provided Knowledge Pool, Where does Ann live? \nAnswer:')
  assert official_qa.fc_score('Answer: Rome.', ['rome']) == 1.0
  assert official_qa.fc_score('The Paris', ['Rome', 'Roma']) == 0.0


# ------------------------------------------------------------------------------------------- the harness


def _fc_episode():
  facts = [
    'Ann lives in Paris.',
    'Bob works for Acme.',
    'Ann lives in Rome.',
    'Bob works for Initech.',
    'Cid plays chess.',
    'Cid plays golf.',
  ]
  items = tuple(Item(id=str(i), text=t, parent=str(i), position=i) for i, t in enumerate(facts))
  qs = (
    Question(
      id='q0',
      text='Where does Ann live?',
      gold=('2',),
      gold_parents=('2',),
      category='single-hop',
      answer=json.dumps(['Rome']),
    ),
    Question(
      id='q1',
      text='Who does Bob work for?',
      gold=('3',),
      gold_parents=('3',),
      category='single-hop',
      answer=json.dumps(['Initech']),
    ),
    Question(
      id='q2',
      text='What does Cid play?',
      gold=('5',),
      gold_parents=('5',),
      category='single-hop',
      answer=json.dumps(['golf']),
    ),
  )
  return Episode(id='fc', items=items, questions=qs)


def _rows():
  return {'bm25': [['2', '0'], ['1', '3'], ['4', '1']], 'cosine': [['0', '1'], ['3', '1'], ['5', '4']]}


class Crash(Exception):
  pass


class CrashingReader(FakeReader):
  def __init__(self, after_calls):
    super().__init__(batch_size=2)
    self.after = after_calls

  def generate(self, prompts, *, max_new_tokens):
    if self.calls >= self.after:
      raise Crash
    return super().generate(prompts, max_new_tokens=max_new_tokens)


def _run(reader, root, **kw):
  ep = _fc_episode()
  cache = answer_cache.AnswerCache(root, reader.spec(10))
  answer = lambda ps: tier1.answer_all(ps, reader, cache, max_new_tokens=10, progress=False)[0]
  return tier1.run_tier1(
    'factconsolidation', [(ep, q) for q in ep.questions], _rows(), answer, k=2, seed=0, n_resamples=200, **kw
  )


def test_harness_scores_rows_in_write_order_with_oracle_and_no_context(tmp_path):
  reader = FakeReader(batch_size=2)
  t1 = _run(reader, tmp_path, tier0={'bm25': np.ones(3), 'cosine': np.zeros(3)}, tier0_metric='answer@2')
  assert list(t1['rows']) == ['no-context', 'bm25', 'cosine', 'oracle']
  pq = t1['per_question']
  # the fake answers with the last matching context line: write order puts the newest fact last
  assert pq[0]['replies']['bm25'] == '2. Ann lives in Rome.' and pq[0]['scores']['bm25'] == 1.0
  assert pq[0]['replies']['cosine'] == '0. Ann lives in Paris.' and pq[0]['scores']['cosine'] == 0.0
  assert [p['scores']['oracle'] for p in pq] == [1.0, 1.0, 1.0]
  assert [p['scores']['no-context'] for p in pq] == [0.0, 0.0, 0.0]
  assert t1['rows']['cosine']['mean'] == pytest.approx(2 / 3)  # q1 (3 = Initech), q2 (5 = golf)
  assert t1['rows']['bm25']['mean'] == pytest.approx(2 / 3)  # q0 (2 = Rome), q1; q2 retrieved chess only
  assert t1['rows']['oracle']['n_contexts'] == 1.0 and t1['rows']['bm25']['n_contexts'] == 2.0
  vs = t1['rows']['cosine']['paired']['vs bm25']
  assert vs['delta'] == 0.0 and vs['mcnemar_p'] == 1.0  # discordant pairs: q0 and q2, one each way
  assert t1['rows']['bm25']['tier0'] == 1.0 and 'tier0' not in t1['rows']['oracle']
  assert tier1.ordering_note(t1) == ['bm25 vs cosine: Tier 0 +1.0000, Tier 1 +0.0000']
  assert '| oracle | 1.0 | 1.000' in tier1.markdown(t1, title='toy')
  # 12 prompts, 11 distinct (bm25 and cosine put q1's two facts in the same write order); a rerun generates nothing
  assert reader.generated == 11
  again = FakeReader(batch_size=2)
  assert (
    _run(again, tmp_path, tier0={'bm25': np.ones(3), 'cosine': np.zeros(3)}, tier0_metric='answer@2') == t1
    and again.generated == 0
  )


def test_equal_k_is_asserted():
  ep = _fc_episode()
  rows = _rows()
  rows['cosine'][1] = ['3']
  with pytest.raises(ValueError, match=r'row cosine, question 1: 1 retrieved ids .* expected 2'):
    tier1.check_equal_k(rows, [ep] * 3, k=2)
  rows['cosine'][1] = ['3', '3']
  with pytest.raises(ValueError, match='1 distinct'):
    tier1.check_equal_k(rows, [ep] * 3, k=2)


def test_an_interrupted_run_resumes_and_matches_an_uninterrupted_one(tmp_path):
  full = _run(FakeReader(batch_size=2), tmp_path / 'a')
  with pytest.raises(Crash):
    _run(CrashingReader(after_calls=3), tmp_path / 'b')  # 3 batches of 2 stored, then the crash
  stored = list((tmp_path / 'b').rglob('*.json'))
  assert len(stored) == 6 and not list((tmp_path / 'b').rglob('*.tmp'))
  resumed = FakeReader(batch_size=2)
  assert _run(resumed, tmp_path / 'b') == full and resumed.generated == 11 - 6


def test_cache_keys_depend_on_spec_and_exact_prompt(tmp_path):
  m = [{'role': 'user', 'content': 'hi'}]
  s1, s2 = {'fingerprint': 'x', 'max_new_tokens': 10}, {'fingerprint': 'x', 'max_new_tokens': 11}
  assert answer_cache.prompt_key(s1, m) != answer_cache.prompt_key(s2, m)
  assert answer_cache.prompt_key(s1, m) != answer_cache.prompt_key(s1, [{'role': 'user', 'content': 'hi '}])
  assert answer_cache.prompt_key(s1, m) == answer_cache.prompt_key(dict(reversed(list(s1.items()))), m)
  c = answer_cache.AnswerCache(tmp_path, s1)
  assert c.get(m) is None
  c.put(m, 'Rome')
  assert c.get(m) == 'Rome' and answer_cache.AnswerCache(tmp_path, s2).get(m) is None
  c.path(m).write_text(json.dumps({'spec': s2, 'messages': m, 'answer': 'x'}))
  with pytest.raises(ValueError, match='does not match its key'):
    c.get(m)


def test_locomo_rows_score_with_the_category_rules(tmp_path):
  items = tuple(
    Item(id=f'D1:{i}', text=f'[1 May 2023] {s}: {t}', parent='session_1', position=i, speaker=s)
    for i, (s, t) in enumerate([('Ann', 'I moved to Rome'), ('Bob', 'I adopted a cat'), ('Ann', 'Nice cat')])
  )
  qs = (
    Question(
      id='c/q1', text='Where did Ann move?', gold=('D1:0',), gold_parents=('session_1',), category=4, answer='Rome'
    ),
    Question(
      id='c/q2', text='What did Ann adopt?', gold=('D1:1',), gold_parents=('session_1',), category=5, answer='a cat'
    ),
  )
  ep = Episode(id='c', items=items, questions=qs)
  replies = {}

  def answer(prompts):
    out = []
    for p in prompts:
      text = p[0]['content']
      out.append('(b)' if 'Select the correct answer' in text else ('Rome' if 'moved to Rome' in text else 'x'))
      replies[len(replies)] = text
    return out

  t1 = tier1.run_tier1(
    'locomo', [(ep, q) for q in qs], {'bm25': [['D1:0'], ['D1:2']]}, answer, k=1, seed=0, n_resamples=200
  )
  ch = official_qa.locomo_cat5_choices('c/q2', 'a cat', seed=0)
  want_cat5 = float('not mentioned' in ch['b'].lower())
  assert t1['per_question'][1]['scores']['bm25'] == want_cat5
  assert t1['per_question'][0]['scores']['bm25'] == 1.0 and t1['per_question'][0]['scores']['no-context'] == 0.0
  assert t1['metric'] == 'F1' and set(t1['by_category']) == {'4', '5'}


# ------------------------------------------------------------------------------------- the LoCoMo pilot


def test_locomo_answer_pilot_is_stratified_and_regenerates():
  from engram_jax.data import splits as S
  from engram_jax.data.io import resolve_data_root

  ids = S.pilot_ids('locomo_answer')
  assert len(ids) == 300 == len(set(ids))
  assert S.draw_stratified({1: ['a', 'b', 'c'], 2: ['d', 'e']}, n_per=2, seed=1) == S.draw_stratified(
    {2: ['e', 'd'], 1: ['c', 'b', 'a']}, n_per=2, seed=1
  )
  try:
    root = resolve_data_root(None)
  except FileNotFoundError:
    pytest.skip('LoCoMo data not found')
  if not (root / 'locomo' / 'locomo10.json').is_file():
    pytest.skip('LoCoMo data not found')
  assert S.generate_pilot_ids('locomo_answer', root=root) == ids
  cats = S.locomo_ids_by_category(root)
  got = Counter(c for c, qs in cats.items() for q in qs if q in set(ids))
  assert got == {1: 60, 2: 60, 3: 60, 4: 60, 5: 60}


# ------------------------------------------------------------------------------------------ real model


@pytest.mark.slow
def test_smollm2_answers_one_factconsolidation_question(tmp_path):
  pytest.importorskip('gguf')
  from engram_jax.answer import reader as R

  try:
    R.smollm2_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  import os

  cache_dir = os.environ.get('ENGRAM_CACHE_DIR', str(tmp_path))
  r, info = R.load_reader('smollm2', cache_dir=cache_dir, batch_size=2)
  assert info.seconds > 0 and r.spec(10)['fingerprint'].startswith('gguf-sha256:')
  msgs = official_qa.fc_messages(
    'Where does the user live?', [('3', 'The user lives in Paris.'), ('7', 'The user lives in Berlin.')]
  )
  one = r.generate([msgs], max_new_tokens=10)
  assert len(one) == 1 and isinstance(one[0], str) and one[0]
  assert len(r.tokenizer(one[0], add_special_tokens=False)['input_ids']) <= 10
  assert r.generate([msgs], max_new_tokens=10) == one  # greedy: deterministic
