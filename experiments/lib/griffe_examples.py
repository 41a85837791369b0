"""A griffe extension for the docs build (``mkdocs.yml``): doctests render as examples (code with its output).

The library's docstrings head their doctests ``Example:`` (rax's and optax's spelling), and a few end with bare
``>>>`` lines under no heading; griffe's Google-style parser reads only an ``Examples:`` section as examples, and
renders the rest as prose, where ``>>>`` lines and their outputs turn into markdown (``[1.0, 0.0]`` then reads as a
cross-reference). This rewrites the heading, or adds one above a trailing doctest, before parsing; the docstrings
themselves stay as they are (doctest reads them either way).
"""

from __future__ import annotations

import re

import griffe

_HEADING = re.compile(r'^(\s*)Example:\s*$', re.M)
_HAS_EXAMPLES = re.compile(r'^\s*Examples?:\s*$', re.M)


def examples_heading(doc: str) -> str:
  """``doc`` with ``Example:`` renamed ``Examples:``, and a trailing unheaded doctest put under ``Examples:``.

  >>> examples_heading('Sum.\\n\\n>>> 1 + 1\\n2')
  'Sum.\\n\\nExamples:\\n    >>> 1 + 1\\n    2'
  """
  doc = _HEADING.sub(r'\1Examples:', doc)
  if '>>>' not in doc or _HAS_EXAMPLES.search(doc):
    return doc
  lines = doc.split('\n')
  first = next(i for i, line in enumerate(lines) if line.startswith('>>>'))
  tail = lines[first:]
  if any(not line.strip() for line in tail):  # text follows the doctest: leave it as written
    return doc
  return '\n'.join(lines[:first] + ['Examples:'] + ['    ' + line for line in tail])


class ExampleSections(griffe.Extension):
  """Applies :func:`examples_heading` to every loaded object's docstring."""

  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    if obj.docstring is not None:
      obj.docstring.value = examples_heading(obj.docstring.value)
