"""LoCoMo (locomo10.json) loader: one episode per conversation, items = turns in write order.

Evidence ids are normalised as ``shared/data/locomo/SOURCE.md`` describes and every change is
counted in the :class:`~engram_jax.types.LoadReport`:

* an entry holding several ids (``"D8:6; D9:17"``, ``"D9:1 D4:4 D4:6"``) is split on ``;``/whitespace
  (``split_multi_id``);
* ``"D:11:26"`` -> ``"D11:26"`` (``fixed_extra_colon``); ``"D30:05"`` -> ``"D30:5"`` (``fixed_leading_zero``);
* ids that still resolve to no turn are dropped (``dropped_unresolved_id``);
* repeated ids within one question are kept once (``dropped_duplicate_id``);
* questions left with no resolvable evidence are excluded (``excluded_no_evidence``).

Sessions are ordered by their number (``session_<n>``), turns by their index; position is the
turn's index in that order. Item text comes from a ``str.format`` template with the fields
``text``, ``speaker``, ``date``, ``caption`` (``" [shares a photo: <blip_caption>]"`` or ``""``),
``session`` and ``dia_id``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from engram_jax.data.io import dataset_file, read_json
from engram_jax.types import Episode, Item, LoadReport, Question

TEMPLATES = {
    'text': '{text}',
    'speaker': '{speaker}: {text}',
    'dated': '[{date}] {speaker}: {text}{caption}',
}
DEFAULT_CATEGORIES = {1: 'multi-hop', 2: 'temporal', 3: 'open-domain', 4: 'single-hop', 5: 'adversarial'}
_ID = re.compile(r'^D(\d+):(\d+)$')
_SESSION = re.compile(r'^session_(\d+)$')


def normalise_evidence(raw: list[Any], known: set[str], report: LoadReport, qid: str) -> list[str]:
  """Normalise one question's evidence list to known turn ids, counting every change in ``report``."""
  out: list[str] = []
  for entry in raw:
    parts = [p for p in re.split(r'[;\s]+', str(entry)) if p]
    if len(parts) != 1:
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
      if fixed not in known:
        report.add('dropped_unresolved_id', (qid, p))
        continue
      if fixed in out:
        report.add('dropped_duplicate_id', (qid, fixed))
        continue
      out.append(fixed)
  return out


def _turns(conv: Mapping[str, Any], sample_id: str, template: str, report: LoadReport) -> list[Item]:
  sessions = sorted((int(m[1]), k) for k in conv if (m := _SESSION.match(k)))
  dates_without_turns = [k for k in conv if k.endswith('_date_time') and k[:-len('_date_time')] not in conv]
  if dates_without_turns:
    report.add('session_date_without_turns', (sample_id, len(dates_without_turns)), n=len(dates_without_turns))
  items: list[Item] = []
  for n, key in sessions:
    date = conv.get(f'{key}_date_time')
    if date is None:
      report.add('session_without_date', (sample_id, key))
    turns = conv[key]
    if not isinstance(turns, list):
      raise ValueError(f'LoCoMo {sample_id}: {key} is {type(turns).__name__}, expected a list of turns')
    for j, t in enumerate(turns):
      try:
        dia_id, speaker, text = t['dia_id'], t['speaker'], t['text']
      except (KeyError, TypeError) as e:
        raise ValueError(f'LoCoMo {sample_id}: {key} turn {j} lacks field {e}') from e
      if dia_id != f'D{n}:{j + 1}':
        report.add('dia_id_out_of_pattern', (sample_id, dia_id))
      cap = t.get('blip_caption')
      caption = f' [shares a photo: {cap}]' if cap else ''
      rendered = template.format(text=text, speaker=speaker, date=date or '', caption=caption,
                                 session=n, dia_id=dia_id)
      items.append(Item(id=dia_id, text=rendered, parent=f'session_{n}', position=len(items),
                        time=date, speaker=speaker))
  return items


def load_locomo(root: str | None = None, *, template: str = 'dated', filename: str = 'locomo10.json',
                conversations: list[str] | None = None) -> tuple[list[Episode], LoadReport]:
  """Load LoCoMo as one :class:`Episode` per conversation.

  Args:
    root: data root (see :func:`engram_jax.data.io.resolve_data_root`); file ``<root>/locomo/<filename>``.
    template: a key of :data:`TEMPLATES` or a ``str.format`` template.
    conversations: optional subset of ``sample_id`` values (e.g. for tests).

  Returns:
    ``(episodes, report)``. Question ids are ``<sample_id>/q<index in qa>``; ``category`` is the
    upstream integer (names live in config, see :data:`DEFAULT_CATEGORIES`).
  """
  path = dataset_file(root, 'locomo', filename)
  data = read_json(path)
  if not isinstance(data, list):
    raise ValueError(f'{path}: expected a JSON list of samples, got {type(data).__name__}')
  template = TEMPLATES.get(template, template)
  report = LoadReport('locomo')
  episodes = []
  for s_i, sample in enumerate(data):
    try:
      sample_id, conv, qa = sample['sample_id'], sample['conversation'], sample['qa']
    except (KeyError, TypeError) as e:
      raise ValueError(f'{path}: sample {s_i} lacks field {e}') from e
    if conversations is not None and sample_id not in conversations:
      continue
    items = _turns(conv, sample_id, template, report)
    known = {it.id for it in items}
    parent = {it.id: it.parent for it in items}
    questions = []
    for q_i, q in enumerate(qa):
      qid = f'{sample_id}/q{q_i}'
      try:
        text, category, evidence = q['question'], int(q['category']), q['evidence']
      except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{path}: {qid} lacks or has a bad field ({e!r})') from e
      gold = normalise_evidence(evidence, known, report, qid)
      if not gold:
        report.add('excluded_no_evidence', (qid, category, evidence))
        continue
      answer = q.get('answer', q.get('adversarial_answer'))
      questions.append(Question(id=qid, text=text, gold=tuple(gold),
                                gold_parents=tuple(dict.fromkeys(parent[g] for g in gold)),
                                category=category, answer=None if answer is None else str(answer)))
    report.add('questions_kept', n=len(questions))
    report.add('items', n=len(items))
    episodes.append(Episode(id=sample_id, items=tuple(items), questions=tuple(questions)))
  if conversations is not None:
    missing = set(conversations) - {e.id for e in episodes}
    if missing:
      raise ValueError(f'{path}: unknown conversations {sorted(missing)}')
  return episodes, report
