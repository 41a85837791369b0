"""Locating the data root and reading dataset files with clear errors."""

from __future__ import annotations

import gzip
import json
import os
import string
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engram_jax.core.errors import DataNotFoundError, EngramError

ENV_VAR = 'ENGRAM_DATA_ROOT'

# Where each dataset comes from, for the error raised when a file is missing.
HOW_TO_GET = {
  'locomo': 'LoCoMo: download data/locomo10.json from github.com/snap-research/locomo into <data_root>/locomo/',
  'longmemeval': (
    'LongMemEval: download longmemeval_s_cleaned.json (and longmemeval_oracle.json) from the '
    'Hugging Face dataset xiaowu0162/longmemeval-cleaned into <data_root>/longmemeval/ '
    '(gzip is accepted)'
  ),
  'memoryagentbench': (
    'MemoryAgentBench FactConsolidation: export the Conflict_Resolution split of the Hugging '
    'Face dataset ai-hyz/MemoryAgentBench to <data_root>/memoryagentbench/ '
    "(see that folder's SOURCE.md for the JSON layout)"
  ),
}


def default_data_root() -> Path:
  """The ``shared/data`` folder beside the checkout (``<repo>/../shared/data``)."""
  return Path(__file__).resolve().parents[3] / 'shared' / 'data'


def resolve_data_root(root: str | os.PathLike | None = None) -> Path:
  """Resolve the data root: explicit argument, else ``$ENGRAM_DATA_ROOT``, else :func:`default_data_root`.

  Raises:
    FileNotFoundError: naming where data is expected and how to get it.
  """
  if root in (None, ''):
    root = os.environ.get(ENV_VAR) or default_data_root()
  path = Path(root).expanduser().resolve()
  if not path.is_dir():
    raise DataNotFoundError(
      f'Data root {path} does not exist. Set it with the Hydra option paths.data_root=/path/to/data '
      f'or the environment variable {ENV_VAR}. Expected layout and sources:\n  ' + '\n  '.join(HOW_TO_GET.values())
    )
  return path


def dataset_file(root: str | os.PathLike | None, dataset: str, name: str) -> Path:
  """``<root>/<dataset>/<name>``, or a FileNotFoundError saying how to obtain it."""
  path = resolve_data_root(root) / dataset / name
  if not path.is_file():
    raise DataNotFoundError(f'{path} not found. {HOW_TO_GET.get(dataset, "")}')
  return path


def read_json(path: str | os.PathLike) -> Any:
  """Read a JSON (or gzipped JSON) file; a malformed file raises ValueError naming file, line and column."""
  path = Path(path)
  opener = gzip.open if path.suffix == '.gz' else open
  try:
    with opener(path, 'rb') as f:
      text = f.read().decode('utf-8')  # bytes then decode: ~4x faster than gzip's text mode
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise EngramError(f'{path}: cannot read ({e})') from e
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise EngramError(f'{path}: malformed JSON at line {e.lineno} column {e.colno} (char {e.pos}): {e.msg}') from e


def duplicates(values: Iterable[Hashable]) -> list[Hashable]:
  """The values that occur more than once, in order of first occurrence."""
  return [v for v, c in Counter(values).items() if c > 1]


def reject_duplicates(values: Iterable[Hashable], *, what: str, where: str, note: str = '') -> None:
  """Raise a ValueError ``'<where>: duplicate <what> [...] (<note>)'`` when some value repeats (at most 10 listed)."""
  dup = duplicates(values)
  if dup:
    more = f' and {len(dup) - 10} more' if len(dup) > 10 else ''
    raise EngramError(f'{where}: duplicate {what} {dup[:10]}{more}' + (f' ({note})' if note else ''))


def type_name(value: Any) -> str:
  """The type name used in error messages (``'NoneType'``, ``'list'``, ...)."""
  return type(value).__name__


def check_template(template: Any, *, names: Mapping[str, str], fields: Sequence[str], where: str) -> str:
  """The ``str.format`` template of an item's text: a name of ``names`` (its template) or a template that names at
  least one of ``fields`` and no other; a one-line :class:`EngramError` naming ``where`` otherwise. A template with no
  field (a typo of a name, ``template=plain``) would render every item as the same text.

  Example:
    >>> from engram_jax.data.io import check_template
    >>> check_template('speaker', names={'speaker': '{speaker}: {text}'}, fields=('speaker', 'text'), where='x')
    '{speaker}: {text}'
    >>> try:
    ...   check_template('plain', names={'speaker': '{speaker}: {text}'}, fields=('speaker', 'text'), where='x')
    ... except ValueError as e:
    ...   print(str(e)[:60])
    x: template 'plain' is neither a template name (speaker) nor
  """
  if isinstance(template, str) and template in names:
    return names[template]
  known = f'a template name ({", ".join(names)})'
  if not isinstance(template, str):
    raise EngramError(f'{where}: template must be {known} or a str.format template, got {type_name(template)}')
  try:
    used = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
  except ValueError as e:
    raise EngramError(f'{where}: template {template!r} is not a str.format template ({e})') from None
  base = [f.split('.')[0].split('[')[0] for f in used]
  unknown = sorted({b or '{}' for b in base if b not in fields})
  if not used or unknown:
    said = f'names unknown fields {unknown}' if unknown else 'has no {field}, so every item would read the same'
    raise EngramError(
      f'{where}: template {template!r} is neither {known} nor a str.format template of its fields '
      f'({", ".join("{" + f + "}" for f in fields)}): it {said}'
    )
  return template
