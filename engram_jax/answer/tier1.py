"""Tier 1: a reader answers from each row's retrieved items; official answer metrics; paired tests between rows.

Rows are retrievers (their top-k item ids, every row with the same k, asserted), plus ``oracle`` (the gold items
only) and ``no-context`` (nothing), which bound what the reader can do. The items go to the reader in retrieval
order, best first, as upstream's RAG paths put them (the oracle's in the gold list's order). Prompts and metrics:
:mod:`engram_jax.answer.official_qa`. Answers: :func:`answer_all`
(deduplicated prompts, the answer cache first, then batched generation with a progress bar).

Intervals: Wilson for 0/1 SubEM, percentile bootstrap for F1; paired tests between rows: paired bootstrap of the
mean difference with a sign-flip p-value (:func:`engram_jax.metrics.stats.paired_test`) and, for 0/1 metrics, exact
McNemar.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from engram_jax.answer import cache as answer_cache
from engram_jax.answer import official_qa
from engram_jax.core.types import Episode, Question
from engram_jax.metrics import stats

TASKS = ('factconsolidation', 'locomo')
ORACLE, NO_CONTEXT = 'oracle', 'no-context'
Messages = list[dict[str, str]]


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One question's prompt for one row, and what scoring it needs (``choices``: LoCoMo category 5)."""

  messages: Messages
  choices: dict[str, str] | None = None


def build_prompt(task: str, episode: Episode, question: Question, ids: Sequence[str], *, seed: int) -> Prompt:
  """The official prompt of ``task`` for ``question`` over the items ``ids``, in the given (retrieval) order."""
  from engram_jax.data.locomo import turn_text

  by_id = {it.id: it for it in episode.items}
  ordered = [by_id[i] for i in dict.fromkeys(ids)]
  if task == 'factconsolidation':
    return Prompt(official_qa.fc_messages(question.text, [(it.id, it.text) for it in ordered]))
  if task == 'locomo':
    choices = None
    if question.category == 5:
      choices = official_qa.locomo_cat5_choices(question.id, question.answer or '', seed=seed)
    context = [official_qa.locomo_turn(it.time, it.speaker or '', turn_text(it)) for it in ordered]
    return Prompt(official_qa.locomo_messages(question.text, int(question.category), context, choices), choices)
  raise ValueError(f'unknown answer task {task!r}; known: {TASKS}')


def score(task: str, reply: str, question: Question, prompt: Prompt) -> float:
  """The official per-question score of ``reply``: SubEM (FactConsolidation) or LoCoMo's category F1."""
  if task == 'factconsolidation':
    from engram_jax.data.factconsolidation import answers_of

    return official_qa.fc_score(reply, list(answers_of(question)))
  if task == 'locomo':
    cat = int(question.category)
    decoded = official_qa.locomo_decode_cat5(reply, prompt.choices) if cat == 5 else reply
    return official_qa.locomo_score(decoded, question.answer, cat)
  raise ValueError(f'unknown answer task {task!r}; known: {TASKS}')


def reply_position(reply: str, choices: dict[str, str]) -> str:
  """Which option of a category-5 question a reply picks: ``'a'`` or ``'b'``, else ``'other'``.

  A 1- or 3-character reply is read as upstream's ``get_cat_5_answer`` reads it (:func:`official_qa.locomo_decode_cat5`:
  any other 1- or 3-character reply counts as (b), as upstream scores it); a longer one picks an option when its
  first line names ``(a)`` or ``(b)`` and not the other, else when it is that option's text (case-insensitive,
  stripped of ``.``). A reply that restates both options picks neither.
  """
  pred = reply.strip().lower()
  if len(pred) in (1, 3):
    return 'a' if official_qa.locomo_decode_cat5(reply, choices) == choices['a'] else 'b'
  first = pred.split('\n')[0]
  named = [opt for opt in ('a', 'b') if f'({opt})' in first]
  if len(named) == 1:
    return named[0]
  for opt in ('a', 'b'):
    if pred.rstrip('.') == choices[opt].strip().lower().rstrip('.'):
      return opt
  return 'other'


def position_shares(replies: Sequence[str], choices: Sequence[dict[str, str]]) -> dict[str, Any]:
  """Position bias on LoCoMo's category-5 (adversarial) questions: where the correct option ("Not mentioned in the
  conversation") sits, and which position the replies pick.

  Returns:
    ``{'n', 'gold': {'a', 'b'}, 'replies': {'a', 'b', 'other'}, 'score_by_gold': {'a', 'b'}, 'both_named'}``:
    shares of the questions whose correct option is (a)/(b), shares of the replies that pick (a)/(b)/neither
    (:func:`reply_position`), the mean score (upstream's category-5 rule) of the questions with the correct option
    at (a) and at (b) (``None`` when there are none), and the share of replies that name both ``(a)`` and ``(b)``
    (such a reply restates the options, "Not mentioned" included, and upstream's rule scores it 1).

  Example:
    >>> from engram_jax.answer import position_shares
    >>> nm = 'Not mentioned in the conversation'
    >>> ch = [{'a': nm, 'b': 'Paris'}, {'a': 'Rome', 'b': nm}, {'a': 'Oslo', 'b': nm}, {'a': nm, 'b': 'Kyiv'}]
    >>> out = position_shares(['(b)', '(b)', 'b', 'I do not know'], ch)
    >>> out['gold'], out['replies'], out['score_by_gold']
    ({'a': 0.5, 'b': 0.5}, {'a': 0.0, 'b': 0.75, 'other': 0.25}, {'a': 0.0, 'b': 1.0})
  """
  if len(replies) != len(choices):
    raise ValueError(f'{len(replies)} replies for {len(choices)} questions')
  n = len(replies)
  gold = [('a' if c['a'] == official_qa.LOCOMO_NOT_MENTIONED else 'b') for c in choices]
  picked = [reply_position(r, c) for r, c in zip(replies, choices)]
  scores = [official_qa.locomo_score(official_qa.locomo_decode_cat5(r, c), None, 5) for r, c in zip(replies, choices)]

  def share(xs, v):
    return sum(x == v for x in xs) / n if n else 0.0

  by_gold = {}
  for v in ('a', 'b'):
    got = [s for s, g in zip(scores, gold) if g == v]
    by_gold[v] = sum(got) / len(got) if got else None
  return {
    'n': n,
    'gold': {v: share(gold, v) for v in ('a', 'b')},
    'replies': {v: share(picked, v) for v in ('a', 'b', 'other')},
    'score_by_gold': by_gold,
    'both_named': sum('(a)' in r.lower() and '(b)' in r.lower() for r in replies) / n if n else 0.0,
  }


@dataclasses.dataclass
class AnswerStats:
  """What one :func:`answer_all` call did (varies between runs: kept out of results.json)."""

  prompts: int = 0
  unique: int = 0
  cached: int = 0
  generated: int = 0
  seconds: float = 0.0

  @property
  def answers_per_second(self) -> float:
    return self.generated / self.seconds if self.seconds > 0 else float('nan')


def answer_all(
  prompts: Sequence[Messages],
  reader,
  cache: answer_cache.AnswerCache,
  *,
  max_new_tokens: int,
  progress: bool = True,
  desc: str = 'answering',
  longest_first: bool = False,
) -> tuple[list[str], AnswerStats]:
  """Replies to ``prompts``: each distinct prompt is answered once, from ``cache`` when stored, else generated in
  batches of ``reader.batch_size`` (prompts sorted by length, so a batch pads little; ``longest_first`` reverses the
  order) and stored right after its batch (an interrupted run resumes).

  The cache is read again before each batch, so runs that share a cache share the work: a second run of the same
  prompts with the other ``longest_first`` skips what the first has stored meanwhile (and vice versa), and both
  return the same replies."""
  keys = [answer_cache.canonical(m) for m in prompts]
  unique: dict[str, Messages] = {}
  for k, m in zip(keys, prompts):
    unique.setdefault(k, m)
  answers: dict[str, str] = {}
  todo = []
  for k, m in unique.items():
    got = cache.get(m)
    if got is None:
      todo.append(k)
    else:
      answers[k] = got
  # similar lengths share a batch: less left padding (the key is the prompt's canonical JSON)
  todo.sort(key=len, reverse=bool(longest_first))
  st = AnswerStats(prompts=len(prompts), unique=len(unique), cached=len(unique) - len(todo))
  t0 = time.perf_counter()
  if todo:
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=desc, unit='answer', disable=not progress, dynamic_ncols=True)
    size = max(1, int(getattr(reader, 'batch_size', 8)))
    at = 0
    while at < len(todo):
      chunk: list[str] = []
      while at < len(todo) and len(chunk) < size:  # stored meanwhile by another run on this cache: read, not generated
        k = todo[at]
        at += 1
        got = cache.get(unique[k])
        if got is None:
          chunk.append(k)
        else:
          answers[k] = got
          st.cached += 1
          bar.update(1)
      if not chunk:
        break
      replies = reader.generate([unique[k] for k in chunk], max_new_tokens=max_new_tokens)
      if len(replies) != len(chunk):
        raise RuntimeError(f'reader returned {len(replies)} replies for {len(chunk)} prompts')
      for k, r in zip(chunk, replies):
        cache.put(unique[k], r)
        answers[k] = r
      st.generated += len(chunk)
      bar.update(len(chunk))
    bar.close()
  st.seconds = time.perf_counter() - t0
  return [answers[k] for k in keys], st


def check_equal_k(rows: Mapping[str, Sequence[Sequence[str]]], episodes_of: Sequence[Episode], *, k: int) -> None:
  """Every retriever row gives each question ``min(k, items)`` distinct ids.

  Raises:
    ValueError: naming the row and question where it does not.
  """
  for name, per_q in rows.items():
    if len(per_q) != len(episodes_of):
      raise ValueError(f'row {name}: {len(per_q)} questions, expected {len(episodes_of)}')
    for i, (ids, ep) in enumerate(zip(per_q, episodes_of)):
      want = min(k, ep.n_items)
      if len(ids) != want or len(set(ids)) != len(ids):
        raise ValueError(
          f'row {name}, question {i}: {len(ids)} retrieved ids ({len(set(ids))} distinct), '
          f'expected {want} (equal k across rows)'
        )


def interval(values: np.ndarray, *, binary: bool, seed: int, n_resamples: int) -> stats.Interval:
  return stats.wilson_ci(values) if binary else stats.bootstrap_ci(values, seed=seed, n_resamples=n_resamples)


def paired(a: np.ndarray, b: np.ndarray, *, binary: bool, seed: int, n_resamples: int) -> dict[str, float]:
  """``a - b``: mean difference, paired-bootstrap CI and sign-flip p; exact McNemar p for 0/1 outcomes."""
  out = stats.paired_test(a, b, seed=seed, n_resamples=n_resamples).to_dict()
  if binary:
    out['mcnemar_p'] = stats.mcnemar_test(a, b)
  return out


def run_tier1(
  task: str,
  questions: Sequence[tuple[Episode, Question]],
  retrieved: Mapping[str, Sequence[Sequence[str]]],
  answer: Callable[[list[Messages]], list[str]],
  *,
  k: int,
  seed: int,
  n_resamples: int = 10_000,
  baselines: Sequence[str] = ('bm25', 'cosine'),
  tier0: Mapping[str, np.ndarray] | None = None,
  tier0_metric: str | None = None,
  tier0_more: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
  """Answer every question under every row and score it.

  Args:
    task: ``'factconsolidation'`` or ``'locomo'``.
    questions: ``[Q]`` (episode, question) pairs, the order of ``retrieved``'s lists.
    retrieved: retriever row -> ``[Q]`` top-k item ids (equal ``k`` asserted).
    answer: prompts -> replies (e.g. :func:`answer_all` bound to a reader and its cache).
    baselines: rows every other row is paired against (those present).
    tier0: optional retriever row -> ``[Q]`` Tier-0 scores (metric ``tier0_metric``) on the same questions,
      reported beside and compared with the Tier-1 ordering (:func:`ordering_note`).
    tier0_more: optional retriever row -> {metric: ``[Q]``}: further Tier-0 metrics reported beside.

  Returns:
    ``{'task', 'metric', 'n_questions', 'k', 'rows': {row: {'mean', 'lo', 'hi', 'n_contexts', 'tier0'?,
    'paired': {'vs b': {...}}}}, 'per_question': [{'id', 'category', 'replies': {row: str},
    'scores': {row: float}}]}``.
  """
  eps = [e for e, _ in questions]
  check_equal_k(retrieved, eps, k=k)
  rows: dict[str, list[list[str]]] = {NO_CONTEXT: [[] for _ in questions]}
  rows.update({n: [list(x) for x in v] for n, v in retrieved.items()})
  rows[ORACLE] = [list(q.gold) for _, q in questions]
  prompts = {
    n: [build_prompt(task, e, q, ids, seed=seed) for (e, q), ids in zip(questions, per_q)] for n, per_q in rows.items()
  }
  flat = [p.messages for n in rows for p in prompts[n]]
  replies_flat = answer(flat)
  if len(replies_flat) != len(flat):
    raise RuntimeError(f'{len(replies_flat)} replies for {len(flat)} prompts')
  replies, at = {}, 0
  for n in rows:
    replies[n] = replies_flat[at : at + len(questions)]
    at += len(questions)
  scores = {
    n: np.array([score(task, r, q, p) for r, (_, q), p in zip(replies[n], questions, prompts[n])]) for n in rows
  }
  binary = task == 'factconsolidation'
  metric = 'SubEM' if binary else 'F1'
  out_rows: dict[str, dict[str, Any]] = {}
  for n in rows:
    ci = interval(scores[n], binary=binary, seed=seed, n_resamples=n_resamples)
    entry: dict[str, Any] = {
      'mean': ci.mean,
      'lo': ci.lo,
      'hi': ci.hi,
      'n_contexts': float(np.mean([len(x) for x in rows[n]])),
    }
    if tier0 is not None and n in tier0:
      entry['tier0'] = float(np.mean(tier0[n]))
    if tier0_more is not None and n in tier0_more:
      entry['tier0_more'] = {m: float(np.mean(v)) for m, v in tier0_more[n].items()}
    entry['paired'] = {
      f'vs {b}': paired(scores[n], scores[b], binary=binary, seed=seed, n_resamples=n_resamples)
      for b in baselines
      if b in rows and b != n
    }
    out_rows[n] = entry
  cats = sorted({q.category for _, q in questions}, key=str)
  by_cat = (
    {str(c): {n: float(np.mean(scores[n][[q.category == c for _, q in questions]])) for n in rows} for c in cats}
    if len(cats) > 1
    else {}
  )
  per_q = [
    {
      'id': q.id,
      'category': q.category,
      'replies': {n: replies[n][i] for n in rows},
      'scores': {n: float(scores[n][i]) for n in rows},
    }
    for i, (_, q) in enumerate(questions)
  ]
  bias = {}
  cat5 = [i for i, (_, q) in enumerate(questions) if task == 'locomo' and q.category == 5]
  if cat5:
    for n in rows:
      bias[n] = position_shares([replies[n][i] for i in cat5], [prompts[n][i].choices for i in cat5])
  return {
    'task': task,
    'metric': metric,
    'tier0_metric': tier0_metric,
    'n_questions': len(questions),
    'k': k,
    'rows': out_rows,
    'by_category': by_cat,
    'position_bias': bias,
    'per_question': per_q,
  }


def ordering_note(t1: Mapping[str, Any]) -> list[str]:
  """Pairs of retriever rows whose order by the Tier-1 mean differs from their order by the Tier-0 mean."""
  rows = {n: v for n, v in t1['rows'].items() if 'tier0' in v}
  names = list(rows)
  notes = []
  for i, a in enumerate(names):
    for b in names[i + 1 :]:
      d0 = rows[a]['tier0'] - rows[b]['tier0']
      d1 = rows[a]['mean'] - rows[b]['mean']
      if np.sign(d0) != np.sign(d1):
        notes.append(f'{a} vs {b}: Tier 0 {d0:+.4f}, Tier 1 {d1:+.4f}')
  return notes


def markdown(t1: Mapping[str, Any], *, title: str = '', labels: Mapping[str, str] | None = None) -> str:
  """The Tier-1 table: each row's answer metric [95% CI], its Tier-0 metric on the same questions, and the paired
  differences to the baselines (delta [CI], bootstrap p; McNemar p for 0/1)."""
  labels = labels or {}
  base = sorted({b for v in t1['rows'].values() for b in v['paired']})
  m = t1['metric']
  more = list(dict.fromkeys(k for v in t1['rows'].values() for k in v.get('tier0_more', {})))
  head = (
    f'| row | contexts | {m} [95% CI] | Tier 0 {t1.get("tier0_metric") or ""} | '
    + ''.join(f'{x} | ' for x in more)
    + ' | '.join(f'{m} {b}' for b in base)
    + ' |'
  )
  lines = [
    f'### Tier 1 {title}: {t1["n_questions"]} questions, k={t1["k"]}, {m}',
    '',
    head,
    '|' + '---|' * (4 + len(more) + len(base)),
  ]
  for n, v in t1['rows'].items():
    t0 = f'{v["tier0"]:.4f}' if 'tier0' in v else 'n/a'
    t0 += ''.join(f' | {v["tier0_more"][x]:.4f}' if x in v.get('tier0_more', {}) else ' | n/a' for x in more)
    cells = []
    for b in base:
      p = v['paired'].get(b)
      if p is None:
        cells.append('')
        continue
      extra = f', McNemar p={p["mcnemar_p"]:.3g}' if 'mcnemar_p' in p else ''
      cells.append(f'{p["delta"]:+.3f} [{p["lo"]:+.3f}, {p["hi"]:+.3f}] p={p["p"]:.3g}{extra}')
    lines.append(
      f'| {labels.get(n, n)} | {v["n_contexts"]:.1f} | {v["mean"]:.3f} [{v["lo"]:.3f}, {v["hi"]:.3f}] | '
      f'{t0} | ' + ' | '.join(cells) + ' |'
    )
  notes = ordering_note(t1)
  lines += ['', 'Answer ordering vs retrieval ordering: ' + ('; '.join(notes) if notes else 'the same for every pair.')]
  if t1.get('by_category'):
    names = list(t1['rows'])
    lines += [
      '',
      f'By category ({m}):',
      '',
      '| category | ' + ' | '.join(labels.get(n, n) for n in names) + ' |',
      '|' + '---|' * (1 + len(names)),
    ]
    for c, v in t1['by_category'].items():
      lines.append(f'| {c} | ' + ' | '.join(f'{v[n]:.3f}' for n in names) + ' |')
  if t1.get('position_bias'):
    lines += [
      '',
      'Category 5 (adversarial), option positions: where the correct option ("Not mentioned") sits, which position '
      'the replies pick, and the score when the correct option is at (a) / at (b):',
      '',
      '| row | questions | correct at (a) / (b) | replies (a) / (b) / neither | score, correct at (a) / (b) | '
      'replies naming both |',
      '|---|---|---|---|---|---|',
    ]
    for n, v in t1['position_bias'].items():
      g, r, sb = v['gold'], v['replies'], v['score_by_gold']
      fmt = lambda x: 'n/a' if x is None else f'{x:.2f}'
      lines.append(
        f'| {labels.get(n, n)} | {v["n"]} | {g["a"]:.2f} / {g["b"]:.2f} | {r["a"]:.2f} / {r["b"]:.2f} / '
        f'{r["other"]:.2f} | {fmt(sb["a"])} / {fmt(sb["b"])} | {v["both_named"]:.2f} |'
      )
  return '\n'.join(lines) + '\n'
