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


def _encode(o: Any, level: int) -> str:
  s = _scalar(o)
  if s is not None:
    return s
  inner = '\n' + ' ' * (level + 1)
  if isinstance(o, dict):
    if not o:
      return '{}'
    parts = [(_escape(k) if type(k) is str else _key(k)) + ': ' + (  # pylint: disable=unidiomatic-typecheck
        float.__repr__(v) if type(v) is float and v - v == 0 else _encode(v, level + 1))  # finite float: fast path
             for k, v in o.items()]
    return '{' + inner + (',' + inner).join(parts) + '\n' + ' ' * level + '}'
  if isinstance(o, (list, tuple)):
    if not o:
      return '[]'
    if all(type(v) is str for v in o):  # pylint: disable=unidiomatic-typecheck
      parts = map(_escape, o)  # e.g. a question's retrieved ids
    else:
      parts = [_encode(v, level + 1) for v in o]
    return '[' + inner + (',' + inner).join(parts) + '\n' + ' ' * level + ']'
  raise TypeError(f'Object of type {o.__class__.__name__} is not JSON serializable')


def dumps(obj: Any) -> str:
  """``json.dumps(obj, indent=1)`` (default settings otherwise: ASCII, NaN allowed, insertion order)."""
  return _encode(obj, 0)
