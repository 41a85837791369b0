"""``json.dumps(obj, indent=1)``, byte for byte, at the speed of the C encoder's pieces.

With an ``indent``, CPython's :mod:`json` falls back to its pure-Python generator encoder: a run's ``results.json``
(per-question ids and scores of every pipeline, ~10^5 values on LoCoMo) took 0.1-0.3 s to write, most of a warm
sweep job's own time. :func:`dumps` formats the same tree with ``str.join`` over the C-accelerated string escaper
and ``float.__repr__`` (lists of records, such as the per-question records, column by column through one template),
so the files (and every byte-identity check against earlier runs) do not change
(``tests/experiments/test_jsonfmt.py`` checks it on random trees and on a real run's results).
"""

from __future__ import annotations

import itertools
import json
import operator
from typing import Any

_escape = json.encoder.encode_basestring_ascii  # the C function when available (json's own default)
_INF = float('inf')
_NONFINITE = {'nan': 'NaN', 'inf': 'Infinity', '-inf': '-Infinity'}  # float.__repr__ -> json's spelling


def _float(o: float) -> str:
  if o != o:
    return 'NaN'
  if o == _INF:
    return 'Infinity'
  if o == -_INF:
    return '-Infinity'
  return float.__repr__(o)


def _key(k: Any) -> str:
  """A dict key as json writes it: a string as is, a number, bool or None as the string of its JSON value."""
  if isinstance(k, str):
    return _escape(k)
  s = _scalar(k)
  if s is None:
    raise TypeError(f'keys must be str, int, float, bool or None, not {k.__class__.__name__}')
  return _escape(s)


def _scalar(o: Any) -> str | None:
  if isinstance(o, str):
    return _escape(o)
  if o is None:
    return 'null'
  if o is True:
    return 'true'
  if o is False:
    return 'false'
  if isinstance(o, int):
    return int.__repr__(o)
  if isinstance(o, float):
    return _float(o)
  return None


_NL = ['\n' + ' ' * i for i in range(64)]  # newline + indent of each level


def _nl(level: int) -> str:
  return _NL[level] if level < 64 else '\n' + ' ' * level


def _dict(o: dict, level: int) -> str:
  """A non-empty dict; the common value types (finite float, str, int, dict, list) inline, without a call."""
  inner = _nl(level + 1)
  parts = []
  for k, v in o.items():
    t = type(v)
    if t is float and v - v == 0:
      s = float.__repr__(v)
    elif t is str:
      s = _escape(v)
    elif t is dict:
      s = _dict(v, level + 1) if v else '{}'
    elif t is list:
      s = _list(v, level + 1) if v else '[]'
    elif t is int:
      s = int.__repr__(v)
    else:
      s = _encode(v, level + 1)
    parts.append((_escape(k) if type(k) is str else _key(k)) + ': ' + s)
  return '{' + inner + (',' + inner).join(parts) + _nl(level) + '}'


def _list(o: list | tuple, level: int) -> str:
  """A non-empty list or tuple; all strings (e.g. a question's retrieved ids) or all dicts (records) in one pass."""
  inner = _nl(level + 1)
  types = set(map(type, o))
  if types == {str}:
    parts = map(_escape, o)
  elif types == {dict}:
    parts = _records(o, level + 1)
  else:
    parts = [_encode(v, level + 1) for v in o]
  return '[' + inner + (',' + inner).join(parts) + _nl(level) + ']'


def _records(dicts: list[dict], level: int) -> list[str]:
  """Each of ``dicts`` (a non-empty list of dicts) as ``_dict`` writes it at ``level``; through one template per
  list when they are records (:func:`_template`): a run's ~2,000 per-question records (LoCoMo) are written in about
  half the time it takes one dict at a time (~15 ms less per run)."""
  made = _template(dicts, level)
  if made is None:
    return [_dict(d, level) if d else '{}' for d in dicts]
  template, columns = made
  return [template % row for row in zip(*columns)]


def _template(dicts: list[dict], level: int) -> tuple[str, list[list[str]]] | None:
  """For records (every dict has the same exact-``str`` keys in the same order; no ``1 == True == 1.0`` key can
  collide), a ``%`` template holding the keys, indents and separators, and its columns: each key's values encoded
  in one pass (:func:`_column`); a key whose values are records again is inlined into the template. None for
  anything else."""
  keys = tuple(dicts[0])
  if (
    not keys
    or set(map(type, itertools.chain.from_iterable(dicts))) != {str}
    or not all(map(keys.__eq__, map(tuple, dicts)))
  ):
    return None
  pieces, columns = [], []
  for k in keys:
    values = list(map(operator.itemgetter(k), dicts))
    sub = _template(values, level + 1) if set(map(type, values)) == {dict} else None
    if sub is None:
      pieces.append(_escape(k).replace('%', '%%') + ': %s')
      columns.append(_column(values, level + 1))
    else:
      pieces.append(_escape(k).replace('%', '%%') + ': ' + sub[0])
      columns += sub[1]
  inner = _nl(level + 1)
  return '{' + inner + (',' + inner).join(pieces) + _nl(level) + '}', columns


def _column(values: list, level: int) -> list[str]:
  """``[_encode(v, level) for v in values]`` (non-empty), in one C-level pass when all values have one common type:
  str, int, float (non-finite ones respelled), dict (records again) or list of str."""
  types = set(map(type, values))
  if len(types) == 1:
    t = types.pop()
    if t is str:
      return list(map(_escape, values))
    if t is int:
      return list(map(int.__repr__, values))
    if t is float:
      out = list(map(float.__repr__, values))
      if not _NONFINITE.keys().isdisjoint(out):
        out = [_NONFINITE.get(s, s) for s in out]
      return out
    if t is dict:
      return _records(values, level)
    if t is list and set(map(type, itertools.chain.from_iterable(values))) <= {str}:
      inner = _nl(level + 1)
      head, sep, tail = '[' + inner, ',' + inner, _nl(level) + ']'
      return [head + sep.join(map(_escape, v)) + tail if v else '[]' for v in values]
  return [_encode(v, level) for v in values]


def _encode(o: Any, level: int) -> str:
  s = _scalar(o)
  if s is not None:
    return s
  if isinstance(o, dict):
    return _dict(o, level) if o else '{}'
  if isinstance(o, (list, tuple)):
    return _list(o, level) if o else '[]'
  raise TypeError(f'Object of type {o.__class__.__name__} is not JSON serializable')


def dumps(obj: Any) -> str:
  """``json.dumps(obj, indent=1)`` (default settings otherwise: ASCII, NaN allowed, insertion order)."""
  return _encode(obj, 0)
