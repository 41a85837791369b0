"""The one spelling of an id in a TREC file (run or qrels): ``%`` and whitespace percent-encoded.

It lives in the core so that the readers of TREC files (the ``trec_run`` operator) and their writers
(:mod:`engram_jax.eval.trec`) share it without the operators importing the evaluation layer.
"""

from __future__ import annotations

import re

_ESCAPE = re.compile(r'[%\s]')


def trec_id(value: str) -> str:
  """``value`` with ``%`` and every whitespace character percent-encoded (``'a b'`` -> ``'a%20b'``), so that it is
  one field of a whitespace-separated line; ids without them are written as they are.

  >>> trec_id('q 1'), trec_id('D1:3')
  ('q%201', 'D1:3')
  """
  return _ESCAPE.sub(lambda m: ''.join(f'%{b:02X}' for b in m.group().encode('utf-8')), str(value))
