"""A BEIR folder (the IR field's common layout) read as one episode: ``dataset=beir dataset.loader.path=FOLDER
dataset.loader.split=test``.

Files, as BEIR's ``GenericDataLoader`` reads them:

* ``corpus.jsonl``: one ``{"_id", "title", "text"}`` object per line (``title`` optional; other fields such as
  ``metadata`` are not read);
* ``queries.jsonl``: one ``{"_id", "text"}`` object per line;
* ``qrels/<split>.tsv``: a header line ``query-id corpus-id score``, then one tab-separated judgement per line.

The folder is **one episode** (id: the folder's name) whose items are the corpus documents **in file order, taken as
write order** (BEIR has no time: a recency operator reads the line order, and the load report says so as
``write_order_is_corpus_file_order``). Item text = ``title + ' ' + text`` stripped (BEIR's own dense models embed
this; ``items_with_title`` counts the documents with a title); ``parent`` = the document's own id (a document is its
own record); no time or speaker. The questions are the queries with at least one judgement of score > 0 in the split,
in ``queries.jsonl`` order; gold = their corpus ids with score > 0 (category ``0``). Also counted:

* ``queries_not_in_split``: queries with no judgement in this split (left out);
* ``queries_without_relevant``: queries whose judgements all have score <= 0 (left out);
* ``qrels_score_not_positive``: judgements with score <= 0 (not gold);
* ``graded_relevance_binarised``: judgements with score > 1, read as relevant (the metrics here are binary);
* ``qrels_unknown_corpus_id`` / ``qrels_unknown_query_id``: judgements naming no document / no query (left out);
* ``qrels_duplicate_pair``: a (query, document) pair judged twice (the later judgement wins, as BEIR's dict does);
* ``blank_lines_skipped``; and the tallies ``items``, ``queries_read``, ``qrels_read``, ``questions_kept``.

Malformed input is a one-line :class:`~engram_jax.core.errors.EngramError` naming the file, the line and the id:
malformed JSON, a line that is not an object, a missing or non-string ``_id`` / ``text`` (or a non-string title),
a repeated document or query id, a qrels file without its header or with a line that is not three tab-separated
fields with an integer score, an empty corpus, and a split with no relevant judgement.

Example:
  >>> import json, tempfile
  >>> from pathlib import Path
  >>> from engram_jax.data import load_beir
  >>> d = Path(tempfile.mkdtemp()) / 'tiny'
  >>> (d / 'qrels').mkdir(parents=True)
  >>> docs = [{'_id': 'd1', 'title': 'Dogs', 'text': 'Rex is a dog.'}, {'_id': 'd2', 'title': '', 'text': 'Tax is due.'}]
  >>> _ = (d / 'corpus.jsonl').write_text(''.join(json.dumps(x) + '\\n' for x in docs))
  >>> _ = (d / 'queries.jsonl').write_text(json.dumps({'_id': 'q1', 'text': 'Who is Rex?'}) + '\\n')
  >>> _ = (d / 'qrels' / 'test.tsv').write_text('query-id\\tcorpus-id\\tscore\\nq1\\td1\\t1\\n')
  >>> (episode,), report = load_beir(path=d, split='test')
  >>> [it.text for it in episode.items], episode.questions[0].gold
  (['Dogs Rex is a dog.', 'Tax is due.'], ('d1',))
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engram_jax.core.errors import DataNotFoundError, EngramError
from engram_jax.core.types import Episode, Item, LoadReport, Question
from engram_jax.data.episodes_jsonl import find_path
from engram_jax.data.io import type_name
from engram_jax.metrics import boundary

QRELS_HEADER = ('query-id', 'corpus-id', 'score')
HEADER_LINE = '\t'.join(QRELS_HEADER)


def _jsonl(path: Path, report: LoadReport) -> Iterator[tuple[int, dict[str, Any]]]:
  """``(line, object)`` of every non-blank line of a JSONL file; one-line errors naming the file and the line."""
  if not path.is_file():
    raise DataNotFoundError(f'{path} not found (a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv)')
  with open(path, encoding='utf-8') as f:
    for n, line in enumerate(f, start=1):
      if not line.strip():
        report.add('blank_lines_skipped', f'{path.name}:{n}')
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise EngramError(f'{path}:{n}: malformed JSON at column {e.colno}: {e.msg}') from None
      if not isinstance(rec, dict):
        raise EngramError(f'{path}:{n}: a line must be a JSON object, got {type_name(rec)}')
      yield n, rec


def _field(path: Path, n: int, rec: dict[str, Any], field: str, *, required: bool = True) -> str:
  label = f'{path}:{n}: ' + (f'{rec["_id"]!r}: ' if isinstance(rec.get('_id'), str) and field != '_id' else '')
  if field not in rec:
    if required:
      raise EngramError(f'{label}lacks field {field!r}')
    return ''
  value = rec[field]
  if value is None and not required:
    return ''
  if not isinstance(value, str) or (field == '_id' and not value.strip()):
    raise EngramError(f'{label}{field} is {type_name(value)} {value!r}, expected a string')
  return value


def _read_ids(path: Path, report: LoadReport, what: str) -> list[tuple[int, dict[str, Any], str]]:
  out, first = [], {}
  for n, rec in _jsonl(path, report):
    rid = _field(path, n, rec, '_id')
    if rid in first:
      raise EngramError(f'{path}:{n}: {what} {rid!r}: repeated id (first on line {first[rid]})')
    first[rid] = n
    out.append((n, rec, rid))
  return out


def _qrels(path: Path, report: LoadReport) -> list[tuple[int, str, str, int]]:
  if not path.is_file():
    splits = sorted(p.stem for p in path.parent.glob('*.tsv')) if path.parent.is_dir() else []
    raise DataNotFoundError(f'{path} not found (splits in that folder: {splits or "none"})')
  out = []
  with open(path, encoding='utf-8') as f:
    for n, line in enumerate(f, start=1):
      fields = line.rstrip('\r\n').split('\t')
      if n == 1:
        if tuple(x.strip() for x in fields) != QRELS_HEADER:
          raise EngramError(f'{path}:1: expected the header {HEADER_LINE!r}, got {line.rstrip()!r}')
        continue
      if not line.strip():
        report.add('blank_lines_skipped', f'{path.name}:{n}')
        continue
      if len(fields) != 3:
        raise EngramError(f'{path}:{n}: expected 3 tab-separated fields (query-id, corpus-id, score), got {line!r}')
      try:
        score = int(fields[2])
      except ValueError:
        raise EngramError(f'{path}:{n}: score {fields[2]!r} is not an integer') from None
      out.append((n, fields[0], fields[1], score))
  return out


def load_beir(
  root: str | os.PathLike | None = None, *, path: str | os.PathLike | None = None, split: str = 'test'
) -> tuple[list[Episode], LoadReport]:
  """Read a BEIR folder as one :class:`~engram_jax.core.types.Episode` (module docstring).

  Args:
    root: data root, where a relative ``path`` not found from the current directory is looked for.
    path: the folder holding ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
    split: the qrels file read (``qrels/<split>.tsv``).

  Returns:
    ``([episode], report)``; the report's dataset is ``beir/<folder name>/<split>``.

  Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from engram_jax.data import load_beir
    >>> d = Path(tempfile.mkdtemp()) / 'tiny'
    >>> (d / 'qrels').mkdir(parents=True)
    >>> docs = [{'_id': 'd1', 'title': 'Dogs', 'text': 'Rex is a dog.'}, {'_id': 'd2', 'text': 'Tax is due.'}]
    >>> _ = (d / 'corpus.jsonl').write_text(''.join(json.dumps(x) + '\\n' for x in docs))
    >>> _ = (d / 'queries.jsonl').write_text(json.dumps({'_id': 'q1', 'text': 'Who is Rex?'}) + '\\n')
    >>> _ = (d / 'qrels' / 'test.tsv').write_text('query-id\\tcorpus-id\\tscore\\nq1\\td1\\t2\\n')
    >>> (episode,), report = load_beir(path=d, split='test')
    >>> [it.id for it in episode.items], report.counts['graded_relevance_binarised']
    (['d1', 'd2'], 1)
  """
  folder = find_path(root, path, what='BEIR folder')
  if not folder.is_dir():
    raise EngramError(f'{folder}: a BEIR dataset is a folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)')
  report = LoadReport(f'beir/{folder.name}/{split}')
  report.source = str(folder)
  corpus = folder / 'corpus.jsonl'
  items = []
  for n, rec, did in _read_ids(corpus, report, 'document'):
    title, text = _field(corpus, n, rec, 'title', required=False), _field(corpus, n, rec, 'text')
    if title.strip():
      report.add('items_with_title', did)
    items.append(Item(id=did, text=f'{title} {text}'.strip(), parent=did, position=len(items)))
  if not items:
    raise EngramError(f'{corpus}:1: no documents (an empty corpus)')
  report.add('items', n=len(items))
  report.add('write_order_is_corpus_file_order', f'position = line order of {corpus.name}', n=len(items))
  queries_path = folder / 'queries.jsonl'
  queries = []
  for n, rec, rid in _read_ids(queries_path, report, 'query'):
    text = _field(queries_path, n, rec, 'text')
    if not text.strip():
      raise EngramError(f'{queries_path}:{n}: {rid!r}: text is blank (a query to embed)')
    queries.append((rid, text))
  report.add('queries_read', n=len(queries))
  known_docs, known_queries = {it.id for it in items}, {q for q, _ in queries}
  judged: dict[str, dict[str, int]] = {}
  qrels_path = folder / 'qrels' / f'{split}.tsv'
  rows = _qrels(qrels_path, report)
  report.add('qrels_read', n=len(rows))
  for n, qid, did, score in rows:
    if did not in known_docs:
      report.add('qrels_unknown_corpus_id', (qid, did))
      continue
    if qid not in known_queries:
      report.add('qrels_unknown_query_id', (qid, did))
      continue
    if did in judged.setdefault(qid, {}):
      report.add('qrels_duplicate_pair', (qid, did, f'line {n}'))
    if score <= 0:
      report.add('qrels_score_not_positive', (qid, did, score))
    elif score > 1:
      report.add('graded_relevance_binarised', (qid, did, score))
    judged[qid][did] = score
  questions = []
  for qid, text in queries:
    if qid not in judged:
      report.add('queries_not_in_split', qid)
      continue
    gold = tuple(d for d, s in judged[qid].items() if s > 0)
    if not gold:
      report.add('queries_without_relevant', qid)
      continue
    questions.append(Question(id=qid, text=text, gold=gold, gold_parents=gold, category=0))
  if not questions:
    raise EngramError(f'{qrels_path}: no query of this split has a relevant document (score > 0) in the corpus')
  report.add('questions_kept', n=len(questions))
  report.read_ids = frozenset(q for q, _ in queries)
  return [Episode(id=folder.name, items=tuple(items), questions=tuple(questions))], report


# dataset-owned metrics (name -> fn(episode, question, ranked indices, k)); evaluation.evaluate reads these
METRICS = {'parent_recall': boundary.parent_recall_at}

__all__ = ['load_beir']
