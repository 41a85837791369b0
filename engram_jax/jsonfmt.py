"""``json.dumps(obj, indent=1)``, byte for byte, at the speed of the C encoder's pieces.

With an ``indent``, CPython's :mod:`json` falls back to its pure-Python generator encoder: a run's ``results.json``
(per-question ids and scores of every pipeline, ~10^5 values on LoCoMo) took 0.1-0.3 s to write, most of a warm
sweep job's own time. :func:`dumps` formats the same tree with ``str.join`` over the C-accelerated string escaper
and ``float.__repr__``, so the files (and every byte-identity check against earlier runs) do not change
(``tests/test_jsonfmt.py`` checks it on random trees and on a real run's results).
"""

from __future__ import annotations

import json
from typing import Any

_escape = json.encoder.encode_basestring_ascii  # the C function when available (json's own default)
_INF = float('inf')


def _float(o: float) -> str:
  if o != o:  # pylint: disable=comparison-with-itself
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
    parts.append((_escape(k) if type(k) is str else _key(k)) + ': ' + s)  # pylint: disable=unidiomatic-typecheck
  return '{' + inner + (',' + inner).join(parts) + _nl(level) + '}'


def _list(o: list | tuple, level: int) -> str:
  """A non-empty list or tuple; all strings (e.g. a question's retrieved ids) or all dicts (records) in one pass."""
  inner = _nl(level + 1)
  types = set(map(type, o))
  if types == {str}:
    parts = map(_escape, o)
  elif types == {dict}:
    parts = [_dict(v, level + 1) if v else '{}' for v in o]
  else:
    parts = [_encode(v, level + 1) for v in o]
  return '[' + inner + (',' + inner).join(parts) + _nl(level) + ']'


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
