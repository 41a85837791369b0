"""LoCoMo (locomo10.json) loader: one episode per conversation, items = turns in write order.

Evidence ids are normalised as ``shared/data/locomo/SOURCE.md`` describes and every change is
counted in the :class:`~engram_jax.core.types.LoadReport`:

* an entry holding several ids (``"D8:6; D9:17"``, ``"D9:1 D4:4 D4:6"``) is split on ``;``/whitespace
  (``split_multi_id``); an empty or blank entry is dropped (``empty_evidence_id``);
* ``"D:11:26"`` -> ``"D11:26"`` (``fixed_extra_colon``); ``"D30:05"`` -> ``"D30:5"`` (``fixed_leading_zero``);
* ids of turns dropped as blank (below) are dropped (``dropped_blank_turn_id``); ids that still resolve to no
  turn are dropped (``dropped_unresolved_id``);
* repeated ids within one question are kept once (``dropped_duplicate_id``);
* a null (``evidence_null``) or absent (``evidence_missing``) evidence list is read as "no evidence";
* questions left with no resolvable evidence are excluded (``excluded_no_evidence``).

Sessions are ordered by their number (``session_<n>``), turns by their index; position is the
turn's index in that order. Item text comes from a ``str.format`` template with the fields
``text``, ``speaker``, ``date``, ``caption`` (``" [shares a photo: <blip_caption>]"`` or ``""``),
``session`` and ``dia_id``. Also counted:

* ``blank_turn_dropped``: a turn without content, i.e. its ``text`` is blank and it has no caption that the
  template renders (with a ``{caption}`` template a blank-text photo turn is kept and counted as
  ``blank_text_with_caption``); ``turns_read`` = ``items`` + ``blank_turn_dropped``;
* ``empty_session`` (``session_<n>: []``); ``session_without_date`` (date absent, null or blank; ``time`` None);
  ``session_date_without_turns``; ``dia_id_out_of_pattern``; ``caption_null`` (null ``blip_caption``, no caption);
* ``answer_number_stringified`` (integer answers), ``answer_missing`` (neither ``answer`` nor
  ``adversarial_answer``; ``Question.answer`` None); ``duplicate_qa_kept`` (a ``qa`` entry identical to an earlier
  one of the same sample: kept, as upstream ``conv-48`` has 11 such copies);
* ``questions_read`` (= ``questions_kept`` + ``excluded_no_evidence``), ``questions_kept``, ``items``.

Anything else malformed raises ``ValueError`` naming the file and the sample, session, turn or question: a
repeated ``sample_id`` (its questions would be scored twice), a repeated ``dia_id`` within a sample, a field of
the wrong type (non-string ``sample_id``/``dia_id``/``speaker``/``text``/date/caption/evidence entry, non-integer
``category``, list/object answer, non-list session/``qa``/evidence), missing fields, a blank question, two keys
for one session number, or a sample with no turn at all.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data.io import check_template, dataset_file, read_json, reject_duplicates, type_name
from engram_jax.metrics import boundary

TEMPLATES = {
  'text': '{text}',
  'speaker': '{speaker}: {text}',
  'dated': '[{date}] {speaker}: {text}{caption}',
}
# the fields an item's template may name (str.format)
FIELDS = ('text', 'speaker', 'date', 'caption', 'session', 'dia_id')
DEFAULT_CATEGORIES = {1: 'multi-hop', 2: 'temporal', 3: 'open-domain', 4: 'single-hop', 5: 'adversarial'}
TURN_FIELDS = ('dia_id', 'speaker', 'text')
_ID = re.compile(r'^D(\d+):(\d+)$')
_SESSION = re.compile(r'^session_(\d+)$')
# LoCoMo's session dates, e.g. '1:56 pm on 8 May, 2023' (all 272 dates of locomo10.json parse)
DATE_FORMAT = '%I:%M %p on %d %B, %Y'
_MARK = '\x00'


def normalise_evidence(
  raw: Sequence[str], known: set[str], report: LoadReport, qid: str, *, blank: frozenset[str] = frozenset()
) -> list[str]:
  """Normalise one question's evidence list to known turn ids, counting every change in ``report``.

  Args:
    raw: the upstream evidence entries (strings).
    known: ids of the turns kept as items.
    report: collects the counts.
    qid: question id, for the report's examples.
    blank: ids of turns dropped as blank (counted as ``dropped_blank_turn_id``, not as unresolved).
  """
  out: list[str] = []
  for entry in raw:
    parts = [p for p in re.split(r'[;\s]+', str(entry)) if p]
    if not parts:
      report.add('empty_evidence_id', (qid, entry))
      continue
    if len(parts) > 1:
      report.add('split_multi_id', (qid, entry))
    for p in parts:
      fixed = p
      if re.fullmatch(r'D:\d+:\d+', fixed):
        fixed = 'D' + fixed[2:]
        report.add('fixed_extra_colon', (qid, p, fixed))
      m = _ID.match(fixed)
      if m and fixed != f'D{int(m[1])}:{int(m[2])}':
        fixed = f'D{int(m[1])}:{int(m[2])}'
        report.add('fixed_leading_zero', (qid, p, fixed))
      if fixed in blank:
        report.add('dropped_blank_turn_id', (qid, fixed))
        continue
      if fixed not in known:
        report.add('dropped_unresolved_id', (qid, p))
        continue
      if fixed in out:
        report.add('dropped_duplicate_id', (qid, fixed))
        continue
      out.append(fixed)
  return out


def renders_caption(template: str) -> bool:
  """Whether ``template`` renders the ``caption`` field; ValueError for a template the loader cannot fill."""
  try:
    text = template.format(text='', speaker='', date='', caption=_MARK, session=0, dia_id='')
  except (KeyError, IndexError, ValueError, AttributeError) as e:
    raise EngramError(
      f'LoCoMo template {template!r} cannot be filled ({e!r}); its fields must be among '
      'text, speaker, date, caption, session, dia_id'
    ) from e
  return _MARK in text


_CAPTION = ' [shares a photo: '


def turn_text(item: Item) -> str:
  """The turn's own words, without what the loader's templates add: the ``[date] speaker: `` (``dated``) or
  ``speaker: `` (``speaker``) prefix and the `` [shares a photo: ...]`` caption (for the upstream QA prompt, which
  writes ``{date}: {speaker} said, "{text}"``). Text of another template is returned as is.

  Example:
    >>> from engram_jax import Item
    >>> from engram_jax.data.locomo import turn_text
    >>> it = Item('D1:3', '[8 May, 2023] Mel: Look! [shares a photo: a dog]', 'session_1', 0, '8 May, 2023', 'Mel')
    >>> turn_text(it)
    'Look!'
  """
  text = item.text
  for prefix in (f'[{item.time or ""}] {item.speaker}: ', f'{item.speaker}: '):
    if item.speaker is not None and text.startswith(prefix):
      text = text[len(prefix) :]
      break
  at = text.rfind(_CAPTION)
  if at >= 0 and text.endswith(']'):
    text = text[:at]
  return text


def _sessions(conv: Mapping[str, Any], where: str) -> list[tuple[int, str]]:
  sessions = sorted((int(m[1]), k) for k in conv if (m := _SESSION.match(k)))
  for (a, key_a), (b, key_b) in zip(sessions, sessions[1:]):
    if a == b:
      raise EngramError(f'{where}: {key_a} and {key_b} are both session {a}')
  return sessions


def _session_date(conv: Mapping[str, Any], key: str, sample_id: str, where: str, report: LoadReport) -> str | None:
  date = conv.get(f'{key}_date_time')
  if date is not None and not isinstance(date, str):
    raise EngramError(f'{where}: {key}_date_time is {type_name(date)}, expected a string')
  if date is None or not date.strip():
    report.add('session_without_date', (sample_id, key))
    return None
  try:
    datetime.datetime.strptime(date.strip(), DATE_FORMAT)
  except ValueError:
    raise EngramError(
      f"{where}: {key}_date_time {date!r} is not a LoCoMo date (expected the form '1:56 pm on 8 May, 2023'); it "
      'would be written into every item text of that session'
    ) from None
  report.add('session_dates_checked')
  return date


def _read_turn(t: Any, where: str) -> tuple[str, str, str, str]:
  """``(dia_id, speaker, text, caption)`` of one turn; ValueError naming ``where`` when malformed."""
  if not isinstance(t, Mapping):
    raise EngramError(f'{where} is {type_name(t)}, expected an object')
  missing = [f for f in TURN_FIELDS if f not in t]
  if missing:
    raise EngramError(f'{where} lacks field {", ".join(map(repr, missing))}')
  for f in TURN_FIELDS:
    if not isinstance(t[f], str):
      raise EngramError(f'{where} has {f} {t[f]!r}, expected a string')
  if not t['dia_id'].strip():
    raise EngramError(f'{where} has a blank dia_id')
  cap = t.get('blip_caption')
  if cap is not None and not isinstance(cap, str):
    raise EngramError(f'{where} has blip_caption {cap!r}, expected a string or null')
  caption = f' [shares a photo: {cap}]' if cap and cap.strip() else ''
  return t['dia_id'], t['speaker'], t['text'], caption


def _turns(
  conv: Mapping[str, Any], sample_id: str, template: str, report: LoadReport, where: str, *, with_caption: bool
) -> tuple[list[Item], frozenset[str]]:
  """The sample's turns as items in write order, and the ids of the turns dropped as blank."""
  dates_without_turns = [k for k in conv if k.endswith('_date_time') and k[: -len('_date_time')] not in conv]
  if dates_without_turns:
    report.add('session_date_without_turns', (sample_id, len(dates_without_turns)), n=len(dates_without_turns))
  items: list[Item] = []
  dia_ids: list[str] = []
  blank: list[str] = []
  for n, key in _sessions(conv, where):
    date = _session_date(conv, key, sample_id, where, report)
    turns = conv[key]
    if not isinstance(turns, list):
      raise EngramError(f'{where}: {key} is {type_name(turns)}, expected a list of turns')
    if not turns:
      report.add('empty_session', (sample_id, key))
    report.add('turns_read', n=len(turns))
    for j, t in enumerate(turns):
      dia_id, speaker, text, caption = _read_turn(t, f'{where}: {key} turn {j}')
      dia_ids.append(dia_id)
      if 'blip_caption' in t and t['blip_caption'] is None:
        report.add('caption_null', (sample_id, dia_id))
      if dia_id != f'D{n}:{j + 1}':
        report.add('dia_id_out_of_pattern', (sample_id, dia_id))
      if not text.strip():
        if not (caption and with_caption):
          report.add('blank_turn_dropped', (sample_id, dia_id))
          blank.append(dia_id)
          continue
        report.add('blank_text_with_caption', (sample_id, dia_id))
      rendered = template.format(text=text, speaker=speaker, date=date or '', caption=caption, session=n, dia_id=dia_id)
      items.append(
        Item(id=dia_id, text=rendered, parent=f'session_{n}', position=len(items), time=date, speaker=speaker)
      )
  reject_duplicates(dia_ids, what='dia_id', where=where)
  if not items:
    raise EngramError(f'{where}: no turns (no session holds a non-blank turn)')
  return items, frozenset(blank)


def _evidence(q: Mapping[str, Any], qid: str, where: str, report: LoadReport) -> list[str]:
  if 'evidence' not in q:
    report.add('evidence_missing', qid)
    return []
  evidence = q['evidence']
  if evidence is None:
    report.add('evidence_null', qid)
    return []
  if not isinstance(evidence, list):
    raise EngramError(f'{where}: {qid}: evidence is {type_name(evidence)}, expected a list of dia_id strings')
  for e in evidence:
    if not isinstance(e, str):
      raise EngramError(f'{where}: {qid}: evidence entry {e!r} is {type_name(e)}, expected a dia_id string')
  return evidence


def _answer(q: Mapping[str, Any], qid: str, where: str, report: LoadReport) -> str | None:
  answer = q.get('answer', q.get('adversarial_answer'))
  if answer is None:
    report.add('answer_missing', qid)
    return None
  if isinstance(answer, str):
    return answer
  if isinstance(answer, (int, float)) and not isinstance(answer, bool):
    report.add('answer_number_stringified', (qid, answer))
    return str(answer)
  raise EngramError(f'{where}: {qid}: answer {answer!r} is {type_name(answer)}, expected a string or number')


def _question(
  q: Any, qid: str, known: set[str], blank: frozenset[str], parent: Mapping[str, str], report: LoadReport, where: str
) -> Question | None:
  """One ``qa`` entry -> a :class:`Question`, or None when it has no resolvable evidence (counted)."""
  if not isinstance(q, Mapping):
    raise EngramError(f'{where}: {qid} is {type_name(q)}, expected an object')
  missing = [f for f in ('question', 'category') if f not in q]
  if missing:
    raise EngramError(f'{where}: {qid} lacks field {", ".join(map(repr, missing))}')
  text, category = q['question'], q['category']
  if not isinstance(text, str) or not text.strip():
    raise EngramError(f'{where}: {qid}: question is {text!r}, expected non-empty text')
  if not isinstance(category, int) or isinstance(category, bool):
    raise EngramError(f'{where}: {qid}: category {category!r} is not an integer')
  evidence = _evidence(q, qid, where, report)
  answer = _answer(q, qid, where, report)
  gold = normalise_evidence(evidence, known, report, qid, blank=blank)
  if not gold:
    report.add('excluded_no_evidence', (qid, category, q.get('evidence')))
    return None
  return Question(
    id=qid,
    text=text,
    gold=tuple(gold),
    gold_parents=tuple(dict.fromkeys(parent[g] for g in gold)),
    category=category,
    answer=answer,
  )


def _check_samples(data: Any, path: str) -> list[tuple[str, Mapping[str, Any], list[Any]]]:
  """``(sample_id, conversation, qa)`` per sample; ValueError for a malformed sample or a repeated sample_id."""
  if not isinstance(data, list):
    raise EngramError(f'{path}: expected a JSON list of samples, got {type_name(data)}')
  out = []
  for s_i, sample in enumerate(data):
    if not isinstance(sample, Mapping):
      raise EngramError(f'{path}: sample {s_i} is {type_name(sample)}, expected an object')
    missing = [f for f in ('sample_id', 'conversation', 'qa') if f not in sample]
    if missing:
      raise EngramError(f'{path}: sample {s_i} lacks field {", ".join(map(repr, missing))}')
    sample_id, conv, qa = sample['sample_id'], sample['conversation'], sample['qa']
    if not isinstance(sample_id, str) or not sample_id.strip():
      raise EngramError(
        f'{path}: sample {s_i}: sample_id is {type_name(sample_id)} {sample_id!r}, expected a non-empty string'
      )
    if not isinstance(conv, Mapping):
      raise EngramError(f'{path}: {sample_id}: conversation is {type_name(conv)}, expected an object')
    if not isinstance(qa, list):
      raise EngramError(f'{path}: {sample_id}: qa is {type_name(qa)}, expected a list of questions')
    out.append((sample_id, conv, qa))
  reject_duplicates(
    [s for s, _, _ in out],
    what='sample_id',
    where=path,
    note='each copy would be loaded as an episode and its questions scored again',
  )
  return out


def load_locomo(
  root: str | None = None,
  *,
  template: str = 'dated',
  filename: str = 'locomo10.json',
  conversations: list[str] | None = None,
) -> tuple[list[Episode], LoadReport]:
  """Load LoCoMo as one :class:`Episode` per conversation.

  Args:
    root: data root (see :func:`engram_jax.data.io.resolve_data_root`); file ``<root>/locomo/<filename>``.
    template: a key of :data:`TEMPLATES` or a ``str.format`` template.
    conversations: optional subset of ``sample_id`` values (e.g. for tests).

  Returns:
    ``(episodes, report)``. Question ids are ``<sample_id>/q<index in qa>``; ``category`` is the
    upstream integer (names live in config, see :data:`DEFAULT_CATEGORIES`).

  Raises:
    ValueError: naming the file and the sample / turn / question for malformed input (see the module docstring).

  Example:
    >>> from engram_jax.data import load_locomo
    >>> episodes, report = load_locomo(conversations=['conv-26'])  # needs the data root (README, Data)
    >>> len(episodes), episodes[0].id
    (1, 'conv-26')
  """
  if isinstance(conversations, str):
    raise EngramError(
      f'conversations must be a list of sample ids, got the string {conversations!r}; write '
      f'dataset.loader.conversations=[{conversations}]'
    )
  template = check_template(template, names=TEMPLATES, fields=FIELDS, where='LoCoMo')
  with_caption = renders_caption(template)
  path = dataset_file(root, 'locomo', filename)
  samples = _check_samples(read_json(path), str(path))
  if not samples:
    raise EngramError(f'{path}: holds no conversations (an empty list); nothing to load')
  report = LoadReport('locomo')
  episodes = []
  for sample_id, conv, qa in samples:
    if conversations is not None and sample_id not in conversations:
      continue
    where = f'{path}: {sample_id}'
    items, blank = _turns(conv, sample_id, template, report, where, with_caption=with_caption)
    known = {it.id for it in items}
    parent = {it.id: it.parent for it in items}
    report.add('questions_read', n=len(qa))
    questions, first = [], {}
    for q_i, q in enumerate(qa):
      qid = f'{sample_id}/q{q_i}'
      question = _question(q, qid, known, blank, parent, report, str(path))
      key = json.dumps(q, sort_keys=True, default=repr)
      if key in first:
        report.add('duplicate_qa_kept', (qid, first[key]))
      first.setdefault(key, qid)
      if question is not None:
        questions.append(question)
    report.add('questions_kept', n=len(questions))
    report.add('items', n=len(items))
    episodes.append(Episode(id=sample_id, items=tuple(items), questions=tuple(questions)))
  reject_duplicates([q.id for e in episodes for q in e.questions], what='question ids', where=str(path))
  if conversations is not None:
    missing = set(conversations) - {e.id for e in episodes}
    if missing:
      raise EngramError(f'{path}: unknown conversations {sorted(missing)}')
  return episodes, report


# dataset-owned metrics (name -> fn(episode, question, ranked indices, k)); evaluation.evaluate reads these.
# field_session_recall_any: the turn ranking folded to sessions, any evidence session among the first k (a memory
# package's headline protocol, not LoCoMo's; conf/dataset/locomo_field.yaml)
METRICS = {'parent_recall': boundary.parent_recall_at, 'field_session_recall_any': boundary.field_session_recall_any_at}
