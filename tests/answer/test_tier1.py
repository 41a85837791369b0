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


# literal transcription of snap-research/locomo task_eval/evaluate_gpts.py at commit
# 92286325a40764bee61f77824ddb95233b11c4d6: QA_PROMPT, QA_PROMPT_CAT_5 (lines 32-42), the dialog entries of
# prepare_for_rag (line 144), get_rag_context's dialog join (line 293) and the batch_size == 1 query (line 432)
_UP_QA_PROMPT = """
Based on the above context, write an answer in the form of a short phrase for the following question. Answer with exact words from the context whenever possible.

Question: {} Short answer:
"""

_UP_QA_PROMPT_CAT_5 = """
Based on the above context, answer the following question.

Question: {} Short answer:
"""


def _up_locomo_rag_query(turns, question, cat_5):
  dialogs = [dialog['speaker'] + ' said, "' + dialog['clean_text'] + '"' for dialog in turns]
  date_times = [dialog['date_time'] for dialog in turns]
  query_conv = '\n'.join([date_time + ': ' + context for date_time, context in zip(date_times, dialogs)])
  if not cat_5:
    return query_conv + '\n\n' + _UP_QA_PROMPT.format(question)
  return query_conv + '\n\n' + _UP_QA_PROMPT_CAT_5.format(question)


def test_locomo_prompts_follow_upstream():
  turns = [
    {'speaker': 'Caroline', 'clean_text': 'I went to a LGBTQ support group.', 'date_time': '1:56 pm on 8 May, 2023'},
    {'speaker': 'Mel', 'clean_text': 'Wow, "brave"!', 'date_time': '7:55 pm on 9 June, 2023'},
  ]
  ctx = [official_qa.locomo_turn(t['date_time'], t['speaker'], t['clean_text']) for t in turns]
  m = official_qa.locomo_messages('When did Caroline go?', 2, ctx)
  assert len(m) == 1 and m[0]['role'] == 'user'
  q2 = 'When did Caroline go? Use DATE of CONVERSATION to answer with an approximate date.'
  assert m[0]['content'] == _up_locomo_rag_query(turns, q2, cat_5=False)
  assert m[0]['content'].startswith('1:56 pm on 8 May, 2023: Caroline said, "I went to a LGBTQ support group."\n')
  ch = official_qa.locomo_cat5_choices('conv-1/q5', 'Paris', seed=1)
  assert ch == official_qa.locomo_cat5_choices('conv-1/q5', 'Paris', seed=1)
  assert sorted(ch.values()) == sorted(['Paris', 'Not mentioned in the conversation'])
  q5 = official_qa.locomo_messages('Where?', 5, ctx[:1], ch)[0]['content']
  up_q5 = 'Where?' + ' Select the correct answer: (a) {} (b) {}. '.format(ch['a'], ch['b'])
  assert q5 == _up_locomo_rag_query(turns[:1], up_q5, cat_5=True)
  assert official_qa.locomo_messages('Who?', 4, [])[0]['content'] == _up_locomo_rag_query([], 'Who?', cat_5=False)
  draws = {official_qa.locomo_cat5_choices(f'q{i}', 'x', seed=3)['a'] for i in range(50)}
  assert len(draws) == 2  # both orders occur
  with pytest.raises(ValueError, match='choices'):
    official_qa.locomo_question('Where?', 5)
  with pytest.raises(ValueError, match='category'):
    official_qa.locomo_score('x', 'y', 6)


def test_locomo_turns_lose_the_loader_template_and_caption():
  from engram_jax.data.locomo import turn_text

  def item(text, time='8 May, 2023', speaker='Mel'):
    return Item(id='D1:1', text=text, parent='session_1', position=0, time=time, speaker=speaker)

  assert turn_text(item('[8 May, 2023] Mel: Look! [shares a photo: a dog]')) == 'Look!'
  assert turn_text(item('[8 May, 2023] Mel: Look [here] now')) == 'Look [here] now'
  assert turn_text(item('Mel: hi there')) == 'hi there'  # template `speaker`
  assert turn_text(item('hi there', speaker=None)) == 'hi there'  # template `text`
  assert turn_text(item('[] Mel: hi', time=None)) == 'hi'  # a session without a date


# literal transcription of HUST-AI-HYZ/MemoryAgentBench at commit 455306dcabc3842526eb83cd4e225e5d486c5c5d:
# utils/templates.py (SYSTEM_MESSAGE; factconsolidation query, rag_agent), methods/embedding_retriever.py
# (RAGSystem.answer_query: the Memory blocks and the join) and utils/eval_data_utils.py (format_chat)
_UP_SYSTEM_MESSAGE = 'You are a helpful assistant that can read the context and memorize it for future retrieval.'
_UP_FC_RAG_QUERY = 'Pretend you are a knowledge management system. Each fact in the knowledge pool is provided with a serial number at the beginning, and the newer fact has larger serial number. \n You need to solve the conflicts of facts in the knowledge pool by finding the newest fact with larger serial number. You need to answer a question based on this rule. You should give a very concise answer without saying other words for the question **only** from the knowledge pool you have memorized rather than the real facts in real world. \n\nFor example:\n\n [Knowledge Pool] \n\n Question: Based on the provided Knowledge Pool, what is the name of the current president of Russia? \nAnswer: Donald Trump \n\n Now Answer the Question: Based on the provided Knowledge Pool, {question} \nAnswer:'  # noqa: E501


def _up_format_chat(message, include_system=True, system_message='You are a helpful assistant.'):
  chat_messages = [{'role': 'user', 'content': message}]
  if include_system:
    chat_messages.insert(0, {'role': 'system', 'content': system_message})
  return chat_messages


def _up_fc_rag_messages(retrieved_contexts, question):
  query = _UP_FC_RAG_QUERY.format(question=question)
  retrieval_memory_string = '\n'.join([f'Memory {i + 1}:\n{text}' for i, text in enumerate(retrieved_contexts)])
  ask_llm_message = retrieval_memory_string + '\n' + query
  return _up_format_chat(message=ask_llm_message, system_message=_UP_SYSTEM_MESSAGE)


def test_fc_prompt_and_subem():
  facts = [('9', 'Ann lives in Rome.'), ('3', 'Ann lives in Paris.')]  # retrieval order, best first
  m = official_qa.fc_messages('Where does Ann live?', facts)
  assert m == _up_fc_rag_messages(['9. Ann lives in Rome.', '3. Ann lives in Paris.'], 'Where does Ann live?')
  assert m[1]['content'].startswith('Memory 1:\n9. Ann lives in Rome.\nMemory 2:\n3. Ann lives in Paris.\nPretend')
  assert official_qa.fc_messages('Q?', []) == _up_fc_rag_messages([], 'Q?')  # no context: an empty memory string
  assert official_qa.fc_score('Answer: Rome.', ['rome']) == 1.0
  assert official_qa.fc_score('The Paris', ['Rome', 'Roma']) == 0.0


def test_position_shares_count_gold_and_reply_positions():
  nm = official_qa.LOCOMO_NOT_MENTIONED
  ch = [
    {'a': nm, 'b': 'Paris'},
    {'a': 'Rome', 'b': nm},
    {'a': 'Oslo', 'b': nm},
    {'a': nm, 'b': 'Kyiv'},
    {'a': 'Bern', 'b': nm},
  ]
  replies = ['(b)', 'B', '(a) Oslo', 'Not mentioned in the conversation.', 'x']
  assert [tier1.reply_position(r, c) for r, c in zip(replies, ch)] == ['b', 'b', 'a', 'a', 'b']
  out = tier1.position_shares(replies, ch)
  assert out['n'] == 5
  assert out['gold'] == {'a': pytest.approx(0.4), 'b': pytest.approx(0.6)}
  assert out['replies'] == {'a': pytest.approx(0.4), 'b': pytest.approx(0.6), 'other': 0.0}
  # correct at (a): q0 replied (b) -> Paris (0), q3 names the option (1); at (b): q1 (1), q2 (0), q4 'x' -> (b) (1)
  assert out['score_by_gold'] == {'a': pytest.approx(0.5), 'b': pytest.approx(2 / 3)} and out['both_named'] == 0.0
  assert tier1.reply_position('I think Paris', ch[0]) == 'other'
  assert tier1.reply_position('The answer is (b) Not mentioned in the conversation.', ch[1]) == 'b'
  assert tier1.reply_position('(a) or (b)? Hard to say', ch[1]) == 'other'
  assert tier1.reply_position('(a) Rome\n(b) Not mentioned', ch[1]) == 'a'  # the first line picks
  echo = tier1.position_shares(['(a) Rome (b) Not mentioned in the conversation.'], ch[1:2])
  assert echo['replies']['other'] == 1.0 and echo['both_named'] == 1.0 and echo['score_by_gold']['b'] == 1.0
  assert tier1.position_shares([], [])['score_by_gold'] == {'a': None, 'b': None}
  with pytest.raises(ValueError, match='2 replies for 1 questions'):
    tier1.position_shares(['a', 'b'], ch[:1])


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


def test_harness_scores_rows_in_retrieval_order_with_oracle_and_no_context(tmp_path):
  reader = FakeReader(batch_size=2)
  tier0 = {'bm25': np.zeros(3), 'cosine': np.ones(3)}
  t1 = _run(reader, tmp_path, tier0=tier0, tier0_metric='answer@2')
  assert list(t1['rows']) == ['no-context', 'bm25', 'cosine', 'oracle']
  pq = t1['per_question']
  # the fake answers with the last matching context line: in retrieval order that is the lower-ranked fact
  assert pq[0]['replies']['bm25'] == '0. Ann lives in Paris.' and pq[0]['scores']['bm25'] == 0.0
  assert pq[1]['replies']['bm25'] == '3. Bob works for Initech.' and pq[1]['scores']['bm25'] == 1.0
  assert pq[1]['replies']['cosine'] == '1. Bob works for Acme.' and pq[1]['scores']['cosine'] == 0.0
  assert [p['scores']['oracle'] for p in pq] == [1.0, 1.0, 1.0]
  assert [p['scores']['no-context'] for p in pq] == [0.0, 0.0, 0.0]
  assert t1['rows']['bm25']['mean'] == pytest.approx(1 / 3) and t1['rows']['cosine']['mean'] == 0.0
  assert t1['rows']['oracle']['n_contexts'] == 1.0 and t1['rows']['bm25']['n_contexts'] == 2.0
  vs = t1['rows']['cosine']['paired']['vs bm25']
  assert vs['delta'] == pytest.approx(-1 / 3) and vs['mcnemar_p'] == 1.0  # one discordant pair (q1)
  assert t1['rows']['bm25']['tier0'] == 0.0 and 'tier0' not in t1['rows']['oracle']
  assert tier1.ordering_note(t1) == ['bm25 vs cosine: Tier 0 -1.0000, Tier 1 +0.3333']
  assert '| oracle | 1.0 | 1.000' in tier1.markdown(t1, title='toy')
  assert t1['position_bias'] == {}  # FactConsolidation has no options
  # 12 prompts, all distinct (the same two facts in another order are another prompt); a rerun generates nothing
  assert reader.generated == 12
  again = FakeReader(batch_size=2)
  assert _run(again, tmp_path, tier0=tier0, tier0_metric='answer@2') == t1 and again.generated == 0


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
  assert _run(resumed, tmp_path / 'b') == full and resumed.generated == 12 - 6


class OtherRunReader(FakeReader):
  """A reader whose every batch is followed by another run on the same cache storing ``other`` more answers (what a
  second run of the same command, in the other order, does meanwhile); it records the prompts it is given."""

  def __init__(self, cache, prompts, other):
    super().__init__(batch_size=2)
    self.cache, self.pending, self.other, self.seen = cache, list(prompts), other, []

  def generate(self, prompts, *, max_new_tokens):
    self.seen += [answer_cache.canonical(m) for m in prompts]
    out = super().generate(prompts, max_new_tokens=max_new_tokens)
    done = set(self.seen)
    for m in [m for m in self.pending if answer_cache.canonical(m) not in done][: self.other]:
      self.cache.put(m, 'from the other run')
      self.pending.remove(m)
    return out


def _prompts(n):
  return [[{'role': 'user', 'content': 'q ' + 'x' * i}] for i in range(n)]


def test_two_runs_on_one_cache_share_the_work(tmp_path):
  """answer_all reads the cache again before each batch: what another run stored meanwhile is not generated."""
  prompts = _prompts(9)
  cache = answer_cache.AnswerCache(tmp_path, FakeReader().spec(10))
  longest = sorted(prompts, key=lambda m: len(answer_cache.canonical(m)), reverse=True)
  reader = OtherRunReader(cache, longest[::-1], other=2)  # the other run works shortest first
  replies, st = tier1.answer_all(prompts, reader, cache, max_new_tokens=10, progress=False, longest_first=True)
  # batches of 2, longest first, while the other run stores the 2 shortest after each: they meet in the middle
  assert reader.seen == [answer_cache.canonical(m) for m in longest[:5]]
  assert (st.generated, st.cached, st.unique) == (5, 4, 9) and reader.generated == 5
  assert [r == 'from the other run' for r in replies] == [True] * 4 + [False] * 5  # the 4 shortest
  again = FakeReader(batch_size=2)  # a rerun: everything from the cache, the same replies
  assert tier1.answer_all(prompts, again, cache, max_new_tokens=10, progress=False)[0] == replies
  assert again.generated == 0


def test_longest_first_reverses_the_generation_order_not_the_replies(tmp_path):
  prompts = _prompts(5)
  spec = FakeReader().spec(10)
  r1, r2 = OtherRunReader(None, [], 0), OtherRunReader(None, [], 0)
  a = tier1.answer_all(prompts, r1, answer_cache.AnswerCache(tmp_path / 'a', spec), max_new_tokens=10, progress=False)
  b = tier1.answer_all(
    prompts, r2, answer_cache.AnswerCache(tmp_path / 'b', spec), max_new_tokens=10, progress=False, longest_first=True
  )
  assert a[0] == b[0] and r1.seen == r2.seen[::-1] and r1.seen == sorted(r1.seen, key=len)


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
    Item(id=f'D1:{i}', text=f'[1 May 2023] {s}: {t}', parent='session_1', position=i, time='1 May 2023', speaker=s)
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
  # the turns reach the reader as upstream writes them: date, speaker, said, the quoted text (no template prefix)
  assert replies[4].startswith('1 May 2023: Ann said, "I moved to Rome"\n\n')
  gold_at = 'a' if ch['a'] == official_qa.LOCOMO_NOT_MENTIONED else 'b'
  bias = t1['position_bias']['bm25']
  assert bias['n'] == 1 and bias['gold'][gold_at] == 1.0 and bias['replies'] == {'a': 0.0, 'b': 1.0, 'other': 0.0}
  assert set(t1['position_bias']) == {'no-context', 'bm25', 'oracle'}
  assert 'Category 5 (adversarial), option positions' in tier1.markdown(t1)


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
