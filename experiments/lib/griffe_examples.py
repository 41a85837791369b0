"""A griffe extension for the docs build (``mkdocs.yml``): ``Example:`` sections render as examples.

The library's docstrings head their doctests ``Example:`` (rax's and optax's spelling); griffe's Google-style parser
reads only ``Examples:`` as an examples section (code with its output) and would render the singular as a prose
admonition, where ``>>>`` lines and their outputs turn into markdown. This rewrites the heading before parsing; the
docstrings themselves stay as they are (and doctest reads them either way).
"""

from __future__ import annotations

import re

import griffe

_HEADING = re.compile(r'^(\s*)Example:\s*$', re.M)


class ExampleSections(griffe.Extension):
  """Renames every ``Example:`` section heading of a loaded object's docstring to ``Examples:``."""

  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    if obj.docstring is not None:
      obj.docstring.value = _HEADING.sub(r'\1Examples:', obj.docstring.value)
