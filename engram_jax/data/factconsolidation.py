"""MemoryAgentBench FactConsolidation loader (6K, 32K; single-hop SH and multi-hop MH): one episode per context.

Files: ``<root>/memoryagentbench/factconsolidation_official_{6k,32k}.json`` (see that folder's ``SOURCE.md``); each
holds the rows ``factconsolidation_{sh,mh}_<size>``. The SH and MH rows of one size share the same context but are
loaded as separate episodes (episode id = the row's ``source``).

Items: the numbered facts of the context ``"Here is a list of facts:\\n0. <fact>\\n1. <fact>..."``; ``id`` = the
serial as a string, ``text`` = the fact sentence without its serial, ``position`` = rank of the serial (a larger
serial is the newer fact; the official prompt says the newer fact wins), ``parent`` = the item's own id (a fact is
its own record), ``time``/``speaker`` None. Parsing reports, in the :class:`~engram_jax.core.types.LoadReport`:
``header_missing``, ``unparsed_line`` (non-blank lines that are not ``<int>. <text>``), ``duplicate_serial_dropped``
(later copy dropped), ``fact_repeated_under_new_serial`` (the same text, up to case and spaces, again under a new
serial: both kept), ``serial_out_of_order`` (then sorted), ``serial_gap``, ``facts``.

Questions: ``id`` = the row's ``qa_pair_ids`` entry, ``category`` = ``'single-hop'`` / ``'multi-hop'``, ``answer`` =
the JSON array of all acceptable answer strings (``json.dumps(list, ensure_ascii=False)``; decode with
:func:`answers_of`), ``time`` None.

Retrieval gold has no upstream labels; it is derived here. Every fact is read as a (relation, subject, object)
triple with the MQuAKE relation templates the data is rendered from (:data:`RELATION_TEMPLATES`, e.g.
``"{s} is married to {o}."``, ``"The univeristy where {s} was educated is {o}."``, plus a generic
``"The <Title> of {s} is {o}."``, counted as ``fact_generic_title_template``; facts matching none are counted as
``fact_no_template``). A *slot* is
(relation, subject); its *versions* are its facts ordered by serial; the *valid* fact of a slot is its newest one.
Matching uses :func:`match_key` (lower-case, punctuation -> space, articles dropped, whitespace collapsed) and
whole-word containment.

* SH, rule ``gold_sh_subject_object``: among facts whose object equals an answer and whose subject occurs in the
  question, keep those with the longest subject; gold = the newest of them (one fact).
* MH, rules ``gold_mh_chain*``: a chain of 1-4 facts ``s0 -r1-> e1 -r2-> ... -> answer`` where ``s0`` is a subject
  mentioned in the question and each hop's subject is the previous hop's object. Tried in order until one finds a
  chain: valid facts from maximal mentions (``gold_mh_chain_valid``; a mention inside a longer mention is dropped),
  valid facts from all mentions (``gold_mh_chain_valid_all_mentions``), any version from maximal mentions, any
  version from all mentions (``gold_mh_chain_any_version``). Gold = the facts of the shortest chains, in hop order;
  several shortest chains are merged (``gold_mh_chain_ambiguous``).
* Fallback for both (``gold_answer_text_fallback``): the newest fact whose text contains an answer as whole words.
* Questions still without gold are excluded (``excluded_no_gold``).

Also counted: ``gold_not_newest_in_slot`` (the answer-bearing fact has a newer version in its slot, i.e. the
answer contradicts the newest-wins rule), ``asked_slot_has_conflict`` (the asked slot has more than one version),
``multiple_answers``, ``answer_string_wrapped`` (an answer given as a bare string instead of a list),
``questions_read`` (= ``questions_kept`` + ``excluded_no_gold``).

Malformed input raises ``ValueError`` naming the file (or ``FactConsolidation row`` when a row is passed directly),
the row's source and the question: a row without ``metadata.source``, two rows with one source, a missing field, a
field of the wrong type (non-string context / question / ``qa_pair_ids`` entry, non-list questions / answers /
``qa_pair_ids``), misaligned lists, a repeated ``qa_pair_ids`` entry, an empty answer list or a blank answer, a
blank question, a context with no numbered fact.

:func:`asked_fact_versions` gives, per question, the asked fact (the gold fact carrying the answer: SH its gold fact,
MH the last hop) and the other versions of its slot, for
:func:`engram_jax.metrics.official.newest_outranks_superseded`.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data.io import dataset_file, duplicates, read_json, reject_duplicates, type_name
from engram_jax.metrics import boundary, official

FILES = {'6k': 'factconsolidation_official_6k.json', '32k': 'factconsolidation_official_32k.json'}
HOPS = {'sh': 'single-hop', 'mh': 'multi-hop'}
HEADER = 'Here is a list of facts:'
MAX_HOPS = 4

# MQuAKE relation templates as rendered in the data (upstream typos kept); ``s`` subject, ``o`` object.
RELATION_TEMPLATES: tuple[tuple[str, str], ...] = (
  ('P30', r'(?P<s>.+?) is located in the continent of (?P<o>.+)'),
  ('P36', r'The capital of (?P<s>.+?) is (?P<o>.+)'),
  ('P35', r'The name of the current head of state in (?P<s>.+?) is (?P<o>.+)'),
  ('P6', r'The name of the current head of the (?P<s>.+?) government is (?P<o>.+)'),
  ('P20', r'(?P<s>.+?) died in the city of (?P<o>.+)'),
  ('P26', r'(?P<s>.+?) is married to (?P<o>.+)'),
  ('P140', r'(?P<s>.+?) is affiliated with the religion of (?P<o>.+)'),
  ('P1412', r'(?P<s>.+?) speaks the language of (?P<o>.+)'),
  ('P19', r'(?P<s>.+?) was born in the city of (?P<o>.+)'),
  ('P69', r'The univeristy where (?P<s>.+?) was educated is (?P<o>.+)'),
  ('P40', r"(?P<s>.+?)'s child is (?P<o>.+)"),
  ('P27', r'(?P<s>.+?) is a citizen of (?P<o>.+)'),
  ('P175', r'(?P<s>.+?) was performed by (?P<o>.+)'),
  ('P108', r'(?P<s>.+?) is employed by (?P<o>.+)'),
  ('P112', r'(?P<s>.+?) was founded by (?P<o>.+)'),
  ('P50', r'The author of (?P<s>.+?) is (?P<o>.+)'),
  ('P170', r'(?P<s>.+?) was created by (?P<o>.+)'),
  ('P407', r'(?P<s>.+?) was written in the language of (?P<o>.+)'),
  ('P37', r'The official language of (?P<s>.+?) is (?P<o>.+)'),
  ('P740', r'(?P<s>.+?) was founded in the city of (?P<o>.+)'),
  ('P495', r'(?P<s>.+?) was created in the country of (?P<o>.+)'),
  ('P178', r'(?P<s>.+?) was developed by (?P<o>.+)'),
  ('P641', r'(?P<s>.+?) is associated with the sport of (?P<o>.+)'),
  ('P413', r'(?P<s>.+?) plays the position of (?P<o>.+)'),
  ('P286', r'The head coach of (?P<s>.+?) is (?P<o>.+)'),
  ('P159', r'The headquarters of (?P<s>.+?) is located in the city of (?P<o>.+)'),
  ('P176', r'The company that produced (?P<s>.+?) is (?P<o>.+)'),
  ('P800', r'(?P<s>.+?) is famous for (?P<o>.+)'),
  ('P937', r'(?P<s>.+?) worked in the city of (?P<o>.+)'),
  ('P449', r'The origianl broadcaster of (?P<s>.+?) is (?P<o>.+)'),
  ('P364', r'The original language of (?P<s>.+?) is (?P<o>.+)'),
  ('P488', r'The chairperson of (?P<s>.+?) is (?P<o>.+)'),
  ('P169', r'The chief executive officer of (?P<s>.+?) is (?P<o>.+)'),
  ('P57', r'The director of (?P<s>.+?) is (?P<o>.+)'),
  ('P106', r'(?P<s>.+?) works in the field of (?P<o>.+)'),
  ('P136', r'The type of music that (?P<s>.+?) plays is (?P<o>.+)'),
  ('title', r'The (?P<t>[A-Z][\w-]*(?: [A-Z][\w-]*)*) of (?P<s>.+?) is (?P<o>.+)'),
)
_TEMPLATES = tuple((name, re.compile(f'^{rx}\\.$')) for name, rx in RELATION_TEMPLATES)
_LINE = re.compile(r'^(\d+)\.\s+(.*\S)\s*$')
_ARTICLES = re.compile(r'\b(a|an|the)\b')
_PUNCT_TO_SPACE = str.maketrans({ch: ' ' for ch in string.punctuation})


class Fact(NamedTuple):
  """One numbered fact of a context."""

  serial: int
  text: str


class Triple(NamedTuple):
  """A fact read through a relation template (``relation`` is a template name, ``title:<Title>`` for the generic)."""

  relation: str
  subject: str
  object: str


class FactVersions(NamedTuple):
  """The asked fact of a question and the other versions of its slot (item ids, in serial order)."""

  newest: str
  superseded: tuple[str, ...]
  anomalous: bool  # True when some other version is newer than the answer-bearing one


def match_key(text: str) -> str:
  """Matching normalisation: lower-case, punctuation -> space, articles dropped, whitespace collapsed."""
  text = text.lower().translate(_PUNCT_TO_SPACE)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def _contains(hay: str, needle: str) -> bool:
  return bool(needle) and f' {needle} ' in f' {hay} '


def parse_triple(fact: str) -> Triple | None:
  """Read a fact sentence as (relation, subject, object) with :data:`RELATION_TEMPLATES`; None if none fits."""
  for name, rx in _TEMPLATES:
    m = rx.match(fact)
    if m:
      rel = f'title:{m["t"]}' if name == 'title' else name
      return Triple(rel, m['s'], m['o'])
  return None


def parse_facts(context: str, *, report: LoadReport, source: str = '') -> list[Fact]:
  """Parse the numbered fact list; every irregularity is counted in ``report``.

  Returns:
    facts sorted by serial, serials unique (a repeated serial keeps its first line).
  """
  lines = context.split('\n')
  if lines[0].strip() != HEADER:
    report.add('header_missing', (source, lines[0][:80]))
  if lines[0].strip() == HEADER or not _LINE.match(lines[0]):
    lines = lines[1:]  # the header, or the non-fact line standing in its place (counted once, above)
  facts: list[Fact] = []
  seen: set[int] = set()
  for ln, line in enumerate(lines):
    if not line.strip():
      continue
    m = _LINE.match(line)
    if not m:
      report.add('unparsed_line', (source, ln, line[:80]))
      continue
    serial = int(m[1])
    if serial in seen:
      report.add('duplicate_serial_dropped', (source, serial, line[:80]))
      continue
    seen.add(serial)
    facts.append(Fact(serial, m[2]))
  first: dict[str, int] = {}
  for f in facts:  # the same fact again under a new serial: kept (both are items), counted
    key = ' '.join(f.text.lower().split())
    if key in first:
      report.add('fact_repeated_under_new_serial', (source, first[key], f.serial))
    first.setdefault(key, f.serial)
  serials = [f.serial for f in facts]
  if serials != sorted(serials):
    report.add('serial_out_of_order', source)
    facts.sort(key=lambda f: f.serial)
  for a, b in zip(facts, facts[1:]):
    if b.serial != a.serial + 1:
      report.add('serial_gap', (source, a.serial, b.serial))
  if facts and facts[0].serial != 0:
    report.add('serial_gap', (source, -1, facts[0].serial))
  report.add('facts', n=len(facts))
  return facts


def answers_of(question: Question) -> tuple[str, ...]:
  """Decode the acceptable answers stored in ``question.answer`` (a JSON array of strings)."""
  try:
    answers = json.loads(question.answer or '')
  except json.JSONDecodeError as e:
    raise EngramError(f'{question.id}: answer {question.answer!r} is not a JSON array') from e
  if not isinstance(answers, list):
    raise EngramError(f'{question.id}: answer {question.answer!r} is not a JSON array')
  return tuple(str(a) for a in answers)


class _Index(NamedTuple):
  facts: list[Fact]
  triples: list[Triple | None]
  slot_of: list[tuple[str, str] | None]
  slots: dict[tuple[str, str], list[int]]  # slot -> row indices in serial order
  valid: set[int]  # rows that are the newest of their slot


def _index(facts: list[Fact]) -> _Index:
  triples = [parse_triple(f.text) for f in facts]
  slot_of: list[tuple[str, str] | None] = []
  slots: dict[tuple[str, str], list[int]] = defaultdict(list)
  for i, t in enumerate(triples):
    key = None if t is None else (t.relation, match_key(t.subject))
    slot_of.append(key)
    if key is not None:
      slots[key].append(i)
  valid = {rows[-1] for rows in slots.values()}
  return _Index(facts, triples, slot_of, dict(slots), valid)


def _answer_fact(ix: _Index, i: int, answer_keys: set[str]) -> bool:
  t = ix.triples[i]
  return t is not None and match_key(t.object) in answer_keys


def _text_fallback(ix: _Index, answer_keys: set[str]) -> list[int]:
  rows = [i for i, f in enumerate(ix.facts) if any(_contains(match_key(f.text), a) for a in answer_keys)]
  return rows[-1:]


def _derive_sh_gold(question: str, answers: Sequence[str], ix: _Index) -> tuple[list[int], str]:
  """Single-hop gold rows and the rule that found them (see the module docstring)."""
  q, keys = match_key(question), {match_key(a) for a in answers}
  cands = [
    i
    for i, t in enumerate(ix.triples)
    if t is not None and match_key(t.object) in keys and _contains(q, match_key(t.subject))
  ]
  if cands:
    longest = max(len(match_key(ix.triples[i].subject)) for i in cands)
    return [max(i for i in cands if len(match_key(ix.triples[i].subject)) == longest)], 'gold_sh_subject_object'
  rows = _text_fallback(ix, keys)
  return rows, ('gold_answer_text_fallback' if rows else 'excluded_no_gold')


def _chains(ix: _Index, starts: list[str], rows: set[int], answer_keys: set[str]) -> list[list[int]]:
  by_subject: dict[str, list[int]] = defaultdict(list)
  for i in sorted(rows):
    t = ix.triples[i]
    if t is not None:
      by_subject[match_key(t.subject)].append(i)
  frontier: list[tuple[str, list[int]]] = [(s, []) for s in starts]
  for _ in range(MAX_HOPS):
    found, nxt = [], []
    for entity, path in frontier:
      for i in by_subject.get(entity, ()):
        if i in path:
          continue
        p = path + [i]
        if _answer_fact(ix, i, answer_keys):
          found.append(p)
        nxt.append((match_key(ix.triples[i].object), p))
    if found:
      return found
    frontier = nxt
  return []


def _derive_mh_gold(question: str, answers: Sequence[str], ix: _Index) -> tuple[list[int], str, bool]:
  """Multi-hop gold rows (hop order), the rule that found them and whether several shortest chains were merged."""
  q, keys = match_key(question), {match_key(a) for a in answers}
  mentions = sorted({k for k in (s for _, s in ix.slots) if _contains(q, k)})
  maximal = [m for m in mentions if not any(m != o and _contains(o, m) for o in mentions)]
  every = set(range(len(ix.facts)))
  attempts = (
    ('gold_mh_chain_valid', maximal, ix.valid),
    ('gold_mh_chain_valid_all_mentions', mentions, ix.valid),
    ('gold_mh_chain_any_version', maximal, every),
    ('gold_mh_chain_any_version', mentions, every),
  )
  for rule, starts, rows in attempts:
    chains = _chains(ix, starts, rows, keys)
    if chains:
      gold = list(dict.fromkeys(i for c in sorted(chains) for i in c))
      # Hop order: the answer-bearing fact(s) last.
      gold.sort(key=lambda i: _answer_fact(ix, i, keys))
      return gold, rule, len(chains) > 1
  rows = _text_fallback(ix, keys)
  return rows, ('gold_answer_text_fallback' if rows else 'excluded_no_gold'), False


def _asked_row(ix: _Index, gold_rows: Sequence[int], answer_keys: set[str]) -> int | None:
  carrying = [i for i in gold_rows if _answer_fact(ix, i, answer_keys)]
  return carrying[-1] if carrying else None


def _versions(ix: _Index, row: int) -> FactVersions | None:
  slot = ix.slot_of[row]
  if slot is None:
    return None
  others = [i for i in ix.slots[slot] if i != row]
  return FactVersions(
    newest=str(ix.facts[row].serial),
    superseded=tuple(str(ix.facts[i].serial) for i in others),
    anomalous=any(i > row for i in others),
  )


def asked_fact_versions(episode: Episode, question: Question) -> FactVersions | None:
  """The asked fact of ``question`` (the gold fact whose object is an answer; MH: the last such hop) and the other
  versions of its slot, as item ids; None when no gold fact carries the answer or it fits no template."""
  facts = [Fact(int(it.id), it.text) for it in episode.items]
  ix = _index(facts)
  row_of = {it.id: i for i, it in enumerate(episode.items)}
  row = _asked_row(ix, [row_of[g] for g in question.gold], {match_key(a) for a in answers_of(question)})
  return None if row is None else _versions(ix, row)


def _answer_list(ans: Any, qid: str, where: str, report: LoadReport) -> list[str]:
  """One question's acceptable answers; a bare string is wrapped (counted), anything else malformed raises."""
  if isinstance(ans, str):
    report.add('answer_string_wrapped', qid)
    ans = [ans]
  if not isinstance(ans, list) or not ans or not all(isinstance(a, str) and a.strip() for a in ans):
    raise EngramError(f'{where}: question {qid} has answers {ans!r}, expected a non-empty list of non-blank strings')
  return ans


def _row_fields(row: Any, path: str) -> tuple[str, str, list[Any], list[Any], list[str]]:
  """``(where, context, questions, answers, qa_ids)`` of a row, type- and length-checked; ``where`` names the
  file (when given) and the row's source."""
  head = path or 'FactConsolidation row'
  if not isinstance(row, Mapping):
    raise EngramError(f'{head}: row is {type_name(row)}, expected an object')
  try:
    context, questions, answers = row['context'], row['questions'], row['answers']
    source, qa_ids = row['metadata']['source'], row['metadata']['qa_pair_ids']
  except (KeyError, TypeError) as e:
    raise EngramError(f'{head}: row lacks field {e}') from e
  if not isinstance(source, str) or not source.strip():
    raise EngramError(f'{head}: row has metadata.source {source!r}, expected a non-empty string')
  where = f'{path}: {source}' if path else f'{head} {source}'
  if not isinstance(context, str):
    raise EngramError(f'{where}: context is {type_name(context)}, expected a string')
  for name, value in (('questions', questions), ('answers', answers), ('qa_pair_ids', qa_ids)):
    if not isinstance(value, list):
      raise EngramError(f'{where}: {name} is {type_name(value)}, expected a list')
  if not (len(questions) == len(answers) == len(qa_ids)):
    raise EngramError(
      f'{where}: row has {len(questions)} questions, {len(answers)} answer lists, {len(qa_ids)} qa_pair_ids'
    )
  for i, qid in enumerate(qa_ids):
    if not isinstance(qid, str) or not qid.strip():
      raise EngramError(f'{where}: question {i} has qa_pair_id {qid!r}, expected a non-empty string')
  reject_duplicates(qa_ids, what='qa_pair_ids', where=where)
  return where, context, questions, answers, qa_ids


def episode_from_row(row: Mapping[str, Any], *, report: LoadReport, path: str = '') -> Episode:
  """One upstream row (context + questions) -> an :class:`Episode` with derived gold.

  Raises:
    ValueError: naming ``path`` (or ``'FactConsolidation row'``), the row's source and the question for a missing
      field, a field of the wrong type, misaligned lists, a repeated ``qa_pair_ids`` entry, a blank question or
      answer, or a context with no numbered fact. A bare-string answer is wrapped (``answer_string_wrapped``).
  """
  where, context, questions, answers, qa_ids = _row_fields(row, path)
  source = row['metadata']['source']
  hop = next((h for h in HOPS if f'_{h}_' in f'_{source}_'), None)
  if hop is None:
    raise EngramError(f'{where}: cannot tell single- from multi-hop from source {source!r}')
  facts = parse_facts(context, report=report, source=source)
  if not facts:
    raise EngramError(f'{where}: context holds no numbered fact ("<serial>. <fact>" lines)')
  ix = _index(facts)
  no_template = [f.serial for f, t in zip(facts, ix.triples) if t is None]
  for s in no_template:
    report.add('fact_no_template', (source, s))
  for f, t in zip(facts, ix.triples):
    if t is not None and t.relation.startswith('title:'):
      report.add('fact_generic_title_template', (source, f.serial, f.text))
  report.add('slots_with_conflict', n=sum(len(r) > 1 for r in ix.slots.values()))
  items = tuple(Item(id=str(f.serial), text=f.text, parent=str(f.serial), position=p) for p, f in enumerate(facts))
  report.add('questions_read', n=len(questions))
  kept = []
  for qid, text, ans in zip(qa_ids, questions, answers):
    ans_list = _answer_list(ans, qid, where, report)
    if not isinstance(text, str) or not text.strip():
      raise EngramError(f'{where}: question {qid} has question {text!r}, expected non-empty text')
    if len(ans_list) > 1:
      report.add('multiple_answers', qid)
    if hop == 'sh':
      rows, rule = _derive_sh_gold(text, ans_list, ix)
    else:
      rows, rule, ambiguous = _derive_mh_gold(text, ans_list, ix)
      if ambiguous:
        report.add('gold_mh_chain_ambiguous', qid)
    report.add(rule, qid)
    if not rows:
      continue
    keys = {match_key(a) for a in ans_list}
    asked = _asked_row(ix, rows, keys)
    versions = None if asked is None else _versions(ix, asked)
    if versions is not None and versions.superseded:
      report.add('asked_slot_has_conflict', qid)
    if versions is not None and versions.anomalous:
      report.add('gold_not_newest_in_slot', (qid, ix.facts[asked].text))
    gold = tuple(str(facts[i].serial) for i in rows)
    kept.append(
      Question(
        id=qid,
        text=text,
        gold=gold,
        gold_parents=gold,
        category=HOPS[hop],
        answer=json.dumps(ans_list, ensure_ascii=False),
      )
    )
  report.add('questions_kept', n=len(kept))
  return Episode(id=source, items=items, questions=tuple(kept))


def _row_sources(data: Any, path: str) -> list[str]:
  """``metadata.source`` of every row of a file; ValueError naming the file and the row when one has none."""
  if not isinstance(data, Mapping) or not isinstance(data.get('data'), list):
    raise EngramError(
      f'{path}: expected {{"data": [row, ...]}}, got {type_name(data)}'
      + (f' whose "data" is {type_name(data.get("data"))}' if isinstance(data, Mapping) else '')
    )
  sources = []
  for i, r in enumerate(data['data']):
    meta = r.get('metadata') if isinstance(r, Mapping) else None
    source = meta.get('source') if isinstance(meta, Mapping) else None
    if not isinstance(source, str):
      raise EngramError(f'{path}: data row {i} has no metadata.source string')
    sources.append(source)
  dup = duplicates(sources)
  if dup:
    raise EngramError(
      f'{path}: duplicate rows for source ' + ', '.join(f'{s!r} (found {sources.count(s)})' for s in dup)
    )
  return sources


def load_factconsolidation(
  root: str | os.PathLike | None = None, *, size: str = '6k', hop: str = 'sh'
) -> tuple[list[Episode], LoadReport]:
  """Load one FactConsolidation row as ``([episode], report)``.

  Args:
    root: data root (see :func:`engram_jax.data.io.resolve_data_root`).
    size: ``'6k'`` or ``'32k'`` (the sizes present; 64K/262K were not obtained).
    hop: ``'sh'`` (single-hop) or ``'mh'`` (multi-hop).

  Returns:
    one episode (id ``factconsolidation_<hop>_<size>``) and the report (gold coverage per rule, parse issues).

  Raises:
    ValueError: naming the file for malformed JSON, a row without ``metadata.source``, two rows with one source,
      no row for the requested one, or a malformed row (see :func:`episode_from_row`).

  Example:
    >>> from engram_jax.data import load_factconsolidation
    >>> episodes, report = load_factconsolidation(size='6k', hop='sh')  # needs the data root (README, Data)
    >>> sum(len(ep.questions) for ep in episodes)
    100
  """
  if size not in FILES:
    raise EngramError(f'Unknown FactConsolidation size {size!r}; available: {sorted(FILES)}')
  if hop not in HOPS:
    raise EngramError(f'Unknown FactConsolidation hop {hop!r}; known: {sorted(HOPS)}')
  path = dataset_file(root, 'memoryagentbench', FILES[size])
  data = read_json(path)
  source = f'factconsolidation_{hop}_{size}'
  sources = _row_sources(data, str(path))
  rows = [r for r, s in zip(data['data'], sources) if s == source]
  if len(rows) != 1:
    raise EngramError(f'{path}: expected one row with source {source!r}, found {len(rows)}')
  report = LoadReport(source)
  return [episode_from_row(rows[0], report=report, path=str(path))], report


# ---- dataset-owned metrics (name -> fn(episode, question, ranked indices, k)); evaluation.evaluate reads these ----


def answer_at(ep: Episode, q: Question, ranked: list[int], k: int) -> float:
  """``answer@k``: 1 if a top-``k`` fact contains a normalised acceptable answer (MemoryAgentBench SubEM per text)."""
  texts = [ep.items[i].text for i in ranked]
  return float(official.answer_in_topk(texts, answers_of(q), k=k))


def newest_first_at(ep: Episode, q: Question, ranked: list[int], k: int) -> float:
  """``newest_first@k``: 1 if the newest version of the asked fact outranks every superseded one in the top k;
  questions whose asked fact has no older version score 1 if the newest version is in the top k (0 when no version
  can be derived)."""
  v = asked_fact_versions(ep, q)
  ids = [ep.items[i].id for i in ranked]
  if v is None:
    return 0.0
  ok = official.newest_outranks_superseded(ids, newest=v.newest, superseded=v.superseded, k=k)
  return float(v.newest in ids[:k]) if ok is None else float(ok)


METRICS = {'answer': answer_at, 'newest_first': newest_first_at, 'parent_recall': boundary.parent_recall_at}
