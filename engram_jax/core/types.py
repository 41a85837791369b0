"""Plain data types at the loader boundary (no JAX here).

An :class:`Episode` is one retrieval problem: a corpus of memory items in write order and the
questions asked against it. Loaders return ``(episodes, LoadReport)``; nothing is dropped or
normalised without being counted in the report.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any


@dataclasses.dataclass(frozen=True)
class Item:
  """One memory item.

  Attributes:
    id: unique within its episode (LoCoMo ``dia_id``, LongMemEval turn id, fact serial).
    text: the text that is embedded and indexed (already rendered from a template).
    parent: the id of the enclosing unit (session / record) for parent-level metrics.
    position: write order, ``0..N-1``; a larger position was written later.
    time: timestamp string as given by the source, or ``None``.
    speaker: speaker or role, or ``None``.

  Example:
    >>> from engram_jax import Item
    >>> Item(id='D1:1', text='I adopted a dog.', parent='S1', position=0, speaker='Caroline').parent
    'S1'
  """

  id: str
  text: str
  parent: str
  position: int
  time: str | None = None
  speaker: str | None = None


@dataclasses.dataclass(frozen=True)
class Question:
  """One question against an episode.

  Attributes:
    id: unique across the dataset.
    text: the question text.
    gold: ids of the items that hold the evidence (non-empty for scored questions).
    gold_parents: ids of the parents of the gold items (or upstream parent-level gold).
    category: category integer / type string as stored upstream.
    answer: the gold answer (stringified), or ``None``.
    time: question timestamp when the source has one.

  Example:
    >>> from engram_jax import Question
    >>> q = Question(id='q1', text='What pet did Caroline adopt?', gold=('D1:1',), gold_parents=('S1',), category=4)
    >>> q.gold
    ('D1:1',)
  """

  id: str
  text: str
  gold: tuple[str, ...]
  gold_parents: tuple[str, ...]
  category: int | str
  answer: str | None = None
  time: str | None = None


@dataclasses.dataclass(frozen=True)
class Episode:
  """A corpus of items (in write order) and the questions asked against it.

  Example:
    >>> from engram_jax import Episode, Item, Question
    >>> items = (Item('D1:1', 'I adopted a dog.', 'S1', 0), Item('D1:2', 'The invoice is overdue.', 'S1', 1))
    >>> ep = Episode('conv-0', items, (Question('q1', 'Which pet?', ('D1:1',), ('S1',), 4),))
    >>> ep.n_items, len(ep.questions)
    (2, 1)
  """

  id: str
  items: tuple[Item, ...]
  questions: tuple[Question, ...]

  def __post_init__(self) -> None:
    ids = [it.id for it in self.items]
    if len(set(ids)) != len(ids):
      dup = [k for k, v in Counter(ids).items() if v > 1][:5]
      raise ValueError(f'Episode {self.id}: duplicate item ids {dup}')
    for i, it in enumerate(self.items):
      if it.position != i:
        raise ValueError(f'Episode {self.id}: item {it.id} has position {it.position}, expected {i}')
    known = set(ids)
    for q in self.questions:
      if not q.gold:
        raise ValueError(f'Episode {self.id}: question {q.id} has no gold items')
      missing = [g for g in q.gold if g not in known]
      if missing:
        raise ValueError(f'Episode {self.id}: question {q.id} has unknown gold ids {missing}')

  @property
  def n_items(self) -> int:
    return len(self.items)

  def index_of(self) -> dict[str, int]:
    """Item id -> row index."""
    return {it.id: i for i, it in enumerate(self.items)}


@dataclasses.dataclass
class LoadReport:
  """Counts of everything a loader normalised, dropped or excluded, with examples.

  ``counts`` maps a short reason to a count; ``examples`` keeps up to 5 examples per reason.
  """

  dataset: str
  counts: Counter = dataclasses.field(default_factory=Counter)
  examples: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
  # every question id the loader read from the data, before its own exclusions (None: it does not say); not
  # written to the report's files, used to count pilot ids that are missing from the data
  read_ids: frozenset[str] | None = dataclasses.field(default=None, compare=False, repr=False)
  # the file read, when a loader chooses among several (LongMemEval: upstream's file wins over our copy); written to
  # the report's files as ``file`` (absent when None)
  source: str | None = None

  def add(self, reason: str, example: Any = None, n: int = 1) -> None:
    self.counts[reason] += n
    if example is not None:
      ex = self.examples.setdefault(reason, [])
      if len(ex) < 5:
        ex.append(example)

  def to_dict(self) -> dict[str, Any]:
    out = {'dataset': self.dataset, 'counts': dict(self.counts), 'examples': self.examples}
    if self.source is not None:
      out['file'] = self.source
    return out

  def summary(self) -> str:
    lines = [f'[{self.dataset}] load report' + (f' ({self.source}):' if self.source is not None else ':')]
    for k in sorted(self.counts):
      lines.append(f'  {k}: {self.counts[k]}' + (f'  e.g. {self.examples[k][:3]}' if k in self.examples else ''))
    return '\n'.join(lines)
