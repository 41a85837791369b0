r"""Official metrics, reproduced: LongMemEval retrieval and MemoryAgentBench SubEM, plus FactConsolidation ranks.

Plain Python/NumPy on ids and strings (no JAX): these score finished rankings and reader outputs.

LongMemEval (xiaowu0162/LongMemEval, transcribed from reading, not copied):

* ``src/retrieval/eval_utils.py`` at commit ``6a92d1ab7a7f8815525e43048f752f59e1d711a9`` (its only version):
  ``dcg``, ``ndcg``, ``evaluate_retrieval`` -> :func:`dcg_any`, :func:`ndcg_any`, :func:`evaluate_retrieval`;
  ``evaluate_retrieval_turn2session`` -> :func:`evaluate_retrieval_turn2session`. Upstream calls
  ``np.asfarray`` (removed in NumPy 2); here the relevances are ``np.asarray(..., dtype=np.float64)``, the same
  values.
* ``src/retrieval/run_retrieval.py`` at commit ``b60a5b7d05fb2cf6e4d0d63948f17e294ee827c4``: the corpus ids
  (reproduced by :mod:`engram_jax.data.longmemeval`), ``correct_docs`` = corpus ids containing ``"answer"``
  (:func:`longmemeval_correct_docs`), the cutoffs ``k in [1, 3, 5, 10, 30, 50]`` (:data:`LONGMEMEVAL_KS`) and the
  skip rules of its averaging loop (:func:`official_skip_reason`).

One deliberate guard: upstream's ``recall_all`` is ``all(...)`` over the gold list, which is 1.0 for an empty gold
list. Here an empty gold list scores 0 on every metric. Upstream's averages never include such a question (its
second skip rule removes exactly the questions with no gold), so the reported means are unchanged.

MemoryAgentBench (HUST-AI-HYZ/MemoryAgentBench, ``utils/eval_other_utils.py`` at commit
``455306dcabc3842526eb83cd4e225e5d486c5c5d``, DensePhrases/HELMET-derived code): ``normalize_answer`` =
lower-case, drop ``string.punctuation`` characters, replace the articles a/an/the by a space, collapse whitespace; SubEM = normalised gold is a substring of the normalised
prediction, max over the gold list (:func:`subem`); the default post-processing also scores the
``parse_output`` of the raw output and keeps the max (:func:`subem_official`).
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

LONGMEMEVAL_KS = (1, 3, 5, 10, 30, 50)


class RetrievalScores(NamedTuple):
  """One question's official retrieval scores at one cutoff."""

  recall_any: float
  recall_all: float
  ndcg_any: float


# ----------------------------------------------------------------------------------------------- LongMemEval


def dcg_any(relevances: Sequence[float], *, k: int) -> float:
  r"""LongMemEval's DCG: ranks 1 and 2 are both undiscounted.

  Definition (0-based position ``i``, ``n = min(k, len(relevances))``):
    .. math::
      \mathrm{DCG@k} = r_0 + \sum_{i=1}^{n-1} \frac{r_i}{\log_2(i + 1)}

  (standard DCG divides by :math:`\log_2(i + 2)`). Empty input -> 0.

  Args:
    relevances: ``[N]`` relevance of each ranked document, best first.
    k: cutoff.
  """
  rel = np.asarray(relevances, dtype=np.float64)[:k]
  if rel.size == 0:
    return 0.0
  return float(rel[0] + np.sum(rel[1:] / np.log2(np.arange(2, rel.size + 1))))


def ndcg_any(rankings: Sequence[int], correct_docs: Collection[str], corpus_ids: Sequence[str], *, k: int) -> float:
  """LongMemEval ``ndcg``: :func:`dcg_any` of the ranked binary relevances over the ideal ordering of the whole
  corpus (every corpus entry whose id is in ``correct_docs`` is relevant, duplicates included).

  Args:
    rankings: ``[R]`` corpus indices, best first (upstream passes the full argsort).
    correct_docs: gold ids.
    corpus_ids: ``[N]`` the id of each corpus entry.
    k: cutoff.

  Returns 0 when no corpus entry is relevant.
  """
  gold = set(correct_docs)
  relevances = [1 if cid in gold else 0 for cid in corpus_ids]
  ideal = dcg_any(sorted(relevances, reverse=True), k=k)
  if ideal == 0:
    return 0.0
  return dcg_any([relevances[i] for i in rankings[:k]], k=k) / ideal


def evaluate_retrieval(
  rankings: Sequence[int], correct_docs: Collection[str], corpus_ids: Sequence[str], *, k: int
) -> RetrievalScores:
  """LongMemEval ``evaluate_retrieval``: recall_any@k, recall_all@k, ndcg_any@k for one question.

  ``recall_any`` = 1 if any gold id is among the ids of ``rankings[:k]``; ``recall_all`` = 1 if every gold id is;
  ``ndcg_any`` = :func:`ndcg_any`. An empty ``correct_docs`` gives ``(0, 0, 0)`` (upstream: ``recall_all`` = 1;
  see the module docstring).

  Args:
    rankings: ``[R]`` corpus indices, best first.
    correct_docs: gold ids (e.g. :func:`longmemeval_correct_docs`).
    corpus_ids: ``[N]`` the id of each corpus entry.
    k: cutoff.
  """
  gold = list(correct_docs)
  if not gold:
    return RetrievalScores(0.0, 0.0, 0.0)
  recalled = {corpus_ids[i] for i in rankings[:k]}
  hits = [g in recalled for g in gold]
  return RetrievalScores(float(any(hits)), float(all(hits)), ndcg_any(rankings, gold, corpus_ids, k=k))


def turn_to_session_id(turn_id: str) -> str:
  """Upstream ``strip_turn_id``: drop the last ``_``-separated field (``answer_ab_3`` -> ``answer_ab``)."""
  return '_'.join(turn_id.split('_')[:-1])


def turn2session_k(rankings: Sequence[int], session_ids: Sequence[str], *, k: int) -> int:
  """The grown cutoff of upstream ``evaluate_retrieval_turn2session``.

  Starting at ``k``, the cutoff grows by one while it is ``<= len(session_ids)`` and ``rankings[:cutoff]`` covers
  fewer than ``k`` distinct sessions (so the loop may stop at ``len(session_ids) + 1``, as upstream).

  Raises:
    ValueError: when ``rankings`` is shorter than the cutoff it needs and shorter than the corpus, i.e. the
      result would differ from upstream's, which always ranks the whole corpus.
  """
  n = len(session_ids)
  eff = k
  seen = {session_ids[i] for i in rankings[:eff]}
  while eff <= n and len(seen) < k:
    if eff >= len(rankings) and len(rankings) < n:
      raise ValueError(
        f'turn->session at k={k}: the ranking has {len(rankings)} of {n} entries and covers only '
        f'{len(seen)} sessions; pass a longer ranking (upstream ranks the whole corpus)'
      )
    eff += 1
    seen = {session_ids[i] for i in rankings[:eff]}
  return eff


def evaluate_retrieval_turn2session(
  rankings: Sequence[int], correct_docs: Collection[str], corpus_ids: Sequence[str], *, k: int
) -> RetrievalScores:
  """LongMemEval ``evaluate_retrieval_turn2session``: session-level scores from a turn-level ranking.

  Turn ids and gold ids are mapped with :func:`turn_to_session_id` (so a ``noans_<x>_<t>`` turn maps to
  ``noans_<x>``, which is never gold, even when ``answer_<x>`` is); the cutoff grows from ``k`` until the ranked
  turns cover ``k`` distinct sessions (:func:`turn2session_k`); then :func:`evaluate_retrieval` runs on the
  session-id corpus at that cutoff, so ``ndcg_any`` counts every relevant turn (duplicate session ids) in both the
  ranking and the ideal ordering, exactly as upstream.

  Args:
    rankings: ``[R]`` turn-corpus indices, best first; must be long enough for the grown cutoff.
    correct_docs: gold turn ids.
    corpus_ids: ``[N]`` turn ids.
    k: number of distinct sessions.
  """
  gold = sorted({turn_to_session_id(g) for g in correct_docs})
  session_ids = [turn_to_session_id(c) for c in corpus_ids]
  eff = turn2session_k(rankings, session_ids, k=k)
  return evaluate_retrieval(rankings, gold, session_ids, k=eff)


def longmemeval_correct_docs(corpus_ids: Sequence[str]) -> list[str]:
  """Upstream ``correct_docs``: the distinct corpus ids containing ``"answer"`` (sorted here; order is unused).

  On episodes of :mod:`engram_jax.data.longmemeval` this is exactly the question's gold (``noans`` ids and the
  ``#dup<n>`` ids of repeated sessions never contain ``"answer"``)."""
  return sorted({cid for cid in corpus_ids if 'answer' in cid})


def official_skip_reason(question_id: str, corpus_ids: Sequence[str]) -> str | None:
  """Why upstream's averages leave a question out, or None when it is scored.

  ``'abstention'``: ``'_abs'`` occurs in the question id. ``'no_user_evidence'``: no user turn of the haystack has
  ``has_answer: true``; on the official corpora (user turns, or sessions of user text, as built by
  :mod:`engram_jax.data.longmemeval` with ``roles=('user',)``) that is exactly "no corpus id contains
  ``answer``". The loader already excludes such questions (they have no gold; counted as ``excluded_no_gold``),
  so on its episodes only ``'abstention'`` occurs. With assistant turns indexed the second test is no longer the
  official one; use :func:`engram_jax.data.longmemeval.entry_skip_reason` on the raw entry then.

  Args:
    question_id: the LongMemEval question id.
    corpus_ids: the ids of the question's corpus (its episode's item ids).
  """
  if '_abs' in question_id:
    return 'abstention'
  if not any('answer' in cid for cid in corpus_ids):
    return 'no_user_evidence'
  return None


def longmemeval_scores(
  rankings: Sequence[int], corpus_ids: Sequence[str], *, level: str, ks: Sequence[int] = LONGMEMEVAL_KS
) -> dict[str, dict[str, float]]:
  """All official per-question scores, keyed as upstream's ``retrieval_results['metrics']``.

  ``level='session'`` fills ``'session'``; ``level='turn'`` fills ``'turn'`` and, via the turn->session conversion,
  ``'session'``. Metric names: ``recall_any@k``, ``recall_all@k``, ``ndcg_any@k``.

  Args:
    rankings: ``[R]`` corpus indices, best first (the full ranking for the turn->session conversion).
    corpus_ids: ``[N]`` official corpus ids (the episode's item ids).
    level: ``'turn'`` or ``'session'``.
    ks: cutoffs.
  """
  if level not in ('turn', 'session'):
    raise ValueError(f"level must be 'turn' or 'session', got {level!r}")
  correct = longmemeval_correct_docs(corpus_ids)
  out: dict[str, dict[str, float]] = {'session': {}, 'turn': {}}
  for k in ks:
    s = evaluate_retrieval(rankings, correct, corpus_ids, k=k)
    out[level].update({f'recall_any@{k}': s.recall_any, f'recall_all@{k}': s.recall_all, f'ndcg_any@{k}': s.ndcg_any})
    if level == 'turn':
      s = evaluate_retrieval_turn2session(rankings, correct, corpus_ids, k=k)
      out['session'].update(
        {f'recall_any@{k}': s.recall_any, f'recall_all@{k}': s.recall_all, f'ndcg_any@{k}': s.ndcg_any}
      )
  return out


# ------------------------------------------------------------------------------------- MemoryAgentBench SubEM


_ARTICLES = re.compile(r'\b(a|an|the)\b')
_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
  """SQuAD/DrQA normalisation as MemoryAgentBench uses it: lower-case, remove punctuation (``string.punctuation``),
  replace articles ``a``/``an``/``the`` by a space, collapse whitespace."""
  text = ''.join(ch for ch in text.lower() if ch not in _PUNCT)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def substring_exact_match(prediction: str, answer: str) -> bool:
  """``normalize_answer(answer) in normalize_answer(prediction)`` (an empty normalised answer always matches, as
  upstream)."""
  return normalize_answer(answer) in normalize_answer(prediction)


def answer_list(answers: str | Sequence[str] | Sequence[Sequence[str]]) -> list[str]:
  """Upstream's gold-list handling: a string is one answer; a list of lists is flattened one level."""
  if isinstance(answers, str):
    return [answers]
  answers = list(answers)
  if answers and isinstance(answers[0], (list, tuple)):
    return [str(a) for sub in answers for a in sub]
  return [str(a) for a in answers]


def subem(prediction: str, answers: str | Sequence[str] | Sequence[Sequence[str]]) -> float:
  """SubEM: 1.0 if any acceptable answer, normalised, is a substring of the normalised prediction, else 0.0.

  Args:
    prediction: reader output.
    answers: one answer, a list of acceptable answers, or a list of such lists.

  Raises:
    ValueError: on an empty answer list (upstream's ``max`` of nothing).
  """
  golds = answer_list(answers)
  if not golds:
    raise ValueError('subem: empty answer list')
  return float(max(substring_exact_match(prediction, g) for g in golds))


def parse_output(output: str, prefix: str = 'Answer:') -> str | None:
  """MemoryAgentBench ``parse_output`` (``utils/eval_other_utils.py`` at ``455306d``): the rest of the line after the
  first ``prefix`` (case-insensitive), else the first line of the output; stripped, with one repeated leading
  ``prefix`` removed. One line only, as upstream (``.`` does not match a newline)."""
  for pattern in (
    re.compile(f'(?:{prefix})(.*)(?:\n|$)', flags=re.IGNORECASE),
    re.compile(r'(?:^)(.*)(?:\n|$)'),
  ):
    m = pattern.search(output)
    if m is not None:
      return re.sub(f'^{re.escape(prefix)}', '', m[1].strip(), flags=re.IGNORECASE).strip()
  return None


def subem_official(output: str, answers: str | Sequence[str] | Sequence[Sequence[str]]) -> float:
  """MemoryAgentBench default post-processing: max of :func:`subem` on the raw output and on its
  :func:`parse_output`."""
  raw = subem(output, answers)
  parsed = parse_output(output)
  return max(raw, subem(parsed, answers)) if parsed is not None else raw


# --------------------------------------------------------------------------- FactConsolidation retrieval ranks


def answer_in_topk(ranked_texts: Sequence[str], answers: str | Sequence[str], *, k: int) -> bool:
  """Whether any of the first ``k`` retrieved texts contains a normalised acceptable answer (SubEM per text).

  Args:
    ranked_texts: ``[R]`` texts of the retrieved facts, best first.
    answers: acceptable answers.
    k: cutoff.
  """
  golds = answer_list(answers)
  return any(substring_exact_match(t, g) for t in ranked_texts[:k] for g in golds)


def answer_in_top1(ranked_texts: Sequence[str], answers: str | Sequence[str]) -> bool:
  """:func:`answer_in_topk` at ``k = 1``."""
  return answer_in_topk(ranked_texts, answers, k=1)


def newest_outranks_superseded(
  ranked_ids: Sequence[str], *, newest: str, superseded: Collection[str], k: int | None = None
) -> bool | None:
  """Whether the newest version of the asked fact is ranked above every superseded version.

  "Versions of the asked fact" are the facts of one (subject, relation) slot, e.g. ``"X is married to A."`` (older)
  and ``"X is married to B."`` (newer); :func:`engram_jax.data.factconsolidation.asked_fact_versions` derives them
  from the relation templates. A superseded version missing from ``ranked_ids[:k]`` ranks below everything.

  Args:
    ranked_ids: ``[R]`` retrieved item ids, best first.
    newest: id of the newest (answer-bearing) version.
    superseded: ids of the other versions of the slot.
    k: optional cutoff applied to ``ranked_ids`` first.

  Returns:
    None when there is no superseded version (the question has no conflict); False when ``newest`` is not in the
    (cut) ranking; else True iff no superseded version appears before it.
  """
  if not superseded:
    return None
  ranked = list(ranked_ids if k is None else ranked_ids[:k])
  if newest not in ranked:
    return False
  before = set(ranked[: ranked.index(newest)])
  return not any(s in before for s in superseded)


# ------------------------------------------------------------------------------------------- Tier-1 readers


@runtime_checkable
class Reader(Protocol):
  """Answer-level (Tier 1) reader: question and retrieved contexts (best first) -> answer text."""

  def __call__(self, question: str, contexts: list[str]) -> str: ...


class FirstContextReader:
  """Offline reader for tests: answers with the first retrieved context (empty string when none)."""

  def __call__(self, question: str, contexts: list[str]) -> str:
    del question
    return contexts[0] if contexts else ''
