r"""Official answer-level (Tier 1) prompts and metrics, transcribed from upstream (read, not copied).

Plain Python (no JAX, no torch): prompts are chat messages (``[{'role', 'content'}]``), metrics score strings.

Pinned upstream commits (the prompts follow them; every remaining difference is listed in docs/tier1.md, "Prompts
against upstream"):

* MemoryAgentBench: HUST-AI-HYZ/MemoryAgentBench at :data:`MAB_COMMIT` (its HEAD when read): ``utils/templates.py``
  (``factconsolidation``, ``rag_agent``), ``methods/embedding_retriever.py`` (``RAGSystem.answer_query``: how the
  retrieved memories and the query are joined), ``utils/eval_data_utils.py`` (``format_chat``: system + user
  messages), ``utils/eval_other_utils.py`` (SubEM, ``parse_output``, ``default_post_process``);
  ``configs/data_conf/Conflict_Resolution/Factconsolidation_*.yaml`` (``generation_max_length: 10``).
* LoCoMo: snap-research/locomo at :data:`LOCOMO_COMMIT` (branch ``code``, its only code commit):
  ``task_eval/evaluate_gpts.py`` (``QA_PROMPT``, ``QA_PROMPT_CAT_5``, the category-2 and category-5 question
  texts, ``get_rag_context`` for the ``dialog`` RAG mode, ``get_cat_5_answer``, 32 tokens) and
  ``task_eval/evaluation.py`` (the scoring).

MemoryAgentBench FactConsolidation (:func:`fc_messages`):

* system message :data:`MAB_SYSTEM`; the user message is upstream's RAG join: one ``"Memory {i+1}:\n{memory}"``
  block per retrieved memory, in retrieval order (best first), the blocks joined by ``"\n"``, then ``"\n"`` and the
  ``query`` template (:data:`FC_QUERY`) with the question; a memory is one fact, ``"<serial>. <fact>"``;
* upstream ``generation_max_length`` is 10 tokens (:data:`FC_MAX_NEW_TOKENS`) and :func:`fc_score` is
  :func:`engram_jax.metrics.official.subem_official` (SubEM with SQuAD normalisation, max over the raw and the parsed
  output) of that reply.

LoCoMo QA (:func:`locomo_messages`, the ``batch_size == 1`` RAG path of ``get_gpt_answers``):

* context: the retrieved turns alone, in retrieval order (best first), one :func:`locomo_turn` line each
  (``{date}: {speaker} said, "{text}"``, no image caption), joined by ``"\n"``; then ``"\n\n"`` and
  :data:`LOCOMO_QA_PROMPT` (:data:`LOCOMO_QA_PROMPT_CAT_5` for category 5) with the question; category 2 appends
  :data:`LOCOMO_TEMPORAL_SUFFIX`; category 5 appends ``" Select the correct answer: (a) {} (b) {}. "`` with
  "Not mentioned in the conversation" and the adversarial answer in an order drawn per question (upstream
  ``random.random() < 0.5``; here seeded by question id, :func:`locomo_cat5_choices`), and the reply is decoded by
  ``get_cat_5_answer`` (:func:`locomo_decode_cat5`); upstream requests 32 tokens (:data:`LOCOMO_MAX_NEW_TOKENS`);
* scoring ``eval_question_answering``: categories 2, 3, 4 -> :func:`locomo_f1_score` (Porter-stemmed token F1 after
  :func:`locomo_normalize`, which also drops commas and the word "and"); category 3 scores only the gold before the
  first ``;``; category 1 -> :func:`locomo_f1_multi` (comma-split sub-answers: the mean over gold parts of the max
  over predicted parts); category 5 -> 1 when the (decoded) reply contains "no information available" or
  "not mentioned" (case-insensitive), else 0 (:func:`locomo_score`).

LongMemEval's official answer metric is an LLM judge (GPT-4o); it is not imitated here: :class:`AnswerJudge` is the
interface a judge implements.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from engram_jax.metrics import official

# ------------------------------------------------------------------------------ MemoryAgentBench FactConsolidation

MAB_COMMIT = '455306dcabc3842526eb83cd4e225e5d486c5c5d'
LOCOMO_COMMIT = '92286325a40764bee61f77824ddb95233b11c4d6'

MAB_SYSTEM = 'You are a helpful assistant that can read the context and memorize it for future retrieval.'
FC_QUERY = (
  'Pretend you are a knowledge management system. Each fact in the knowledge pool is provided with a serial '
  'number at the beginning, and the newer fact has larger serial number. \n You need to solve the conflicts '
  'of facts in the knowledge pool by finding the newest fact with larger serial number. You need to answer '
  'a question based on this rule. You should give a very concise answer without saying other words for the '
  'question **only** from the knowledge pool you have memorized rather than the real facts in real world. '
  '\n\nFor example:\n\n [Knowledge Pool] \n\n Question: Based on the provided Knowledge Pool, what is the '
  'name of the current president of Russia? \nAnswer: Donald Trump \n\n Now Answer the Question: Based on '
  'the provided Knowledge Pool, {question} \nAnswer:'
)
FC_MAX_NEW_TOKENS = 10


def fc_messages(question: str, facts: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
  """FactConsolidation chat messages for ``question`` over ``facts`` = ``[(serial, text)]`` in retrieval order:
  upstream's ``"Memory {i+1}:\n{memory}"`` blocks joined by newlines, a newline, then the query."""
  memory = '\n'.join(f'Memory {i + 1}:\n{serial}. {text}' for i, (serial, text) in enumerate(facts))
  user = memory + '\n' + FC_QUERY.replace('{question}', question)
  return [{'role': 'system', 'content': MAB_SYSTEM}, {'role': 'user', 'content': user}]


def fc_score(reply: str, answers: str | Sequence[str]) -> float:
  """MemoryAgentBench SubEM of a (<= 10-token) reply: :func:`engram_jax.metrics.official.subem_official`.

  Example:
    >>> from engram_jax.answer import fc_score
    >>> fc_score('The answer is Paris.', ['Paris']), fc_score('London', ['Paris'])  # MemoryAgentBench SubEM
    (1.0, 0.0)
  """
  return official.subem_official(reply, answers)


# ------------------------------------------------------------------------------------------------------ LoCoMo QA

LOCOMO_QA_PROMPT = (
  '\nBased on the above context, write an answer in the form of a short phrase for the following '
  'question. Answer with exact words from the context whenever possible.\n\nQuestion: {} Short '
  'answer:\n'
)
LOCOMO_QA_PROMPT_CAT_5 = '\nBased on the above context, answer the following question.\n\nQuestion: {} Short answer:\n'
LOCOMO_TEMPORAL_SUFFIX = ' Use DATE of CONVERSATION to answer with an approximate date.'
LOCOMO_NOT_MENTIONED = 'Not mentioned in the conversation'
LOCOMO_MAX_NEW_TOKENS = 32


def locomo_cat5_choices(question_id: str, adversarial_answer: str, *, seed: int) -> dict[str, str]:
  """The (a)/(b) options of a category-5 question: upstream draws ``random.random() < 0.5`` per question (then
  "Not mentioned" is (a)); here the draw is ``random.Random(f'{seed}:{question_id}')``, reproducible."""
  if random.Random(f'{seed}:{question_id}').random() < 0.5:
    return {'a': LOCOMO_NOT_MENTIONED, 'b': adversarial_answer}
  return {'a': adversarial_answer, 'b': LOCOMO_NOT_MENTIONED}


def locomo_question(question: str, category: int, choices: dict[str, str] | None = None) -> str:
  """Upstream's question text per category (2: temporal suffix; 5: the two options)."""
  if category == 2:
    return question + LOCOMO_TEMPORAL_SUFFIX
  if category == 5:
    if choices is None:
      raise ValueError('locomo_question: category 5 needs its (a)/(b) choices')
    return question + ' Select the correct answer: (a) {} (b) {}. '.format(choices['a'], choices['b'])
  return question


def locomo_turn(date: str | None, speaker: str, text: str) -> str:
  """One retrieved turn as upstream's ``dialog`` RAG mode writes it: ``{date}: {speaker} said, "{text}"`` (the
  session's date; no image caption)."""
  return f'{date or ""}: {speaker} said, "{text}"'


def locomo_messages(
  question: str, category: int, context: Sequence[str], choices: dict[str, str] | None = None
) -> list[dict[str, str]]:
  """LoCoMo QA chat messages (one user message, as upstream's RAG path): the retrieved turns (one
  :func:`locomo_turn` line each, in retrieval order), a blank line, then the QA prompt."""
  prompt = LOCOMO_QA_PROMPT_CAT_5 if category == 5 else LOCOMO_QA_PROMPT
  return [
    {
      'role': 'user',
      'content': '\n'.join(context) + '\n\n' + prompt.format(locomo_question(question, category, choices)),
    }
  ]


def locomo_decode_cat5(reply: str, choices: dict[str, str]) -> str:
  """Upstream ``get_cat_5_answer``: a 1-character reply -> option a if it contains ``a`` else b; a 3-character
  reply -> a if it contains ``(a)`` else b; otherwise the stripped, lower-cased reply."""
  pred = reply.strip().lower()
  if len(pred) == 1:
    return choices['a'] if 'a' in pred else choices['b']
  if len(pred) == 3:
    return choices['a'] if '(a)' in pred else choices['b']
  return pred


_LOCOMO_ARTICLES = re.compile(r'\b(a|an|the|and)\b')
_PUNCT = frozenset(string.punctuation)


def locomo_normalize(text: str) -> str:
  """Upstream ``normalize_answer``: drop commas, lower-case, drop ``string.punctuation``, replace a/an/the/and by a
  space, collapse whitespace."""
  text = ''.join(ch for ch in text.replace(',', '').lower() if ch not in _PUNCT)
  return ' '.join(_LOCOMO_ARTICLES.sub(' ', text).split())


def _stemmer():
  from nltk.stem import PorterStemmer

  return PorterStemmer()


def locomo_f1_score(prediction: str, ground_truth: str) -> float:
  """Upstream ``f1_score``: token F1 of the Porter-stemmed tokens of :func:`locomo_normalize` (0 with no overlap)."""
  ps = _stemmer()
  pred = [ps.stem(w) for w in locomo_normalize(prediction).split()]
  gold = [ps.stem(w) for w in locomo_normalize(ground_truth).split()]
  same = sum((Counter(pred) & Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 2 * precision * recall / (precision + recall)


def locomo_f1_multi(prediction: str, ground_truth: str) -> float:
  """Upstream ``f1``: split both on commas; the mean over gold parts of the best :func:`locomo_f1_score` over the
  predicted parts."""
  preds = [p.strip() for p in prediction.split(',')]
  golds = [g.strip() for g in ground_truth.split(',')]
  return float(sum(max(locomo_f1_score(p, g) for p in preds) for g in golds) / len(golds))


def locomo_score(reply: str, answer: str | None, category: int) -> float:
  """Upstream ``eval_question_answering`` for one question (``reply`` already decoded for category 5).

  Raises:
    ValueError: on a category outside 1-5, or a missing gold answer for categories 1-4.

  Example:
    >>> from engram_jax.answer import locomo_score
    >>> round(locomo_score('She adopted a dog', 'a dog', category=4), 3)  # LoCoMo token F1 (Porter-stemmed)
    0.5
  """
  if category == 5:
    low = reply.lower()
    return float('no information available' in low or 'not mentioned' in low)
  if category not in (1, 2, 3, 4):
    raise ValueError(f'LoCoMo category {category!r} is not 1-5')
  if answer is None:
    raise ValueError('LoCoMo categories 1-4 need a gold answer')
  gold = str(answer)
  if category == 3:
    gold = gold.split(';')[0].strip()
  if category == 1:
    return locomo_f1_multi(reply, gold)
  return locomo_f1_score(reply, gold)


# ----------------------------------------------------------------------------------------------- LongMemEval


class AnswerJudge(Protocol):
  """LongMemEval's answer metric is an LLM judge (upstream: GPT-4o with a per-type prompt). Not imitated here; a
  judge maps (question, gold answer, reply, question type) to 0/1."""

  def __call__(self, question: str, answer: str, reply: str, question_type: str) -> float: ...
