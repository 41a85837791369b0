"""Seeded, fixed pilot sets and training splits asserted disjoint from the scored questions.

Pilot sets (seed :data:`PILOT_SEED` = 20261008), committed as text files under ``engram_jax/data/pilot/`` (one
question id per line, sorted):

* ``longmemeval_s.txt``: 100 of the 498 LongMemEval_S question ids, drawn with
  ``random.Random(seed).sample(sorted(ids), 100)`` from all ids (abstention and no-user-evidence questions included;
  the official skip rules decide at the metric step which of them are scored);
* ``factconsolidation_sh_6k.txt``, ``factconsolidation_mh_6k.txt``: all 100 ``qa_pair_ids`` of each 6K row (a draw
  of 100 out of 100).

Regenerate with ``python -m engram_jax.data.splits`` (needs the data root); ``tests/test_splits.py`` checks that
regenerating gives the committed lists.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path

from engram_jax.data.io import dataset_file, read_json

PILOT_SEED = 20261008
PILOT_DIR = Path(__file__).resolve().parent / 'pilot'
PILOT_SIZES = {'longmemeval_s': 100, 'factconsolidation_sh_6k': 100, 'factconsolidation_mh_6k': 100}


def draw_ids(ids: Iterable[str], *, n: int, seed: int) -> list[str]:
  """``n`` distinct ids drawn with ``random.Random(seed)`` from the sorted distinct ``ids``; returned sorted.

  Raises:
    ValueError: when fewer than ``n`` distinct ids are given.
  """
  pool = sorted(set(ids))
  if n > len(pool):
    raise ValueError(f'cannot draw {n} ids from {len(pool)}')
  return sorted(random.Random(seed).sample(pool, n))


def candidate_ids(name: str, root: str | os.PathLike | None = None) -> list[str]:
  """All question ids a pilot set is drawn from, read from the data (LongMemEval_S takes a few seconds)."""
  if name == 'longmemeval_s':
    from engram_jax.data.longmemeval import read_longmemeval  # pylint: disable=import-outside-toplevel
    return [e['question_id'] for e in read_longmemeval(root, split='s')]
  if name in ('factconsolidation_sh_6k', 'factconsolidation_mh_6k'):
    from engram_jax.data.factconsolidation import FILES  # pylint: disable=import-outside-toplevel
    path = dataset_file(root, 'memoryagentbench', FILES['6k'])
    rows = [r for r in read_json(path)['data'] if r['metadata']['source'] == name]
    if len(rows) != 1:
      raise ValueError(f'{path}: expected one row with source {name!r}, found {len(rows)}')
    return list(rows[0]['metadata']['qa_pair_ids'])
  raise ValueError(f'Unknown pilot set {name!r}; known: {sorted(PILOT_SIZES)}')


def generate_pilot_ids(name: str, *, root: str | os.PathLike | None = None, seed: int = PILOT_SEED,
                       ids: Iterable[str] | None = None) -> list[str]:
  """Draw pilot set ``name`` from the data (or from ``ids`` when given, to skip re-reading it)."""
  pool = candidate_ids(name, root) if ids is None else list(ids)
  return draw_ids(pool, n=PILOT_SIZES[name], seed=seed)


def pilot_ids(name: str, *, pilot_dir: str | os.PathLike = PILOT_DIR) -> list[str]:
  """The committed pilot set ``name`` (one of :data:`PILOT_SIZES`), as written by :func:`write_pilot_ids`."""
  if name not in PILOT_SIZES:
    raise ValueError(f'Unknown pilot set {name!r}; known: {sorted(PILOT_SIZES)}')
  path = Path(pilot_dir) / f'{name}.txt'
  ids = [line.strip() for line in path.read_text(encoding='utf-8').splitlines() if line.strip()]
  if len(ids) != PILOT_SIZES[name] or len(set(ids)) != len(ids):
    raise ValueError(f'{path}: expected {PILOT_SIZES[name]} distinct ids, found {len(ids)} ({len(set(ids))} distinct)')
  return ids


def write_pilot_ids(*, root: str | os.PathLike | None = None, pilot_dir: str | os.PathLike = PILOT_DIR,
                    seed: int = PILOT_SEED) -> dict[str, Path]:
  """Regenerate every pilot set from the data and write ``<pilot_dir>/<name>.txt``; returns the paths."""
  out = {}
  Path(pilot_dir).mkdir(parents=True, exist_ok=True)
  for name in PILOT_SIZES:
    path = Path(pilot_dir) / f'{name}.txt'
    path.write_text(''.join(f'{i}\n' for i in generate_pilot_ids(name, root=root, seed=seed)), encoding='utf-8')
    out[name] = path
  return out


def assert_disjoint(train: Iterable[str], scored: Iterable[str]) -> None:
  """Raise ValueError naming the ids that are both in ``train`` and in ``scored``."""
  overlap = sorted(set(train) & set(scored))
  if overlap:
    shown = ', '.join(overlap[:20]) + (f', ... ({len(overlap)} in all)' if len(overlap) > 20 else '')
    raise ValueError(f'training ids overlap the scored ids: {shown}')


def disjoint_split(ids: Iterable[str], *, scored: Iterable[str], seed: int, n_train: int) -> list[str]:
  """Draw ``n_train`` training ids from ``ids`` minus ``scored`` (seeded, sorted), asserted disjoint from ``scored``.

  Raises:
    ValueError: when fewer than ``n_train`` ids remain outside ``scored``.
  """
  scored = set(scored)
  pool = sorted(set(ids) - scored)
  if n_train > len(pool):
    raise ValueError(f'only {len(pool)} ids lie outside the scored set; cannot draw {n_train} training ids')
  train = draw_ids(pool, n=n_train, seed=seed)
  assert_disjoint(train, scored)
  return train


def main() -> None:
  """Regenerate the committed pilot files (``python -m engram_jax.data.splits``)."""
  for name, path in write_pilot_ids().items():
    print(f'{name}: {PILOT_SIZES[name]} ids -> {path}')


if __name__ == '__main__':
  main()
