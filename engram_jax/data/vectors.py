"""Vectors computed elsewhere, read from a file and matched by id: an embedder that embeds nothing.

The layout (``FORMAT`` 1, docs/vectors.md) is one ``.npz`` archive (``numpy.savez``), read with
``allow_pickle=False``:

* ``items`` ``[N, D]`` float (float16/32/64, read as float32): one row per memory item;
* ``item_episodes``, ``item_ids`` ``[N]`` str: the row's episode id and the item's id within that episode;
* ``questions`` ``[Q, D]`` float, ``question_episodes``, ``question_ids`` ``[Q]`` str: the same for questions;
* optional ``model_id`` ``[]`` str: the model that made the vectors (the run's label; default: the file's stem);
* optional ``item_texts_sha256``, ``question_texts_sha256`` ``[N]``/``[Q]`` str: sha256 (hex, UTF-8) of the text
  each row embeds. When present, every matched row's text is checked against the episode's, so a file written for
  another rendering of the same ids (another template, another dataset option) is refused instead of scored.

Why ``.npz``: numpy alone writes and reads it (any script that computed vectors has numpy), the ids are native
``str`` arrays loaded without pickle (no code runs on load), and it is the embedding cache's own shard format.
safetensors (the fitted artifacts' format) holds numeric tensors only: the ids would have to live in its JSON header.

Why every row is keyed by ``(episode id, id)``, items and questions apart: an item id is unique only within its
episode (LoCoMo's ``D1:3`` is in every conversation; LongMemEval's session ids recur across the questions'
haystacks; FactConsolidation's serials restart per file), a question id only within its dataset, and an item and a
question may share an id. Rows the run does not ask for are allowed (a file of all ten LoCoMo conversations serves
a run on one) and counted as unused.

Every check is a one-line ``EngramError`` naming the file, before any retrieval: not a readable archive, arrays
missing or unknown, ids not ``str``, no rows (an empty file or empty arrays), item and question vectors of different
dimensions (or not the configured ``dim``), NaN/inf or zero rows, duplicate ids; and, against the episodes, ids
missing from the file (how many, the first few) and texts that differ. Rows whose norm is off 1 by ``NORM_TOL`` or
more are divided by their norm and counted (``normalised`` in the report); rows within the tolerance are kept bit
for bit (so a file of the project's own cached vectors gives the same results). ``normalize=False`` refuses them
instead. The encoder's ``spec`` (the key of whatever is cached from it) holds the file's sha256, not its path.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_jax.core.errors import DataNotFoundError, EngramError
from engram_jax.core.types import Episode
from engram_jax.data.embed import NORM_TOL, atomic_write

FORMAT = 1
KINDS = ('item', 'question')
REQUIRED = ('items', 'item_episodes', 'item_ids', 'questions', 'question_episodes', 'question_ids')
OPTIONAL = ('model_id', 'item_texts_sha256', 'question_texts_sha256')
N_EXAMPLES = 3  # ids named in an error message


def text_sha256(text: str) -> str:
  """sha256 (hex) of ``text`` in UTF-8: what ``item_texts_sha256`` / ``question_texts_sha256`` hold."""
  return hashlib.sha256(text.encode('utf-8')).hexdigest()


def _name(key: tuple[str, str]) -> str:
  return f'{key[0]}/{key[1]}'


def _examples(keys: Sequence[tuple[str, str]]) -> str:
  return ', '.join(_name(k) for k in keys[:N_EXAMPLES]) + (', ...' if len(keys) > N_EXAMPLES else '')


@dataclasses.dataclass(frozen=True, eq=False)
class Table:
  """One kind of row (items or questions) of a vectors file."""

  vectors: np.ndarray  # [N, D] float32, unit-norm rows
  rows: dict[tuple[str, str], int]  # (episode id, id) -> row
  texts_sha256: np.ndarray | None  # [N] str, or None when the file has none


@dataclasses.dataclass(frozen=True, eq=False)
class VectorsFile:
  """A vectors file, read and checked (:func:`read_vectors`)."""

  path: str
  sha256: str
  model_id: str
  dim: int
  dtype: str  # the stored dtype of the vectors
  tables: dict[str, Table]  # 'item' / 'question'
  normalised: int  # rows divided by their norm (off 1 by NORM_TOL or more)
  normalised_examples: tuple[str, ...]


def _fail(path: str, message: str) -> EngramError:
  return EngramError(f'vectors file {path}: {message}')


def _arrays(path: str, data: bytes) -> dict[str, np.ndarray]:
  if not zipfile.is_zipfile(io.BytesIO(data)):
    what = 'a single .npy array' if data.startswith(b'\x93NUMPY') else 'not a zip archive'
    raise _fail(path, f'not a readable .npz archive ({what}); write one with numpy.savez (docs/vectors.md)')
  try:
    loaded = np.load(io.BytesIO(data), allow_pickle=False)
    with loaded as z:
      arrays = {k: z[k] for k in z.files}
  except ValueError as e:
    if 'pickle' in str(e):
      raise _fail(
        path,
        'holds Python objects (ids saved as an object array?); save ids as str arrays: np.asarray(ids, dtype=str)',
      ) from None
    raise _fail(path, f'not a readable .npz archive ({e})') from None
  except (OSError, zipfile.BadZipFile, EOFError, KeyError) as e:
    raise _fail(path, f'not a readable .npz archive ({type(e).__name__}: {e})') from None
  other = sorted(k for k, v in arrays.items() if not isinstance(v, np.ndarray))
  if other:
    raise _fail(path, f'not an .npz archive: its members {other} are not numpy arrays; write it with numpy.savez')
  return arrays


def _table(path: str, arrays: dict[str, np.ndarray], kind: str) -> tuple[np.ndarray, list[tuple[str, str]]]:
  """The checked ``[N, D]`` vectors (as stored) and ``(episode, id)`` keys of ``kind``."""
  name = f'{kind}s'
  vecs = arrays[name]
  if vecs.dtype.kind != 'f' or vecs.ndim != 2:
    raise _fail(path, f'{name} is a {vecs.dtype} array of shape {vecs.shape}; expected float [N, D]')
  if vecs.shape[0] == 0 or vecs.shape[1] == 0:
    raise _fail(path, f'holds no {kind} vectors ({name} has shape {vecs.shape})')
  columns = []
  for col in (f'{kind}_episodes', f'{kind}_ids', f'{kind}_texts_sha256'):
    arr = arrays.get(col)
    if arr is None:
      continue
    if arr.dtype.kind != 'U' or arr.ndim != 1:
      raise _fail(
        path, f'{col} is a {arr.dtype} array of shape {arr.shape}; expected str [N] (np.asarray(ids, dtype=str))'
      )
    if len(arr) != len(vecs):
      raise _fail(path, f'{col} has {len(arr)} entries for the {len(vecs)} rows of {name}')
    columns.append(arr)
  keys = list(zip(columns[0].tolist(), columns[1].tolist()))
  seen: set[tuple[str, str]] = set()
  dups = [k for k in keys if k in seen or seen.add(k)]
  if dups:
    dups = list(dict.fromkeys(dups))
    raise _fail(path, f'{len(dups)} duplicate {kind} ids (e.g. {_examples(dups)}): one row per (episode, id)')
  return vecs, keys


def _unit_rows(
  path: str, vecs: np.ndarray, keys: list[tuple[str, str]], kind: str, normalize: bool
) -> tuple[np.ndarray, list[tuple[str, str]]]:
  """``vecs`` as float32 with unit-norm rows (those off by ``NORM_TOL`` or more divided by their norm), and the
  keys of the rows divided."""
  with np.errstate(over='ignore'):
    v = vecs.astype(np.float32)  # a copy: rows are normalised in place
  finite = np.isfinite(v).all(axis=1)  # after the cast: float64 beyond float32's range is inf too
  if not finite.all():
    bad = [k for k, ok in zip(keys, finite) if not ok]
    raise _fail(path, f'{len(bad)} of {len(keys)} {kind} rows hold NaN/inf as float32 (e.g. {_examples(bad)})')
  norms = np.linalg.norm(v.astype(np.float64), axis=1)
  if (norms == 0).any():
    bad = [k for k, n in zip(keys, norms) if n == 0]
    raise _fail(
      path, f'{len(bad)} of {len(keys)} {kind} rows are zero vectors, which have no direction (e.g. {_examples(bad)})'
    )
  off = np.abs(norms - 1.0) >= NORM_TOL
  changed = [k for k, o in zip(keys, off) if o]
  if changed and not normalize:
    worst = int(np.argmax(np.abs(norms - 1.0)))
    raise _fail(
      path,
      f'{len(changed)} of {len(keys)} {kind} rows are not of unit norm (|norm - 1| >= {NORM_TOL}; '
      f'{_name(keys[worst])} has norm {norms[worst]:.6g}): embedder.encoder.normalize=true divides them by their norm, counted',
    )
  if changed:
    v[off] = (v[off].astype(np.float64) / norms[off, None]).astype(np.float32)
  return v, changed


def _parse(path: str, digest: str, data: bytes, normalize: bool) -> VectorsFile:
  arrays = _arrays(path, data)
  if not arrays:
    raise _fail(path, f'an empty archive (no arrays); a vectors file holds {list(REQUIRED)}')
  missing = [k for k in REQUIRED if k not in arrays]
  if missing:
    raise _fail(path, f'lacks the arrays {missing}; a vectors file holds {list(REQUIRED)} (docs/vectors.md)')
  unknown = sorted(set(arrays) - set(REQUIRED) - set(OPTIONAL))
  if unknown:
    raise _fail(
      path, f'unknown arrays {unknown}; a vectors file holds {list(REQUIRED)} and optionally {list(OPTIONAL)}'
    )
  model_id = Path(path).stem
  if 'model_id' in arrays:
    m = arrays['model_id']
    if m.dtype.kind != 'U' or m.ndim != 0 or not str(m).strip():
      raise _fail(
        path, f'model_id is a {m.dtype} array of shape {m.shape}; expected a non-empty str (np.asarray(name))'
      )
    model_id = str(m)
  stored = {kind: _table(path, arrays, kind) for kind in KINDS}
  dims = {kind: int(v.shape[1]) for kind, (v, _) in stored.items()}
  if dims['item'] != dims['question']:
    raise _fail(
      path,
      f'item vectors have {dims["item"]} dims, question vectors {dims["question"]}: one model embeds both',
    )
  tables, changed = {}, []
  for kind, (vecs, keys) in stored.items():
    unit, normed = _unit_rows(path, vecs, keys, kind, normalize)
    changed += normed
    tables[kind] = Table(unit, {k: i for i, k in enumerate(keys)}, arrays.get(f'{kind}_texts_sha256'))
  return VectorsFile(
    path=path,
    sha256=digest,
    model_id=model_id,
    dim=dims['item'],
    dtype=str(arrays['items'].dtype),
    tables=tables,
    normalised=len(changed),
    normalised_examples=tuple(_name(k) for k in changed[:N_EXAMPLES]),
  )


_PARSED: dict[tuple[str, bool], VectorsFile] = {}  # (sha256, normalize) -> the file read; errors are not kept
_PARSED_MAX = 4


def read_vectors(path: str | os.PathLike, *, normalize: bool = True, dim: int | None = None) -> VectorsFile:
  """Read and check a vectors file (the layout in this module's docstring).

  Args:
    path: the ``.npz`` file.
    normalize: divide rows not of unit norm by their norm, counted (``VectorsFile.normalised``); False: refuse them.
    dim: the dimension the vectors must have (None: any).

  Returns:
    The checked file; parsed once per process per content (its sha256), whatever the path.

  Raises:
    EngramError: one line naming the file, for each problem listed in the module's docstring.
  """
  p = Path(path).expanduser()
  if not p.is_file():
    raise DataNotFoundError(f'vectors file {p}: no such file (embedder.path)')
  data = p.read_bytes()
  if not data:
    raise _fail(str(p), 'an empty file (0 bytes)')
  digest = hashlib.sha256(data).hexdigest()
  key = (digest, bool(normalize))
  found = _PARSED.get(key)
  if found is None:
    found = _parse(str(p), digest, data, bool(normalize))
    if len(_PARSED) >= _PARSED_MAX:
      _PARSED.pop(next(iter(_PARSED)))
    _PARSED[key] = found
  elif found.path != str(p):  # the same content under another path: named as asked
    found = dataclasses.replace(found, path=str(p))
  if dim is not None and found.dim != int(dim):
    raise _fail(str(p), f'{found.dim}-dim vectors, but the embedder says dim {dim}')
  return found


def file_model_id(path: str | os.PathLike | None) -> str:
  """The label of the vectors file at ``path``: its ``model_id``, else its stem (``'vectors'`` without a path).
  Reads that one array; never raises (a bad file is refused, in one line, when :func:`read_vectors` reads it)."""
  if not path:
    return 'vectors'
  try:
    with np.load(Path(path).expanduser(), allow_pickle=False) as z:
      m = z['model_id'] if 'model_id' in z.files else None
  except Exception:  # not there, not an archive, a member that is not an array: read_vectors says which
    m = None
  if isinstance(m, np.ndarray) and m.dtype.kind == 'U' and m.ndim == 0 and str(m).strip():
    return str(m)
  return Path(path).stem


@dataclasses.dataclass(frozen=True, eq=False)
class VectorsEncoder:
  """The embedder of a vectors file: ``lookup(episodes)`` gathers each episode's item and question rows by id.

  It embeds no text (``__call__`` refuses): callers that hold episodes use ``by_id`` (as
  :func:`engram_jax.eval.evaluation.embed_episodes` does). ``spec`` (what keys any cache of its vectors) holds the
  file's sha256, its dimension and the normalisation setting, never the path.
  """

  path: str  # '' when none is given (refused on first use)
  normalize: bool = True
  dim: int | None = None

  @functools.cached_property
  def file(self) -> VectorsFile:
    """The file, read and checked on first use (:func:`read_vectors`); a missing path or a bad ``dim`` is one line
    here too (not in the factory, whose errors Hydra's ``instantiate`` would wrap in a multi-line message)."""
    if not self.path:
      raise EngramError('embedder=vectors needs the file: embedder.path=FILE.npz (docs/vectors.md)')
    if self.dim is not None and (isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1):
      raise EngramError(f'embedder.encoder.dim must be an integer >= 1 or null, got {self.dim!r}')
    return read_vectors(self.path, normalize=self.normalize, dim=self.dim)

  @property
  def model_id(self) -> str:
    return self.file.model_id

  @functools.cached_property
  def spec(self) -> dict[str, Any]:
    f = self.file
    return {'kind': 'vectors', 'format': FORMAT, 'sha256': f.sha256, 'dim': f.dim, 'normalize': self.normalize}

  def __call__(self, texts: list[str]) -> np.ndarray:
    raise EngramError(
      f'the vectors embedder ({self.path}) reads vectors by (episode, id) and cannot embed {len(texts)} texts; '
      'use it where episodes are embedded (evaluate, fit, grids)'
    )

  def lookup(self, episodes: Sequence[Episode]) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """``([(docs [N, D], queries [Q, D])] per episode, report)``: the rows of each episode's items and questions.

    Raises:
      EngramError: (one line) when ids are missing from the file (how many, the first few) or, where the file holds
        text hashes, when a row's text differs from the episode's.
    """
    f = self.file
    wanted = {
      'item': [(ep.id, it.id, it.text) for ep in episodes for it in ep.items],
      'question': [(ep.id, q.id, q.text) for ep in episodes for q in ep.questions],
    }
    rows, missing, differ = {}, {}, {}
    for kind, asked in wanted.items():
      table = f.tables[kind]
      rows[kind] = [table.rows.get((e, i), -1) for e, i, _ in asked]
      missing[kind] = [(e, i) for (e, i, _), r in zip(asked, rows[kind]) if r < 0]
      differ[kind] = []
      if table.texts_sha256 is not None:
        differ[kind] = [
          (e, i) for (e, i, t), r in zip(asked, rows[kind]) if r >= 0 and table.texts_sha256[r] != text_sha256(t)
        ]
    if missing['item'] or missing['question']:
      parts = [
        f'{len(missing[k])} of {len(wanted[k])} {k} ids (e.g. {_examples(missing[k])})' for k in KINDS if missing[k]
      ]
      raise _fail(
        f.path,
        f'lacks {" and ".join(parts)} of the episodes to embed: it was written for other episodes or another '
        'dataset option (export the ids with python -m experiments.export_vectors ... texts=true)',
      )
    if differ['item'] or differ['question']:
      parts = [
        f'{len(differ[k])} of {len(wanted[k])} {k} texts (e.g. {_examples(differ[k])})' for k in KINDS if differ[k]
      ]
      raise _fail(
        f.path,
        f'{" and ".join(parts)} differ from those its vectors were computed from (another template or dataset '
        "option?): recompute them from this run's texts (texts=true export)",
      )
    out, a, b = [], 0, 0
    items, questions = f.tables['item'].vectors, f.tables['question'].vectors
    item_rows, question_rows = np.asarray(rows['item'], np.int64), np.asarray(rows['question'], np.int64)
    for ep in episodes:
      n, q = ep.n_items, len(ep.questions)
      out.append((items[item_rows[a : a + n]], questions[question_rows[b : b + q]]))
      a, b = a + n, b + q
    used = {k: len(set(rows[k])) for k in KINDS}
    report = {
      'kind': 'vectors',
      'model_id': f.model_id,
      'file': f.path,
      'sha256': f.sha256,
      'dim': f.dim,
      'dtype': f.dtype,
      'items': len(wanted['item']),
      'questions': len(wanted['question']),
      'unused_item_rows': len(f.tables['item'].rows) - used['item'],
      'unused_question_rows': len(f.tables['question'].rows) - used['question'],
      'normalised': f.normalised,
      'normalised_examples': list(f.normalised_examples),
      'texts_checked': all(f.tables[k].texts_sha256 is not None for k in KINDS),
    }
    return out, report

  def by_id(self, episodes: Sequence[Episode]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(docs [N, D], queries [Q, D])]`` per episode (:meth:`lookup` without its report)."""
    return self.lookup(episodes)[0]


def vectors_encoder(
  path: str | os.PathLike | None = None, *, normalize: bool = True, dim: int | None = None
) -> VectorsEncoder:
  """A :class:`VectorsEncoder` of the file at ``path``; nothing is read or checked until it is used (``.file``)."""
  return VectorsEncoder(str(path) if path else '', bool(normalize), dim)


def file_rows(
  episodes: Sequence[Episode], embeddings: Sequence[tuple[np.ndarray, np.ndarray]], kind: str
) -> tuple[list[tuple[str, str]], list[str], np.ndarray]:
  """The rows of a vectors file for ``kind`` ('item' or 'question'): ``(episode id, id)`` keys, texts and vectors
  ``[R, D]`` in episode order, an (episode, id) read twice kept once when its vector agrees."""
  keys, texts, vecs, seen = [], [], [], {}
  for ep, (docs, queries) in zip(episodes, embeddings, strict=True):
    entries = ep.items if kind == 'item' else ep.questions
    rows = np.asarray(docs if kind == 'item' else queries)
    if len(rows) != len(entries):
      raise EngramError(f'episode {ep.id}: {len(rows)} {kind} vectors for {len(entries)} {kind}s')
    for entry, v in zip(entries, rows):
      key = (ep.id, entry.id)
      if key in seen:  # the same episode read twice (a dataset and a training set): written once if it agrees
        j = seen[key]
        if texts[j] != entry.text or not np.array_equal(vecs[j], v):
          raise EngramError(f'{kind} {_name(key)} appears twice with different texts or vectors')
        continue
      seen[key] = len(keys)
      keys.append(key)
      texts.append(entry.text)
      vecs.append(v)
  dim = embeddings[0][0].shape[-1] if embeddings else 0
  return keys, texts, np.asarray(vecs, np.float32).reshape(len(vecs), dim)


def write_vectors(
  path: str | os.PathLike,
  episodes: Sequence[Episode],
  embeddings: Sequence[tuple[np.ndarray, np.ndarray]],
  *,
  model_id: str,
) -> dict[str, Any]:
  """Write ``embeddings`` (``[(docs [N, D], queries [Q, D])]`` per episode, as
  :func:`engram_jax.eval.evaluation.embed_episodes` returns them) as a vectors file, with the text hashes, atomically
  (a temporary file renamed last). An episode given twice is written once. Returns what was written
  (``path``, ``sha256``, rows, ``dim``); the file reads back through :func:`read_vectors` to the same float32 rows.

  Example:
    >>> import tempfile, numpy as np
    >>> from engram_jax import Episode, Item, Question
    >>> from engram_jax.data.vectors import read_vectors, write_vectors
    >>> ep = Episode('e1', (Item('a', 'a dog', 'S1', 0), Item('b', 'an invoice', 'S1', 1)),
    ...              (Question('q1', 'which pet?', ('a',), ('S1',), 1),))
    >>> docs, query = np.eye(3, dtype=np.float32)[:2], np.eye(3, dtype=np.float32)[:1]
    >>> with tempfile.TemporaryDirectory() as d:
    ...   info = write_vectors(f'{d}/v.npz', [ep], [(docs, query)], model_id='toy')
    ...   f = read_vectors(f'{d}/v.npz')
    >>> info['items'], info['questions'], f.dim, f.model_id
    (2, 1, 3, 'toy')
  """
  arrays: dict[str, np.ndarray] = {'model_id': np.asarray(str(model_id))}
  counts = {}
  for kind in KINDS:
    keys, texts, vecs = file_rows(episodes, embeddings, kind)
    arrays[f'{kind}s'] = vecs
    arrays[f'{kind}_episodes'] = np.asarray([e for e, _ in keys], dtype=str)
    arrays[f'{kind}_ids'] = np.asarray([i for _, i in keys], dtype=str)
    arrays[f'{kind}_texts_sha256'] = np.asarray([text_sha256(t) for t in texts], dtype=str)
    counts[f'{kind}s'] = len(keys)
  out = Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  atomic_write(out, lambda fh: np.savez(fh, **arrays))
  h = hashlib.sha256()
  with open(out, 'rb') as fh:
    for block in iter(lambda: fh.read(1 << 20), b''):
      h.update(block)
  return {'path': str(out), 'sha256': h.hexdigest(), **counts, 'dim': int(arrays['items'].shape[1])}


def write_texts(path: str | os.PathLike, episodes: Sequence[Episode]) -> dict[str, Any]:
  """Write the texts to embed elsewhere as JSONL, one object per row of a vectors file:
  ``{"kind": "item"|"question", "episode": ..., "id": ..., "text": ...}`` (items, then questions; an episode given
  twice is written once), atomically. Returns ``path`` and the rows written per kind."""
  lines, seen, counts = [], set(), {'items': 0, 'questions': 0}
  for kind in KINDS:
    for ep in episodes:
      for entry in ep.items if kind == 'item' else ep.questions:
        if (kind, ep.id, entry.id) in seen:
          continue
        seen.add((kind, ep.id, entry.id))
        lines.append(
          json.dumps({'kind': kind, 'episode': ep.id, 'id': entry.id, 'text': entry.text}, ensure_ascii=False)
        )
        counts[f'{kind}s'] += 1
  out = Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  text = ''.join(line + '\n' for line in lines)
  atomic_write(out, lambda fh: fh.write(text.encode('utf-8')))
  return {'path': str(out), **counts}
