"""One's own episodes in a memory-native JSONL file (format ``engram_jax.episodes/1``): read by
:func:`load_episodes_jsonl` (``dataset=episodes dataset.loader.path=FILE``), written by :func:`write_episodes_jsonl`
(``python -m experiments.export_episodes`` writes any bundled benchmark this way). The format is documented with
examples in ``docs/formats.md``.

One JSON object per line (UTF-8; a ``.gz`` file is read and written gzipped), each with a ``type``:

* ``dataset`` (optional, the first line only): ``format`` (``engram_jax.episodes/1``), ``name``, ``load_report``
  (the :meth:`~engram_jax.core.types.LoadReport.to_dict` of the loader that produced the episodes: an export carries
  its benchmark loader's report), ``source`` (free-form provenance) and ``meta``.
* ``episode``: ``id``; starts an episode: the ``item`` and ``question`` lines after it, up to the next ``episode``
  line, are its.
* ``item``: ``id`` (unique in its episode), ``text`` (embedded and indexed as it is; blank text is kept), ``parent``
  (the session / record it belongs to: parent-level metrics), optional ``time`` and ``speaker`` (strings or null).
  **Write order is line order**: the episode's first item line has position 0.
* ``question`` (after every item of its episode): ``id`` (unique in the file), ``text``, ``gold`` (the ids of the
  items that hold the evidence), optional ``gold_parents`` (default: the parents of the gold items, in gold order,
  each once), ``answer`` (string or null), ``category`` (integer or string; default ``0``) and ``time``.

Every record may carry ``meta`` (any JSON, not read). Why a record per line rather than an object per episode: a
line is one memory, so an error names the line of the item or question at fault (not a 20,000-item line); a memory
log is appended to as it is written; a file streams however large its episodes, and diffs line by line.

Counted in the :class:`~engram_jax.core.types.LoadReport` (nothing changes silently):

* ``dropped_duplicate_gold_id``: a gold id listed twice in one question (kept once);
* ``answer_number_stringified``: a numeric answer, kept as its string (LoCoMo has integer answers);
* ``excluded_no_gold``: a question whose ``gold`` is ``[]`` (nothing to score it on; left out);
* ``episodes_without_questions``: an episode with no (kept) question (left out);
* ``blank_lines_skipped``;
* a file without a carried report also gets the tallies ``episodes``, ``items``, ``questions_read`` and
  ``questions_kept``. A file that carries a ``load_report`` (an export) continues that report: its counts, examples,
  dataset name and ``file`` as written, plus only what this reader itself changed (the counts above other than the
  tallies), so that a run on an exported benchmark records what the benchmark's loader normalised, byte for byte.

Anything else malformed is a one-line :class:`~engram_jax.core.errors.EngramError` naming the file, the line and the
id: malformed JSON, a line that is not an object, an unknown ``type`` or field, a missing or mistyped field, a
``dataset`` line after the first line, another ``format``, an item or question before any episode, an item after a
question of its episode, a repeated episode, item or question id, a gold id that is no item of the episode, an
episode without items, an empty file, and an unknown id in ``conversations``.

Example:
  >>> import tempfile
  >>> from pathlib import Path
  >>> from engram_jax import Episode, Item, Question
  >>> from engram_jax.data import load_episodes_jsonl, write_episodes_jsonl
  >>> items = (Item('m1', 'I adopted a dog.', 's1', 0), Item('m2', 'The dog is called Rex.', 's2', 1))
  >>> ep = Episode('me', items, (Question('q1', "What is my dog's name?", ('m2',), ('s2',), 0),))
  >>> path = write_episodes_jsonl(Path(tempfile.mkdtemp()) / 'mine.jsonl', [ep], name='mine')
  >>> print(path.read_text().splitlines()[2])
  {"type": "item", "id": "m1", "text": "I adopted a dog.", "parent": "s1"}
  >>> episodes, report = load_episodes_jsonl(path=path)
  >>> episodes == [ep], dict(report.counts)
  (True, {'episodes': 1, 'items': 2, 'questions_read': 1, 'questions_kept': 1})
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from engram_jax.core.errors import DataNotFoundError, EngramError
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data.io import resolve_data_root, type_name
from engram_jax.metrics import boundary

FORMAT = 'engram_jax.episodes/1'
# the fields of each record type: (required, optional)
FIELDS = {
  'dataset': ((), ('format', 'name', 'load_report', 'source', 'meta')),
  'episode': (('id',), ('meta',)),
  'item': (('id', 'text', 'parent'), ('time', 'speaker', 'meta')),
  'question': (('id', 'text', 'gold'), ('gold_parents', 'answer', 'category', 'time', 'meta')),
}
TALLIES = ('episodes', 'items', 'questions_read', 'questions_kept')
# a file this large (bytes) shows a progress bar while it is read
PROGRESS_BYTES = 32 << 20


def find_path(root: str | os.PathLike | None, path: str | os.PathLike | None, *, what: str = 'episodes file') -> Path:
  """``path`` as given (absolute, or relative to the current directory), else relative to the data root; a one-line
  :class:`~engram_jax.core.errors.DataNotFoundError` naming both places otherwise."""
  if path in (None, ''):
    raise EngramError(f'no {what} given: set dataset.loader.path=FILE')
  given = Path(path).expanduser()
  if given.exists() or given.is_absolute():
    if not given.exists():
      raise DataNotFoundError(f'{what} {given} not found')
    return given
  try:
    under = resolve_data_root(root) / given
  except FileNotFoundError:
    under = None
  if under is not None and under.exists():
    return under
  raise DataNotFoundError(
    f'{what} {given} not found (looked in the current directory {Path.cwd()}'
    + (f' and under the data root: {under})' if under is not None else ')')
  )


def _open_text(path: Path):
  raw = gzip.open(path, 'rb') if path.suffix == '.gz' else open(path, 'rb')
  return raw, io.TextIOWrapper(raw, encoding='utf-8', newline='\n')


def _lines(path: Path, progress: bool) -> Iterator[tuple[int, str]]:
  """``(line number from 1, text)`` of every line of ``path``; a progress bar (bytes) on a large file."""
  size = path.stat().st_size
  raw, text = _open_text(path)
  bar = tqdm(total=size, unit='B', unit_scale=True, desc=path.name, disable=not progress or size < PROGRESS_BYTES)
  try:
    with text:
      for n, line in enumerate(text, start=1):
        bar.update(len(line.encode('utf-8')) if not bar.disable else 0)
        yield n, line
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise EngramError(f'{path}: cannot read ({e})') from e
  finally:
    bar.close()
    raw.close()


class _Reader:
  """The state of one read: the current episode, ids seen and the report."""

  def __init__(self, path: Path, shown: str):
    self.path, self.shown = path, shown
    self.episodes: list[Episode] = []
    self.episode_lines: dict[str, int] = {}
    self.question_lines: dict[str, int] = {}
    self.read_ids: list[str] = []
    self.counts: Counter = Counter()
    self.report: LoadReport | None = None  # set by a dataset line that carries one
    self.name: str | None = None
    self.current: dict[str, Any] | None = None

  def fail(self, line: int, what: str) -> EngramError:
    return EngramError(f'{self.shown}:{line}: {what}')

  # ---- fields
  def record(self, line: int, text: str) -> dict[str, Any]:
    try:
      rec = json.loads(text)
    except json.JSONDecodeError as e:
      raise self.fail(line, f'malformed JSON at column {e.colno}: {e.msg}') from None
    if not isinstance(rec, dict):
      raise self.fail(line, f'a record must be a JSON object, got {type_name(rec)}')
    kind = rec.get('type')
    if kind not in FIELDS:
      raise self.fail(line, f'type {kind!r} is not a record type; expected one of {", ".join(FIELDS)}')
    required, optional = FIELDS[kind]
    label = f'{kind} {rec["id"]!r}' if isinstance(rec.get('id'), str) else kind
    missing = [f for f in required if f not in rec]
    if missing:
      raise self.fail(line, f'{label} lacks field {", ".join(map(repr, missing))}')
    unknown = sorted(set(rec) - set(required) - set(optional) - {'type'})
    if unknown:
      raise self.fail(
        line, f'{label} has unknown field {", ".join(map(repr, unknown))}; its fields: {", ".join(required + optional)}'
      )
    return rec

  def string(self, line: int, rec: Mapping[str, Any], field: str, label: str, *, blank: bool = False) -> str:
    value = rec[field]
    if not isinstance(value, str) or (not blank and not value.strip()):
      expected = 'a string' if blank else 'a non-blank string'
      raise self.fail(line, f'{label}: {field} is {type_name(value)} {value!r}, expected {expected}')
    return value

  def optional_string(self, line: int, rec: Mapping[str, Any], field: str, label: str) -> str | None:
    value = rec.get(field)
    if value is not None and not isinstance(value, str):
      raise self.fail(line, f'{label}: {field} is {type_name(value)} {value!r}, expected a string or null')
    return value

  def id_list(self, line: int, rec: Mapping[str, Any], field: str, label: str) -> list[str]:
    value = rec[field]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
      raise self.fail(line, f'{label}: {field} is {value!r}, expected a list of non-blank id strings')
    return value

  # ---- records
  def dataset(self, line: int, rec: Mapping[str, Any], first: bool) -> None:
    if not first:
      raise self.fail(line, 'a dataset record must be the first line of the file')
    fmt = rec.get('format', FORMAT)
    if fmt != FORMAT:
      raise self.fail(line, f'format {fmt!r} is not one this reader reads ({FORMAT})')
    if rec.get('name') is not None:
      self.name = self.string(line, rec, 'name', 'dataset')
    carried = rec.get('load_report')
    if carried is not None:
      try:
        report = LoadReport(str(carried['dataset']), Counter(carried['counts']), dict(carried['examples']))
        report.source = carried.get('file')
      except (KeyError, TypeError, ValueError) as e:
        raise self.fail(line, f'dataset: load_report is not a load report ({type(e).__name__}: {e})') from None
      self.report = report

  def episode(self, line: int, rec: Mapping[str, Any]) -> None:
    self.close_episode()
    eid = self.string(line, rec, 'id', 'episode')
    if eid in self.episode_lines:
      raise self.fail(line, f'episode {eid!r}: repeated episode id (first on line {self.episode_lines[eid]})')
    self.episode_lines[eid] = line
    self.current = {'id': eid, 'line': line, 'items': [], 'item_lines': {}, 'parent': {}, 'questions': []}

  def _in_episode(self, line: int, kind: str, rid: Any) -> dict[str, Any]:
    if self.current is None:
      raise self.fail(line, f'{kind} {rid!r} comes before any episode record (an episode line starts an episode)')
    return self.current

  def item(self, line: int, rec: Mapping[str, Any]) -> None:
    ep = self._in_episode(line, 'item', rec['id'])
    label = f'item {rec["id"]!r} of episode {ep["id"]!r}'
    iid = self.string(line, rec, 'id', label)
    if ep['questions']:
      raise self.fail(line, f'{label} comes after a question of its episode; write the items first, then the questions')
    if iid in ep['item_lines']:
      raise self.fail(line, f'{label}: repeated item id in its episode (first on line {ep["item_lines"][iid]})')
    ep['item_lines'][iid] = line
    parent = self.string(line, rec, 'parent', label)
    ep['parent'][iid] = parent
    ep['items'].append(
      Item(
        id=iid,
        text=self.string(line, rec, 'text', label, blank=True),
        parent=parent,
        position=len(ep['items']),
        time=self.optional_string(line, rec, 'time', label),
        speaker=self.optional_string(line, rec, 'speaker', label),
      )
    )

  def question(self, line: int, rec: Mapping[str, Any], report: LoadReport) -> None:
    ep = self._in_episode(line, 'question', rec['id'])
    label = f'question {rec["id"]!r} of episode {ep["id"]!r}'
    qid = self.string(line, rec, 'id', label)
    if qid in self.question_lines:
      raise self.fail(line, f'{label}: repeated question id (first on line {self.question_lines[qid]})')
    self.question_lines[qid] = line
    self.read_ids.append(qid)
    self.counts['questions_read'] += 1
    text = self.string(line, rec, 'text', label)
    parent = ep['parent']
    gold: list[str] = []
    for g in self.id_list(line, rec, 'gold', label):
      if g not in parent:
        raise self.fail(
          line, f'{label}: gold id {g!r} is no item of episode {ep["id"]!r} (items come before questions)'
        )
      if g in gold:
        report.add('dropped_duplicate_gold_id', (qid, g))
        continue
      gold.append(g)
    if 'gold_parents' in rec:
      gold_parents = tuple(self.id_list(line, rec, 'gold_parents', label))
    else:
      gold_parents = tuple(dict.fromkeys(parent[g] for g in gold))
    answer = rec.get('answer')
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
      report.add('answer_number_stringified', (qid, answer))
      answer = str(answer)
    elif answer is not None and not isinstance(answer, str):
      raise self.fail(line, f'{label}: answer is {type_name(answer)} {answer!r}, expected a string, a number or null')
    category = rec.get('category', 0)
    if isinstance(category, bool) or not isinstance(category, (int, str)) or category == '':
      raise self.fail(line, f'{label}: category is {type_name(category)} {category!r}, expected an integer or a string')
    time = self.optional_string(line, rec, 'time', label)
    if not gold:
      report.add('excluded_no_gold', qid)
      return
    ep['questions'].append(Question(qid, text, tuple(gold), gold_parents, category, answer, time))

  def close_episode(self) -> None:
    ep, self.current = self.current, None
    if ep is None:
      return
    if not ep['items']:
      raise self.fail(
        ep['line'], f'episode {ep["id"]!r} has no items (no item line before the next episode or the end)'
      )
    self.counts['items'] += len(ep['items'])
    self.counts['episodes'] += 1
    self.counts['questions_kept'] += len(ep['questions'])
    self.episodes.append(Episode(ep['id'], tuple(ep['items']), tuple(ep['questions'])))


def load_episodes_jsonl(
  root: str | os.PathLike | None = None,
  *,
  path: str | os.PathLike | None = None,
  conversations: Sequence[str] | None = None,
  progress: bool = True,
) -> tuple[list[Episode], LoadReport]:
  """Read an episodes file (format ``engram_jax.episodes/1``, module docstring) into episodes and a load report.

  Args:
    root: data root, where a relative ``path`` not found from the current directory is looked for.
    path: the file (``.jsonl``, or ``.jsonl.gz``).
    conversations: optional subset of episode ids to keep (the whole file is still checked; the name is the
      LoCoMo loader's, so ``dataset.loader.conversations=[...]`` works on either).
    progress: a progress bar while reading a large file (over 32 MiB).

  Returns:
    ``(episodes, report)`` in file order; ``report.dataset`` is the file's ``name`` (else ``'episodes'``), or the
    carried report's.

  Raises:
    EngramError: one line naming the file, the line and the id (module docstring); DataNotFoundError for a missing
      file.

  Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from engram_jax.data import load_episodes_jsonl
    >>> lines = [
    ...   {'type': 'episode', 'id': 'me'},
    ...   {'type': 'item', 'id': 'm1', 'text': 'I adopted a dog.', 'parent': 's1', 'time': '2024-05-01'},
    ...   {'type': 'item', 'id': 'm2', 'text': 'The dog is called Rex.', 'parent': 's2'},
    ...   {'type': 'question', 'id': 'q1', 'text': "What is my dog's name?", 'gold': ['m2', 'm2'], 'answer': 'Rex'},
    ... ]
    >>> path = Path(tempfile.mkdtemp()) / 'mine.jsonl'
    >>> _ = path.write_text(''.join(json.dumps(x) + '\\n' for x in lines))
    >>> (episode,), report = load_episodes_jsonl(path=path)
    >>> episode.items[1].position, episode.questions[0].gold, episode.questions[0].gold_parents
    (1, ('m2',), ('s2',))
    >>> report.counts['dropped_duplicate_gold_id']
    1
    >>> _ = path.write_text(path.read_text().replace('"gold": ["m2", "m2"]', '"gold": ["m9"]'))
    >>> try:
    ...   load_episodes_jsonl(path=path)
    ... except ValueError as e:
    ...   print(str(e).replace(str(path), 'mine.jsonl'))
    mine.jsonl:4: question 'q1' of episode 'me': gold id 'm9' is no item of episode 'me' (items come before questions)
  """
  if isinstance(conversations, str):
    raise EngramError(f'conversations must be a list of episode ids, got the string {conversations!r}')
  path = find_path(root, path)
  shown = str(path)
  reader = _Reader(path, shown)
  own = LoadReport('episodes')  # what this reader changes; merged into the carried report at the end
  first, last = True, 0
  for line, text in _lines(path, progress):
    last = line
    if not text.strip():
      own.add('blank_lines_skipped', line)
      continue
    rec = reader.record(line, text)
    kind = rec['type']
    if kind == 'dataset':
      reader.dataset(line, rec, first)
    elif kind == 'episode':
      reader.episode(line, rec)
    elif kind == 'item':
      reader.item(line, rec)
    else:
      reader.question(line, rec, own)
    first = False
  if first:
    raise EngramError(
      f'{shown}:{max(last, 1)}: no records (an empty file); expected an episode line, its items and questions'
    )
  reader.close_episode()
  if not reader.episodes:
    raise EngramError(f'{shown}:{last}: no episode record in the file (an episode line starts each episode)')
  episodes = reader.episodes
  if conversations is not None:
    missing = sorted(set(conversations) - {e.id for e in episodes})
    if missing:
      raise EngramError(f'{shown}: unknown episodes {missing} in conversations (the file has {len(episodes)})')
    episodes = [e for e in episodes if e.id in set(conversations)]
  kept = []
  for e in episodes:
    if e.questions:
      kept.append(e)
    else:
      own.add('episodes_without_questions', e.id)
  report = reader.report
  if report is None:
    report = LoadReport(reader.name or 'episodes')
    report.source = shown
    for tally in TALLIES:
      report.add(tally, n=reader.counts[tally])
  for reason, n in own.counts.items():  # what this reader changed, after the carried report's counts
    report.counts[reason] += n
    shown_examples = report.examples.setdefault(reason, []) if reason in own.examples else None
    if shown_examples is not None:
      shown_examples.extend(own.examples[reason][: max(0, 5 - len(shown_examples))])
  report.read_ids = frozenset(reader.read_ids)
  return kept, report


# ---- writing


def _compact(record: Mapping[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in record.items() if v is not None}


def episode_records(
  episodes: Iterable[Episode],
  *,
  name: str | None = None,
  load_report: LoadReport | None = None,
  source: Any = None,
) -> Iterator[dict[str, Any]]:
  """The records of ``episodes`` in file order: a ``dataset`` record first (``name``, ``load_report``, ``source``),
  then per episode its ``episode`` record, its items in write order and its questions. Optional fields that are
  None are left out, and so is ``gold_parents`` when it is the parents of the gold items (the reader's default)."""
  yield _compact(
    {
      'type': 'dataset',
      'format': FORMAT,
      'name': name,
      'load_report': load_report.to_dict() if load_report is not None else None,
      'source': source,
    }
  )
  for ep in episodes:
    yield {'type': 'episode', 'id': ep.id}
    parent = {}
    for it in ep.items:
      parent[it.id] = it.parent
      yield _compact(
        {'type': 'item', 'id': it.id, 'text': it.text, 'parent': it.parent, 'time': it.time, 'speaker': it.speaker}
      )
    for q in ep.questions:
      derived = tuple(dict.fromkeys(parent[g] for g in q.gold))
      rec = {
        'type': 'question',
        'id': q.id,
        'text': q.text,
        'gold': list(q.gold),
        'gold_parents': None if tuple(q.gold_parents) == derived else list(q.gold_parents),
        'answer': q.answer,
        'category': q.category,
        'time': q.time,
      }
      yield _compact(rec)


def write_episodes_jsonl(
  path: str | os.PathLike,
  episodes: Iterable[Episode],
  *,
  name: str | None = None,
  load_report: LoadReport | None = None,
  source: Any = None,
) -> Path:
  """Write ``episodes`` as an episodes file (:func:`episode_records`, one compact JSON object per line, UTF-8 as
  is), atomically: the old file or the whole new one (gzipped, with a fixed header time, when ``path`` ends in
  ``.gz``). Reading it back (:func:`load_episodes_jsonl`) gives the same episodes, and with ``load_report`` the same
  report. Returns ``path``.

  Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from engram_jax import Episode, Item, Question
    >>> from engram_jax.data import write_episodes_jsonl
    >>> ep = Episode('me', (Item('m1', 'I adopted a dog.', 's1', 0),), (Question('q1', 'Pet?', ('m1',), ('s1',), 0),))
    >>> path = write_episodes_jsonl(Path(tempfile.mkdtemp()) / 'mine.jsonl', [ep])
    >>> print(path.read_text(), end='')
    {"type": "dataset", "format": "engram_jax.episodes/1"}
    {"type": "episode", "id": "me"}
    {"type": "item", "id": "m1", "text": "I adopted a dog.", "parent": "s1"}
    {"type": "question", "id": "q1", "text": "Pet?", "gold": ["m1"], "category": 0}
  """
  from engram_jax.data.embed import atomic_write

  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  records = episode_records(episodes, name=name, load_report=load_report, source=source)

  def write(f):
    out = gzip.GzipFile(fileobj=f, mode='wb', mtime=0, filename='') if path.suffix == '.gz' else f
    for rec in records:
      out.write(json.dumps(rec, ensure_ascii=False).encode('utf-8') + b'\n')
    if out is not f:
      out.close()

  atomic_write(path, write)
  return path


# dataset-owned metrics (name -> fn(episode, question, ranked indices, k)); evaluation.evaluate reads these
METRICS = {'parent_recall': boundary.parent_recall_at}

__all__ = ['FORMAT', 'episode_records', 'load_episodes_jsonl', 'write_episodes_jsonl']
