"""LongMemEval (S cleaned, oracle) loader: one episode per question, items = turns or sessions.

Files: ``<root>/longmemeval/longmemeval_s_cleaned.json`` (upstream's name, also gzipped) or our 498-question copy
``longmemeval_s_cleaned_498of500.json.gz`` (``split='s'``) and
``<root>/longmemeval/longmemeval_oracle.json`` (``split='oracle'``); see that folder's ``SOURCE.md``.

Item ids are the official retriever's corpus ids (xiaowu0162/LongMemEval ``src/retrieval/run_retrieval.py``,
``process_item_flat_index``, commit ``b60a5b7d05fb2cf6e4d0d63948f17e294ee827c4``), so that the official metrics in
:mod:`engram_jax.metrics.official` run on item ids unchanged:

* ``level='turn'``: one item per turn of the selected roles (official: user turns only), id
  ``<session_id>_<t+1>`` where ``t`` is the turn's 0-based index among *all* turns of the session (assistant turns
  count). In an evidence session (id containing ``answer``) a turn without ``has_answer: true`` gets the id with
  ``answer`` replaced by ``noans`` (``answer_4be1b6b4_3`` -> ``noans_4be1b6b4_3``), as upstream does.
* ``level='session'``: one item per session, text = the rendered turns of the selected roles joined by one space
  (official: the user turns' contents, ``' '.join``); id = the session id, or its ``noans`` form when the session
  is an evidence session none of whose selected-role turns has ``has_answer: true``.

``Item.parent`` is always the plain session id (never renamed). Turn text comes from a ``str.format`` template with
fields ``role`` and ``content``; the default ``'{content}'`` is exactly what the official retriever embeds.

Gold, at both levels, is exactly upstream's ``correct_docs = list(set(doc_id for doc_id in corpus_ids if "answer" in
doc_id))`` (:func:`engram_jax.metrics.official.longmemeval_correct_docs`): the items whose official id contains ``answer``.

* turn level: the selected turns with ``has_answer: true`` in sessions whose id contains ``answer`` (a
  ``has_answer`` turn elsewhere is not gold upstream either; counted as ``has_answer_turn_not_gold``);
* session level: the sessions whose id contains ``answer`` and that have a selected-role turn with ``has_answer:
  true``. An ``answer_session_ids`` session none of whose selected-role turns has the answer gets the ``noans`` id
  and is *not* gold (counted as ``answer_session_not_gold_noans``; in S 94 evidence sessions have no
  ``has_answer: true`` turn at all, and some have it on the assistant side only).

A question with no gold at its level is excluded (``excluded_no_gold``): with user turns these are exactly the
questions upstream skips as having no user-side evidence, at both levels.

``gold='answer_sessions'`` (not the official definition: the memory packages' headline protocol, see
:func:`engram_jax.metrics.boundary.field_session_recall_any_at` and ``conf/dataset/longmemeval_s_field.yaml``)
takes the gold from ``answer_session_ids`` instead: every item of an answer session present in the haystack is
gold (at session level the answer sessions themselves, ``noans`` ids included; at turn level all their selected-role
turns), so no question is excluded for want of gold (all 498 of our copy at both levels). The questions the official
definition would have excluded are counted as ``kept_without_official_gold``. ``Question.gold_parents`` =
``answer_session_ids`` present in the haystack (``noans`` ones included; used by the parent-level metrics);
``category`` = ``question_type``; ``time`` = ``question_date``; ``answer`` = ``str(answer)`` (32 upstream answers
are integers).

Corpus (``corpus=``):

* ``'official'`` (the default, and the corpus the official metrics are defined on): upstream's corpus. Blank turns
  and sessions without (non-blank) user text stay as empty documents (an empty text still embeds, and scores 0
  under BM25); a session id repeated inside one haystack is kept, each later copy (in write order) with the id
  ``<official id>#dup<n>`` (``n = 1, 2, ...``; :class:`~engram_jax.core.types.Episode` needs unique item ids). Upstream
  keeps such copies under the same id; the copies are never gold, so the official metrics are unchanged
  (``evaluate_retrieval_turn2session`` maps ``<sid>_<t>#dup1`` to ``<sid>`` as upstream). A repeated session that
  would be gold raises ``ValueError`` (upstream would count every copy as relevant); S has none (its 13 repeats are
  all filler with identical content).
* ``'clean'``: blank turns are dropped, sessions with blank text are dropped unless they are answer sessions, and
  only the earliest copy of a repeated session is kept.

Write order: sessions are sorted by their parsed ``haystack_dates`` (stable, so same-minute sessions keep file
order); turns keep their order inside a session. Upstream ranks the sessions in file order; the order only matters
for write positions (recency) and for breaking exact score ties. Abstention questions (``_abs``) are kept: the
official skip rules are applied at the metric step (:func:`engram_jax.metrics.official.official_skip_reason`; raw-entry
twin :func:`entry_skip_reason`).

Every normalisation is counted in the :class:`~engram_jax.core.types.LoadReport`:

* ``haystack_out_of_order``: haystacks whose dates were not non-decreasing (then sorted);
* ``duplicate_session_kept`` (``'official'``) / ``duplicate_session_dropped`` (``'clean'``): a later copy of a
  session id repeated inside one haystack (the S file has 13);
* ``empty_turn_kept`` (``'official'``) / ``empty_turn_dropped`` (``'clean'``; raises if a blank turn is evidence):
  turns whose content is blank;
* ``empty_session_kept`` / ``empty_session_dropped``: sessions whose text is blank (in S: 71 filler sessions made
  of assistant turns only); with ``'clean'`` dropped unless they are answer sessions;
* ``answer_session_not_gold_noans`` (session level): an answer session whose id became ``noans``;
  ``answer_session_not_gold_id``: an answer session whose id lacks ``answer``; ``gold_session_not_listed``: a gold
  session missing from ``answer_session_ids``; ``has_answer_turn_not_gold`` (turn level, see above);
* ``unknown_answer_session_id``: an ``answer_session_ids`` entry absent from the haystack (dropped);
  ``duplicate_answer_session_id``: a repeat of an earlier ``answer_session_ids`` entry (dropped, so
  ``gold_parents`` lists each session once; the real files have none);
* ``answer_int_stringified``; ``excluded_no_gold``; ``questions_kept``; ``items`` (in kept episodes);
  ``turns_read`` (all turns of all kept session copies); ``abstention_kept``.

Measured on S at session level (all 498 entries): ``excluded_no_gold`` 71 (427 episodes, of which 9 abstention,
so 418 questions are scored, as upstream), ``answer_session_not_gold_noans`` 144; ``'official'``:
``duplicate_session_kept`` 13, ``empty_session_kept`` 71, 20313 items; ``'clean'``: ``duplicate_session_dropped`` 13,
``empty_session_dropped`` 71, 20241 items.

Malformed input raises a one-line ``ValueError`` naming the file (bad JSON, via
:func:`~engram_jax.data.io.read_json`), or the question id and the field with the type found and the type expected
(e.g. ``LongMemEval question q1: haystack_dates is int, expected a list``); the entry index stands in for the id
when the entry is not an object or its ``question_id`` is not a non-blank string. Checked: missing fields; a
``question_id``, ``question`` or ``question_type`` that is not a non-blank string; a ``question_date`` that is not
a string in the haystack date format; an ``answer`` that is not a string or an integer; ``haystack_session_ids`` /
``haystack_dates`` / ``haystack_sessions`` / ``answer_session_ids`` that are not lists, or of different lengths
(the three haystack lists); a session id that is not a non-blank string; a haystack date or ``answer_session_ids``
entry that is not a string; an unparsable haystack date; a session that is not a list; a turn that is not an object
with string ``role`` and ``content`` and a bool (or absent / null) ``has_answer``; a repeated question id.
"""

from __future__ import annotations

import datetime
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engram_jax.core.errors import DataNotFoundError, EngramError
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data.io import HOW_TO_GET, check_template, dataset_file, read_json, resolve_data_root, type_name
from engram_jax.metrics import boundary, official

FILES = {'s': 'longmemeval_s_cleaned_498of500.json.gz', 'oracle': 'longmemeval_oracle.json'}
# the file names looked for under <root>/longmemeval/, first found wins: upstream's names (plain or gzipped), then
# our 498-question copy
NAMES = {
  's': ('longmemeval_s_cleaned.json', 'longmemeval_s_cleaned.json.gz', FILES['s']),
  'oracle': (FILES['oracle'], 'longmemeval_oracle.json.gz'),
}
TEMPLATES = {'content': '{content}', 'role': '{role}: {content}'}
FIELDS = ('role', 'content')  # the fields a turn's template may name (str.format)
LEVELS = ('turn', 'session')
CORPORA = ('official', 'clean')
GOLDS = ('official', 'answer_sessions')
REQUIRED_FIELDS = (
  'question_id',
  'question_type',
  'question',
  'answer',
  'question_date',
  'haystack_dates',
  'haystack_session_ids',
  'haystack_sessions',
  'answer_session_ids',
)
DATE_FORMAT = '%Y/%m/%d (%a) %H:%M'


def find_file(root: str | os.PathLike | None, split: str, file: str | os.PathLike | None = None) -> Path:
  """The file of ``split``: ``file`` when given (absolute, or relative to ``<root>/longmemeval/``), else the first
  of :data:`NAMES` present (upstream's ``longmemeval_s_cleaned.json``, gzipped or not, or our 498-question copy)."""
  if split not in FILES:
    raise EngramError(f'Unknown LongMemEval split {split!r}; known: {sorted(FILES)}')
  if file is not None:
    path = Path(file)
    return path if path.is_absolute() and path.is_file() else dataset_file(root, 'longmemeval', str(file))
  for name in NAMES[split]:
    try:
      return dataset_file(root, 'longmemeval', name)
    except FileNotFoundError:
      continue
  folder = resolve_data_root(root) / 'longmemeval'
  raise DataNotFoundError(
    f'no LongMemEval {split} file in {folder} (looked for {", ".join(NAMES[split])}). {HOW_TO_GET["longmemeval"]}'
  )


def read_longmemeval(
  root: str | os.PathLike | None = None, *, split: str = 's', file: str | os.PathLike | None = None
) -> list[dict[str, Any]]:
  """Read the raw entries of one split (``'s'`` or ``'oracle'``) as a list of dicts (a few seconds for S); the file
  is :func:`find_file`'s."""
  path = find_file(root, split, file)
  data = read_json(path)
  if not isinstance(data, list):
    raise EngramError(f'{path}: expected a JSON list of entries, got {type(data).__name__}')
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
  metric step is :func:`engram_jax.metrics.official.official_skip_reason`. A malformed entry raises ``ValueError`` as in
  :func:`episode_from_entry`.
  """
  qid = _check_entry(entry, 0)
  sessions = ordered_sessions(entry, qid, LoadReport('longmemeval'))
  turns = [_check_turn(turn, qid, sid, t_i) for sid, _, _, ts in sessions for t_i, turn in enumerate(ts)]
  if '_abs' in qid:
    return 'abstention'
  if not any(has for role, _, has in turns if role == 'user'):
    return 'no_user_evidence'
  return None


def _text(value: Any, where: str, field: str) -> str:
  """``value`` when it is a non-blank string; else a one-line ValueError naming ``where`` and ``field``."""
  if not isinstance(value, str):
    raise EngramError(f'{where}: {field} is {type_name(value)}, expected a non-blank string')
  if not value.strip():
    raise EngramError(f'{where}: {field} is blank, expected a non-blank string')
  return value


def _list(value: Any, where: str, field: str) -> list[Any]:
  if not isinstance(value, list):
    raise EngramError(f'{where}: {field} is {type_name(value)}, expected a list')
  return value


def _check_entry(entry: Any, e_i: int) -> str:
  """The entry's question id after checking every field the loader reads above turn level (types, blanks, list
  lengths); ValueError naming the question id (the entry index when the id itself is missing or bad)."""
  if not isinstance(entry, Mapping):
    raise EngramError(f'LongMemEval entry {e_i}: expected an object, got {type_name(entry)}')
  if 'question_id' in entry:
    qid = _text(entry['question_id'], f'LongMemEval entry {e_i}', 'question_id')
  else:
    qid = f'<entry {e_i}>'
  missing = [f for f in REQUIRED_FIELDS if f not in entry]
  if missing:
    raise EngramError(f'LongMemEval question {qid}: missing fields {missing}')
  where = f'LongMemEval question {qid}'
  for field in ('question', 'question_type'):
    _text(entry[field], where, field)
  if not isinstance(entry['question_date'], str):
    raise EngramError(f'{where}: question_date is {type_name(entry["question_date"])}, expected a string')
  try:
    parse_haystack_date(entry['question_date'])
  except ValueError as e:
    raise EngramError(f'{where}: unparsable question_date ({e})') from e
  answer = entry['answer']
  if not isinstance(answer, (str, int)) or isinstance(answer, bool):
    raise EngramError(f'{where}: answer is {type_name(answer)}, expected a string or an integer')
  sids = _list(entry['haystack_session_ids'], where, 'haystack_session_ids')
  dates = _list(entry['haystack_dates'], where, 'haystack_dates')
  sessions = _list(entry['haystack_sessions'], where, 'haystack_sessions')
  if len(dates) != len(sids) or len(sessions) != len(sids):
    raise EngramError(
      f'{where}: haystack_session_ids/dates/sessions have lengths {len(sids)}/{len(dates)}/{len(sessions)}'
    )
  for i, sid in enumerate(sids):
    _text(sid, where, f'haystack_session_ids entry {i}')
  for i, date in enumerate(dates):
    if not isinstance(date, str):
      raise EngramError(f'{where}: haystack_dates entry {i} is {type_name(date)}, expected a string')
  for i, sid in enumerate(_list(entry['answer_session_ids'], where, 'answer_session_ids')):
    if not isinstance(sid, str):
      raise EngramError(f'{where}: answer_session_ids entry {i} is {type_name(sid)}, expected a string')
  return qid


def _check_turn(turn: Any, qid: str, sid: str, t_i: int) -> tuple[str, str, bool | None]:
  if not isinstance(turn, Mapping) or 'role' not in turn or 'content' not in turn:
    raise EngramError(f'LongMemEval question {qid}: session {sid} turn {t_i} lacks role/content')
  role, content, has = turn['role'], turn['content'], turn.get('has_answer')
  if not isinstance(content, str) or not isinstance(role, str):
    raise EngramError(f'LongMemEval question {qid}: session {sid} turn {t_i} has non-string role/content')
  if has is not None and not isinstance(has, bool):
    raise EngramError(f'LongMemEval question {qid}: session {sid} turn {t_i} has_answer={has!r} is not a bool')
  return role, content, has


def ordered_sessions(
  entry: Mapping[str, Any], qid: str, report: LoadReport, *, corpus: str = 'official'
) -> list[tuple[str, int, str, list[Any]]]:
  """``(session_id, copy, date, turns)`` sorted by parsed date (stable); counts in ``report``.

  ``copy`` numbers the repeats of a session id in write order (0 for the first). ``corpus='official'`` keeps every
  repeat (counted as ``duplicate_session_kept``), ``'clean'`` drops them (``duplicate_session_dropped``).
  """
  sessions = list(zip(entry['haystack_session_ids'], entry['haystack_dates'], entry['haystack_sessions']))
  try:
    keys = [parse_haystack_date(d) for _, d, _ in sessions]
  except (TypeError, ValueError) as e:
    raise EngramError(f'LongMemEval question {qid}: unparsable haystack date ({e})') from e
  if any(b < a for a, b in zip(keys, keys[1:])):
    report.add('haystack_out_of_order', qid)
  order = sorted(range(len(sessions)), key=keys.__getitem__)
  out = []
  seen: Counter[str] = Counter()
  for i in order:
    sid, date, turns = sessions[i]
    if not isinstance(turns, list):
      raise EngramError(f'LongMemEval question {qid}: session {sid} is {type(turns).__name__}, expected a list')
    copy = seen[sid]
    seen[sid] += 1
    if copy:
      if corpus == 'clean':
        report.add('duplicate_session_dropped', (qid, sid, date))
        continue
      report.add('duplicate_session_kept', (qid, sid, date))
    out.append((sid, copy, date, turns))
  return out


def _copy_id(iid: str, copy: int, qid: str, sid: str) -> str:
  """``iid`` for the first copy of a session, ``<iid>#dup<copy>`` for a repeat; a repeat may not be gold."""
  if not copy:
    return iid
  if 'answer' in iid:
    raise EngramError(
      f'LongMemEval question {qid}: evidence session {sid} is repeated in the haystack; upstream '
      f'would count every copy of {iid} as relevant, which unique item ids cannot express '
      "(load with corpus='clean' to drop the repeat)"
    )
  return f'{iid}#dup{copy}'


def _turn_items(
  sessions: list[tuple[str, int, str, list[Any]]],
  qid: str,
  *,
  template: str,
  roles: Sequence[str],
  corpus: str,
  report: LoadReport,
) -> tuple[list[Item], list[str]]:
  items: list[Item] = []
  gold: list[str] = []
  for sid, copy, date, turns in sessions:
    for t_i, turn in enumerate(turns):
      role, content, has = _check_turn(turn, qid, sid, t_i)
      if role not in roles:
        continue
      if not content.strip():
        if corpus == 'clean':
          if has:
            raise EngramError(f'LongMemEval question {qid}: empty turn {sid}[{t_i}] is marked has_answer')
          report.add('empty_turn_dropped', (qid, sid, t_i, role))
          continue
        report.add('empty_turn_kept', (qid, sid, t_i, role))
      iid = _copy_id(official_turn_id(sid, t_i, has_answer=bool(has)), copy, qid, sid)
      items.append(
        Item(
          id=iid,
          text=template.format(role=role, content=content),
          parent=sid,
          position=len(items),
          time=date,
          speaker=role,
        )
      )
      if 'answer' in iid:
        gold.append(iid)
      elif has and not copy:
        report.add('has_answer_turn_not_gold', (qid, sid, t_i))
  return items, gold


def _session_items(
  sessions: list[tuple[str, int, str, list[Any]]],
  qid: str,
  *,
  template: str,
  roles: Sequence[str],
  answer_sessions: set[str],
  corpus: str,
  report: LoadReport,
) -> tuple[list[Item], list[str]]:
  items: list[Item] = []
  gold: list[str] = []
  for sid, copy, date, turns in sessions:
    parts, has_any = [], False
    for t_i, turn in enumerate(turns):
      role, content, has = _check_turn(turn, qid, sid, t_i)
      if role in roles:
        parts.append(template.format(role=role, content=content))
        has_any = has_any or bool(has)
    text = ' '.join(parts)
    if not text.strip():
      if corpus == 'clean' and sid not in answer_sessions:
        report.add('empty_session_dropped', (qid, sid))
        continue
      report.add('empty_session_kept', (qid, sid))
    iid = _copy_id(official_session_id(sid, has_answer=has_any), copy, qid, sid)
    items.append(Item(id=iid, text=text, parent=sid, position=len(items), time=date, speaker=None))
    if 'answer' in iid:
      gold.append(iid)
      if sid not in answer_sessions:
        report.add('gold_session_not_listed', (qid, sid))
    elif sid in answer_sessions and not copy:
      reason = 'answer_session_not_gold_noans' if 'answer' in sid else 'answer_session_not_gold_id'
      report.add(reason, (qid, sid))
  return items, gold


def episode_from_entry(
  entry: Mapping[str, Any],
  *,
  level: str = 'turn',
  template: str = 'content',
  roles: Sequence[str] = ('user',),
  corpus: str = 'official',
  gold: str = 'official',
  report: LoadReport | None = None,
  e_i: int = 0,
) -> Episode | None:
  """One raw entry -> an :class:`Episode` with one question, or None when the question has no gold at ``level``.

  Args: as :func:`load_longmemeval`; ``report`` collects the counts (a fresh one when None).
  """
  if level not in LEVELS:
    raise EngramError(f'level must be one of {LEVELS}, got {level!r}')
  if corpus not in CORPORA:
    raise EngramError(f'corpus must be one of {CORPORA}, got {corpus!r}')
  if gold not in GOLDS:
    raise EngramError(f'gold must be one of {GOLDS}, got {gold!r}')
  report = report if report is not None else LoadReport('longmemeval')
  template = check_template(template, names=TEMPLATES, fields=FIELDS, where='LongMemEval')
  roles = tuple(roles)
  qid = _check_entry(entry, e_i)
  sessions = ordered_sessions(entry, qid, report, corpus=corpus)
  present = {sid for sid, _, _, _ in sessions}
  answer_sessions = []
  for sid in entry['answer_session_ids']:
    if sid in answer_sessions:
      report.add('duplicate_answer_session_id', (qid, sid))
    elif sid in present:
      answer_sessions.append(sid)
    else:
      report.add('unknown_answer_session_id', (qid, sid))
  if level == 'turn':
    items, gold_ids = _turn_items(sessions, qid, template=template, roles=roles, corpus=corpus, report=report)
  else:
    items, gold_ids = _session_items(
      sessions, qid, template=template, roles=roles, answer_sessions=set(answer_sessions), corpus=corpus, report=report
    )
  report.add('turns_read', n=sum(len(turns) for _, _, _, turns in sessions))
  if gold == 'answer_sessions':  # the field's protocol: every item of an answer session (no repeat is one)
    if not gold_ids:
      report.add('kept_without_official_gold', (qid, entry['question_type']))
    gold_ids = [it.id for it in items if it.parent in set(answer_sessions)]
  if not gold_ids:
    report.add('excluded_no_gold', (qid, entry['question_type']))
    return None
  report.add('items', n=len(items))
  answer = entry['answer']
  if not isinstance(answer, str):
    report.add('answer_int_stringified', (qid, answer))
  if '_abs' in qid:
    report.add('abstention_kept', qid)
  report.add('questions_kept')
  question = Question(
    id=qid,
    text=entry['question'],
    gold=tuple(gold_ids),
    gold_parents=tuple(answer_sessions),
    category=entry['question_type'],
    answer=str(answer),
    time=entry['question_date'],
  )
  return Episode(id=qid, items=tuple(items), questions=(question,))


def episodes_from_entries(
  entries: Sequence[Mapping[str, Any]],
  *,
  level: str = 'turn',
  template: str = 'content',
  roles: Sequence[str] = ('user',),
  corpus: str = 'official',
  gold: str = 'official',
  dataset: str = 'longmemeval_s',
) -> tuple[list[Episode], LoadReport]:
  """Raw entries (from :func:`read_longmemeval`) -> ``(episodes, report)``; see :func:`load_longmemeval`."""
  if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)):
    raise EngramError(f'LongMemEval entries are {type_name(entries)}, expected a list of entries')
  report = LoadReport(f'{dataset}/{level}')
  episodes = []
  seen: set[str] = set()
  for e_i, entry in enumerate(entries):
    ep = episode_from_entry(
      entry, level=level, template=template, roles=roles, corpus=corpus, gold=gold, report=report, e_i=e_i
    )
    qid = entry['question_id']
    if qid in seen:
      raise EngramError(f'LongMemEval question {qid}: duplicate question id')
    seen.add(qid)
    if ep is not None:
      episodes.append(ep)
  return episodes, report


def load_longmemeval(
  root: str | os.PathLike | None = None,
  *,
  split: str = 's',
  level: str = 'turn',
  template: str = 'content',
  roles: Sequence[str] = ('user',),
  corpus: str = 'official',
  file: str | os.PathLike | None = None,
  gold: str = 'official',
) -> tuple[list[Episode], LoadReport]:
  """Load LongMemEval as one :class:`Episode` per question.

  Args:
    root: data root (see :func:`engram_jax.data.io.resolve_data_root`).
    split: ``'s'`` (S cleaned: upstream's 500-question file or our 498-question copy) or ``'oracle'`` (500
      questions, evidence sessions only).
    level: ``'turn'`` or ``'session'`` items (see the module docstring for ids, text and gold).
    template: a key of :data:`TEMPLATES` or a ``str.format`` template with ``role`` and ``content``; the default
      ``'content'`` (``'{content}'``) is what the official retriever embeds.
    roles: which turns become items (turn level) or session text (session level); ``('user',)`` is official.
    corpus: ``'official'`` (the default, and the one the official metrics are defined on): upstream's corpus,
      blank turns / sessions kept as (empty) documents and repeated sessions kept (later copies get
      ``#dup<n>`` ids, never gold); ``'clean'``: blank turns / non-evidence sessions and repeated sessions dropped.
      Both are counted in the report (see the module docstring).
    file: the file to read (absolute, or relative to ``<root>/longmemeval/``); default :func:`find_file`'s.
    gold: ``'official'`` (the default: upstream's ``correct_docs``, questions without such gold excluded) or
      ``'answer_sessions'`` (the field's headline protocol, not the official one: every item of an
      ``answer_session_ids`` session is gold and no question is excluded for want of gold; see the module
      docstring).

  Returns:
    ``(episodes, report)``; episode id = question id; questions without gold at this level are excluded.

  Example:
    >>> from engram_jax.data import load_longmemeval
    >>> episodes, report = load_longmemeval(level='session')  # needs the data root (README, Data)
    >>> len(episodes) > 400, len(episodes[0].questions)
    (True, 1)
  """
  check_template(template, names=TEMPLATES, fields=FIELDS, where='LongMemEval')  # before reading the file
  path = find_file(root, split, file)
  entries = read_longmemeval(root, split=split, file=path)
  episodes, report = episodes_from_entries(
    entries, level=level, template=template, roles=roles, corpus=corpus, gold=gold, dataset=f'longmemeval_{split}'
  )
  report.read_ids = frozenset(str(e['question_id']) for e in entries)
  report.source = source_name(root, path)
  return episodes, report


def source_name(root: str | os.PathLike | None, path: Path) -> str:
  """``path`` relative to the data root (``longmemeval/longmemeval_s_cleaned.json``) when it is under it, else the
  absolute path: which file a run read, recorded in its load report (with both present, upstream's wins)."""
  path = Path(path).resolve()
  try:
    return str(path.relative_to(resolve_data_root(root).resolve()))
  except (ValueError, FileNotFoundError):
    return str(path)


def _turn2session(ep: Episode, ranked: list[int], k: int) -> official.RetrievalScores:
  """Upstream ``evaluate_retrieval_turn2session`` of a turn-level episode's ranked turn indices (the top
  ``eval.k``; it must reach ``k`` distinct sessions, else the ValueError asks for a larger ``eval.k``)."""
  corpus_ids = [it.id for it in ep.items]
  ranked = [i for i in ranked if i >= 0]
  try:
    return official.evaluate_retrieval_turn2session(
      ranked, official.longmemeval_correct_docs(corpus_ids), corpus_ids, k=k
    )
  except ValueError as e:
    raise EngramError(
      f'{ep.id}: {e} (raise eval.k: the turn->session metrics need the top turns to cover {k} sessions)'
    ) from e


def session_recall_any_at(ep: Episode, q: Question, ranked: list[int], k: int) -> float:
  """Official session-level ``recall_any@k`` from a turn ranking (``session_recall_any@k``, turn level only)."""
  del q
  return _turn2session(ep, ranked, k).recall_any


def session_ndcg_any_at(ep: Episode, q: Question, ranked: list[int], k: int) -> float:
  """Official session-level ``ndcg_any@k`` from a turn ranking (``session_ndcg_any@k``, turn level only)."""
  del q
  return _turn2session(ep, ranked, k).ndcg_any


# dataset-owned metrics (name -> fn(episode, question, ranked indices, k)); evaluation.evaluate reads these.
# session_*: upstream's turn->session conversion (evaluate_retrieval_turn2session) at turn level; ``k`` counts
# distinct sessions, so eval.k (turns retrieved) must be large enough for the grown cutoff.
# field_session_recall_any: the memory packages' headline protocol (any answer_session_ids session among the first k
# sessions), not an official metric; with conf/dataset/longmemeval_s_field.yaml it is scored on every question.
METRICS = {
  'parent_recall': boundary.parent_recall_at,
  'session_recall_any': session_recall_any_at,
  'session_ndcg_any': session_ndcg_any_at,
  'field_session_recall_any': boundary.field_session_recall_any_at,
}
