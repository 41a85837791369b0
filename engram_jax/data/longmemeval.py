"""LongMemEval (S cleaned, oracle) loader: one episode per question, items = turns or sessions.

Files: ``<root>/longmemeval/longmemeval_s_cleaned_498of500.json.gz`` (``split='s'``) and
``<root>/longmemeval/longmemeval_oracle.json`` (``split='oracle'``); see that folder's ``SOURCE.md``.

Item ids are the official retriever's corpus ids (xiaowu0162/LongMemEval ``src/retrieval/run_retrieval.py``,
``process_item_flat_index``, commit ``b60a5b7d05fb2cf6e4d0d63948f17e294ee827c4``), so that the official metrics in
:mod:`engram_jax.official` run on item ids unchanged:

* ``level='turn'``: one item per turn of the selected roles (official: user turns only), id
  ``<session_id>_<t+1>`` where ``t`` is the turn's 0-based index among *all* turns of the session (assistant turns
  count). In an evidence session (id containing ``answer``) a turn without ``has_answer: true`` gets the id with
  ``answer`` replaced by ``noans`` (``answer_4be1b6b4_3`` -> ``noans_4be1b6b4_3``), as upstream does.
* ``level='session'``: one item per session, text = the rendered turns of the selected roles joined by one space
  (official: the user turns' contents, ``' '.join``); id = the session id, or its ``noans`` form when the session
  is an evidence session none of whose selected-role turns has ``has_answer: true``.

``Item.parent`` is always the plain session id (never renamed). Turn text comes from a ``str.format`` template with
fields ``role`` and ``content``; the default ``'{content}'`` is exactly what the official retriever embeds.

Gold:

* turn level: the items whose turn has ``has_answer: true`` (the official ``correct_docs`` for user turns);
* session level: the items of the sessions listed in ``answer_session_ids`` (some of them may carry a ``noans`` id;
  the official session-level ``correct_docs`` are only the ids still containing ``answer``, see
  :func:`engram_jax.official.longmemeval_correct_docs`).

``Question.gold_parents`` = ``answer_session_ids`` (those present in the haystack); ``category`` = ``question_type``;
``time`` = ``question_date``; ``answer`` = ``str(answer)`` (32 upstream answers are integers).

Write order: sessions are sorted by their parsed ``haystack_dates`` (stable, so same-minute sessions keep file
order); turns keep their order inside a session. Abstention questions (``_abs``) are kept: the official skip
rules are applied at the metric step (:func:`engram_jax.official.official_skip_reason`; raw-entry twin
:func:`entry_skip_reason`).

Every normalisation is counted in the :class:`~engram_jax.types.LoadReport`:

* ``haystack_out_of_order``: haystacks whose dates were not non-decreasing (then sorted);
* ``duplicate_session_dropped``: a session id repeated inside one haystack (the S file has 13, all filler with
  identical content); the earliest copy is kept, the later one dropped;
* ``empty_turn_dropped`` (when ``drop_empty``): turns whose content is blank (never evidence; raises if one is);
* ``empty_session_dropped`` / ``empty_session_kept``: sessions whose text is blank (in S: 71 filler sessions made
  of assistant turns only), dropped when ``drop_empty`` unless they are answer sessions;
* ``unknown_answer_session_id``: an ``answer_session_ids`` entry absent from the haystack (dropped);
* ``answer_int_stringified``; ``excluded_no_gold``: questions with no gold item at this level (at turn level with
  user turns only these are exactly the official "no user-side evidence" questions); ``questions_kept``;
  ``items`` (in kept episodes); ``turns_read`` (all turns of all de-duplicated haystacks); ``abstention_kept``.

Malformed input raises ``ValueError`` naming the file (bad JSON, via :func:`~engram_jax.data.io.read_json`) or the
question id (missing field, misaligned lists, bad turn, unparsable date).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, Sequence
from typing import Any

from engram_jax.data.io import dataset_file, read_json
from engram_jax.types import Episode, Item, LoadReport, Question

FILES = {'s': 'longmemeval_s_cleaned_498of500.json.gz', 'oracle': 'longmemeval_oracle.json'}
TEMPLATES = {'content': '{content}', 'role': '{role}: {content}'}
LEVELS = ('turn', 'session')
REQUIRED_FIELDS = ('question_id', 'question_type', 'question', 'answer', 'question_date', 'haystack_dates',
                   'haystack_session_ids', 'haystack_sessions', 'answer_session_ids')
DATE_FORMAT = '%Y/%m/%d (%a) %H:%M'


def read_longmemeval(root: str | os.PathLike | None = None, *, split: str = 's') -> list[dict[str, Any]]:
  """Read the raw entries of one split (``'s'`` or ``'oracle'``) as a list of dicts (a few seconds for S)."""
  if split not in FILES:
    raise ValueError(f'Unknown LongMemEval split {split!r}; known: {sorted(FILES)}')
  path = dataset_file(root, 'longmemeval', FILES[split])
  data = read_json(path)
  if not isinstance(data, list):
    raise ValueError(f'{path}: expected a JSON list of entries, got {type(data).__name__}')
  return data


def parse_haystack_date(text: str) -> datetime.datetime:
  """Parse ``'2023/05/30 (Tue) 23:40'``; raises ValueError on any other form."""
  return datetime.datetime.strptime(text, DATE_FORMAT)


def official_turn_id(session_id: str, turn_index: int, *, has_answer: bool) -> str:
  """Official turn corpus id: ``<session_id>_<turn_index+1>``, ``answer`` -> ``noans`` for non-evidence turns of
  evidence sessions (``turn_index`` is 0-based over all turns of the session)."""
  tid = f'{session_id}_{turn_index + 1}'
  if 'answer' in session_id and not has_answer:
    tid = tid.replace('answer', 'noans')
  return tid


def official_session_id(session_id: str, *, has_answer: bool) -> str:
  """Official session corpus id: the session id, ``answer`` -> ``noans`` when no indexed turn has the answer."""
  if 'answer' in session_id and not has_answer:
    return session_id.replace('answer', 'noans')
  return session_id


def entry_skip_reason(entry: Mapping[str, Any]) -> str | None:
  """The official retrieval skip rule on a raw entry: ``'abstention'`` if ``'_abs'`` is in the question id,
  ``'no_user_evidence'`` if no user turn of the haystack has ``has_answer: true``, else None.

  Mirrors the averaging loop of upstream ``run_retrieval.py`` (commit ``b60a5b7d``); the id-based twin used at the
  metric step is :func:`engram_jax.official.official_skip_reason`.
  """
  if '_abs' in entry['question_id']:
    return 'abstention'
  if not any(t.get('has_answer') for s in entry['haystack_sessions'] for t in s if t.get('role') == 'user'):
    return 'no_user_evidence'
  return None


def _check_entry(entry: Any, e_i: int) -> str:
  if not isinstance(entry, Mapping):
    raise ValueError(f'LongMemEval entry {e_i}: expected an object, got {type(entry).__name__}')
  qid = entry.get('question_id', f'<entry {e_i}>')
  missing = [f for f in REQUIRED_FIELDS if f not in entry]
  if missing:
    raise ValueError(f'LongMemEval question {qid}: missing fields {missing}')
  n = len(entry['haystack_session_ids'])
  if len(entry['haystack_dates']) != n or len(entry['haystack_sessions']) != n:
    raise ValueError(f'LongMemEval question {qid}: haystack_session_ids/dates/sessions have lengths '
                     f'{n}/{len(entry["haystack_dates"])}/{len(entry["haystack_sessions"])}')
  return qid


def _check_turn(turn: Any, qid: str, sid: str, t_i: int) -> tuple[str, str, bool | None]:
  if not isinstance(turn, Mapping) or 'role' not in turn or 'content' not in turn:
    raise ValueError(f'LongMemEval question {qid}: session {sid} turn {t_i} lacks role/content')
  role, content, has = turn['role'], turn['content'], turn.get('has_answer')
  if not isinstance(content, str) or not isinstance(role, str):
    raise ValueError(f'LongMemEval question {qid}: session {sid} turn {t_i} has non-string role/content')
  if has is not None and not isinstance(has, bool):
    raise ValueError(f'LongMemEval question {qid}: session {sid} turn {t_i} has_answer={has!r} is not a bool')
  return role, content, has


def ordered_sessions(entry: Mapping[str, Any], qid: str,
                     report: LoadReport) -> list[tuple[str, str, list[Any]]]:
  """``(session_id, date, turns)`` sorted by parsed date (stable), duplicates dropped; counts in ``report``."""
  sessions = list(zip(entry['haystack_session_ids'], entry['haystack_dates'], entry['haystack_sessions']))
  try:
    keys = [parse_haystack_date(d) for _, d, _ in sessions]
  except (TypeError, ValueError) as e:
    raise ValueError(f'LongMemEval question {qid}: unparsable haystack date ({e})') from e
  if any(b < a for a, b in zip(keys, keys[1:])):
    report.add('haystack_out_of_order', qid)
  order = sorted(range(len(sessions)), key=keys.__getitem__)
  out, seen = [], set()
  for i in order:
    sid, date, turns = sessions[i]
    if not isinstance(turns, list):
      raise ValueError(f'LongMemEval question {qid}: session {sid} is {type(turns).__name__}, expected a list')
    if sid in seen:
      report.add('duplicate_session_dropped', (qid, sid, date))
      continue
    seen.add(sid)
    out.append((sid, date, turns))
  return out


def _turn_items(sessions: list[tuple[str, str, list[Any]]], qid: str, *, template: str, roles: Sequence[str],
                drop_empty: bool, report: LoadReport) -> tuple[list[Item], list[str]]:
  items: list[Item] = []
  gold: list[str] = []
  for sid, date, turns in sessions:
    for t_i, turn in enumerate(turns):
      role, content, has = _check_turn(turn, qid, sid, t_i)
      if role not in roles:
        continue
      if drop_empty and not content.strip():
        if has:
          raise ValueError(f'LongMemEval question {qid}: empty turn {sid}[{t_i}] is marked has_answer')
        report.add('empty_turn_dropped', (qid, sid, t_i, role))
        continue
      iid = official_turn_id(sid, t_i, has_answer=bool(has))
      items.append(Item(id=iid, text=template.format(role=role, content=content), parent=sid,
                        position=len(items), time=date, speaker=role))
      if has:
        gold.append(iid)
  return items, gold


def _session_items(sessions: list[tuple[str, str, list[Any]]], qid: str, *, template: str, roles: Sequence[str],
                   answer_sessions: set[str], drop_empty: bool, report: LoadReport) -> tuple[list[Item], list[str]]:
  items: list[Item] = []
  gold: list[str] = []
  for sid, date, turns in sessions:
    parts, has_any = [], False
    for t_i, turn in enumerate(turns):
      role, content, has = _check_turn(turn, qid, sid, t_i)
      if role in roles:
        parts.append(template.format(role=role, content=content))
        has_any = has_any or bool(has)
    text = ' '.join(parts)
    if not text.strip():
      if drop_empty and sid not in answer_sessions:
        report.add('empty_session_dropped', (qid, sid))
        continue
      report.add('empty_session_kept', (qid, sid))
    iid = official_session_id(sid, has_answer=has_any)
    items.append(Item(id=iid, text=text, parent=sid, position=len(items), time=date, speaker=None))
    if sid in answer_sessions:
      gold.append(iid)
  return items, gold


def episode_from_entry(entry: Mapping[str, Any], *, level: str = 'turn', template: str = 'content',
                       roles: Sequence[str] = ('user',), drop_empty: bool = True,
                       report: LoadReport | None = None, e_i: int = 0) -> Episode | None:
  """One raw entry -> an :class:`Episode` with one question, or None when the question has no gold at ``level``.

  Args: as :func:`load_longmemeval`; ``report`` collects the counts (a fresh one when None).
  """
  if level not in LEVELS:
    raise ValueError(f'level must be one of {LEVELS}, got {level!r}')
  report = report if report is not None else LoadReport('longmemeval')
  template = TEMPLATES.get(template, template)
  roles = tuple(roles)
  qid = _check_entry(entry, e_i)
  sessions = ordered_sessions(entry, qid, report)
  present = {sid for sid, _, _ in sessions}
  answer_sessions = []
  for sid in entry['answer_session_ids']:
    if sid in present:
      answer_sessions.append(sid)
    else:
      report.add('unknown_answer_session_id', (qid, sid))
  if level == 'turn':
    items, gold = _turn_items(sessions, qid, template=template, roles=roles, drop_empty=drop_empty, report=report)
  else:
    items, gold = _session_items(sessions, qid, template=template, roles=roles,
                                 answer_sessions=set(answer_sessions), drop_empty=drop_empty, report=report)
  report.add('turns_read', n=sum(len(turns) for _, _, turns in sessions))
  if not gold:
    report.add('excluded_no_gold', (qid, entry['question_type']))
    return None
  report.add('items', n=len(items))
  answer = entry['answer']
  if not isinstance(answer, str):
    report.add('answer_int_stringified', (qid, answer))
  if '_abs' in qid:
    report.add('abstention_kept', qid)
  report.add('questions_kept')
  question = Question(id=qid, text=entry['question'], gold=tuple(gold), gold_parents=tuple(answer_sessions),
                      category=entry['question_type'], answer=str(answer), time=entry['question_date'])
  return Episode(id=qid, items=tuple(items), questions=(question,))


def episodes_from_entries(entries: Sequence[Mapping[str, Any]], *, level: str = 'turn', template: str = 'content',
                          roles: Sequence[str] = ('user',), drop_empty: bool = True,
                          dataset: str = 'longmemeval_s') -> tuple[list[Episode], LoadReport]:
  """Raw entries (from :func:`read_longmemeval`) -> ``(episodes, report)``; see :func:`load_longmemeval`."""
  report = LoadReport(f'{dataset}/{level}')
  episodes = []
  seen: set[str] = set()
  for e_i, entry in enumerate(entries):
    ep = episode_from_entry(entry, level=level, template=template, roles=roles, drop_empty=drop_empty,
                            report=report, e_i=e_i)
    qid = entry['question_id']
    if qid in seen:
      raise ValueError(f'LongMemEval question {qid}: duplicate question id')
    seen.add(qid)
    if ep is not None:
      episodes.append(ep)
  return episodes, report


def load_longmemeval(root: str | os.PathLike | None = None, *, split: str = 's', level: str = 'turn',
                     template: str = 'content', roles: Sequence[str] = ('user',),
                     drop_empty: bool = True) -> tuple[list[Episode], LoadReport]:
  """Load LongMemEval as one :class:`Episode` per question.

  Args:
    root: data root (see :func:`engram_jax.data.io.resolve_data_root`).
    split: ``'s'`` (498-question S cleaned copy) or ``'oracle'`` (500 questions, evidence sessions only).
    level: ``'turn'`` or ``'session'`` items (see the module docstring for ids, text and gold).
    template: a key of :data:`TEMPLATES` or a ``str.format`` template with ``role`` and ``content``; the default
      ``'content'`` (``'{content}'``) is what the official retriever embeds.
    roles: which turns become items (turn level) or session text (session level); ``('user',)`` is official.
    drop_empty: drop blank turns / sessions with blank text (counted; the official corpus keeps them as empty
      documents; they can hold no evidence).

  Returns:
    ``(episodes, report)``; episode id = question id; questions without gold at this level are excluded.
  """
  entries = read_longmemeval(root, split=split)
  return episodes_from_entries(entries, level=level, template=template, roles=roles, drop_empty=drop_empty,
                               dataset=f'longmemeval_{split}')
