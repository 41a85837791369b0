"""Seeded, fixed pilot sets and training splits asserted disjoint from the scored questions.

Pilot sets (seed :data:`PILOT_SEED` = 20261008), committed as text files under ``engram_jax/data/pilot/`` (one
question id per line, sorted):

* ``longmemeval_s.txt``: 100 of the 498 LongMemEval_S question ids, drawn with
  ``random.Random(seed).sample(sorted(ids), 100)`` from all ids (abstention and no-user-evidence questions included;
  the official skip rules decide at the metric step which of them are scored);
* ``factconsolidation_sh_6k.txt``, ``factconsolidation_mh_6k.txt``: all 100 ``qa_pair_ids`` of each 6K row (a draw
  of 100 out of 100);
* ``locomo_answer.txt``: the LoCoMo answer pilot (Tier 1), 300 question ids of the loaded LoCoMo questions,
  60 per category (1-5): ``random.Random(seed).sample(sorted(ids of the category), 60)`` per category in order 1..5
  with one generator (:func:`draw_stratified`).

Regenerate with ``python -m engram_jax.data.splits`` (needs the data root); ``tests/data/test_splits.py`` checks that
regenerating gives the committed lists.

Parts pinned beside them (:func:`pinned_part`): ``<pilot>.<part>.n<n_train>.seed<seed>.txt`` holds the ``train`` or
``confirm`` ids of :func:`load_part` as drawn from our copy of the data (for LongMemEval_S: the 498-question copy,
after the official skips), so that a part does not move with the file's contents (upstream's 500-question file would
change the training draw). Where such a list exists, :func:`load_part` takes the part from it and counts (and logs)
the pinned questions missing from the data; ``python -m engram_jax.data.splits parts`` writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, LoadReport, Question
from engram_jax.data.io import dataset_file, read_json

log = logging.getLogger(__name__)

PILOT_SEED = 20261008
# the parts pinned by committed id lists: (pilot set, n_train, seed)
PINNED_PARTS = (('longmemeval_s', 100, PILOT_SEED),)
PILOT_DIR = Path(__file__).resolve().parent / 'pilot'
PILOT_SIZES = {
  'longmemeval_s': 100,
  'factconsolidation_sh_6k': 100,
  'factconsolidation_mh_6k': 100,
  'locomo_answer': 300,
}
LOCOMO_ANSWER_PER_CATEGORY = 60


def draw_ids(ids: Iterable[str], *, n: int, seed: int) -> list[str]:
  """``n`` distinct ids drawn with ``random.Random(seed)`` from the sorted distinct ``ids``; returned sorted.

  Raises:
    ValueError: when fewer than ``n`` distinct ids are given.
  """
  pool = sorted(set(ids))
  if n > len(pool):
    raise EngramError(f'cannot draw {n} ids from {len(pool)}')
  return sorted(random.Random(seed).sample(pool, n))


def draw_stratified(ids_by_stratum: dict[int | str, Iterable[str]], *, n_per: int, seed: int) -> list[str]:
  """``n_per`` distinct ids from each stratum (strata in sorted order, one ``random.Random(seed)``, each stratum's
  ids sorted first); returned sorted.

  Raises:
    ValueError: when a stratum has fewer than ``n_per`` distinct ids.
  """
  rng = random.Random(seed)
  out: list[str] = []
  for key in sorted(ids_by_stratum, key=str):
    pool = sorted(set(ids_by_stratum[key]))
    if n_per > len(pool):
      raise EngramError(f'stratum {key!r}: cannot draw {n_per} ids from {len(pool)}')
    out.extend(rng.sample(pool, n_per))
  return sorted(out)


def locomo_ids_by_category(root: str | os.PathLike | None = None) -> dict[int | str, list[str]]:
  """The loaded LoCoMo question ids (questions with resolvable evidence) by category."""
  from engram_jax.data.locomo import load_locomo

  episodes, _ = load_locomo(root)
  out: dict[int | str, list[str]] = {}
  for e in episodes:
    for q in e.questions:
      out.setdefault(q.category, []).append(q.id)
  return out


def candidate_ids(name: str, root: str | os.PathLike | None = None) -> list[str]:
  """All question ids a pilot set is drawn from, read from the data (LongMemEval_S takes a few seconds)."""
  if name == 'longmemeval_s':
    from engram_jax.data.longmemeval import read_longmemeval

    return [e['question_id'] for e in read_longmemeval(root, split='s')]
  if name in ('factconsolidation_sh_6k', 'factconsolidation_mh_6k'):
    from engram_jax.data.factconsolidation import FILES

    path = dataset_file(root, 'memoryagentbench', FILES['6k'])
    rows = [r for r in read_json(path)['data'] if r['metadata']['source'] == name]
    if len(rows) != 1:
      raise EngramError(f'{path}: expected one row with source {name!r}, found {len(rows)}')
    return list(rows[0]['metadata']['qa_pair_ids'])
  raise EngramError(f'Unknown pilot set {name!r}; known: {sorted(PILOT_SIZES)}')


def generate_pilot_ids(
  name: str, *, root: str | os.PathLike | None = None, seed: int = PILOT_SEED, ids: Iterable[str] | None = None
) -> list[str]:
  """Draw pilot set ``name`` from the data (or from ``ids`` when given, to skip re-reading it)."""
  if name == 'locomo_answer':
    if ids is not None:
      raise EngramError('locomo_answer is drawn per category; pass no ids')
    return draw_stratified(locomo_ids_by_category(root), n_per=LOCOMO_ANSWER_PER_CATEGORY, seed=seed)
  pool = candidate_ids(name, root) if ids is None else list(ids)
  return draw_ids(pool, n=PILOT_SIZES[name], seed=seed)


def pilot_ids(name: str, *, pilot_dir: str | os.PathLike = PILOT_DIR) -> list[str]:
  """The committed pilot set ``name`` (one of :data:`PILOT_SIZES`), as written by :func:`write_pilot_ids`."""
  if name not in PILOT_SIZES:
    raise EngramError(f'Unknown pilot set {name!r}; known: {sorted(PILOT_SIZES)}')
  path = Path(pilot_dir) / f'{name}.txt'
  ids = [line.strip() for line in path.read_text(encoding='utf-8').splitlines() if line.strip()]
  if len(ids) != PILOT_SIZES[name] or len(set(ids)) != len(ids):
    raise EngramError(f'{path}: expected {PILOT_SIZES[name]} distinct ids, found {len(ids)} ({len(set(ids))} distinct)')
  return ids


def write_pilot_ids(
  *, root: str | os.PathLike | None = None, pilot_dir: str | os.PathLike = PILOT_DIR, seed: int = PILOT_SEED
) -> dict[str, Path]:
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
    raise EngramError(f'training ids overlap the scored ids: {shown}')


def disjoint_split(ids: Iterable[str], *, scored: Iterable[str], seed: int, n_train: int) -> list[str]:
  """Draw ``n_train`` training ids from ``ids`` minus ``scored`` (seeded, sorted), asserted disjoint from ``scored``.

  Raises:
    ValueError: when fewer than ``n_train`` ids remain outside ``scored``.
  """
  scored = set(scored)
  pool = sorted(set(ids) - scored)
  if n_train > len(pool):
    raise EngramError(f'only {len(pool)} ids lie outside the scored set; cannot draw {n_train} training ids')
  train = draw_ids(pool, n=n_train, seed=seed)
  assert_disjoint(train, scored)
  return train


def select_questions(
  episodes: Sequence[Episode], keep: Callable[[Episode, Question], str | None], report: LoadReport
) -> list[Episode]:
  """Keep the questions for which ``keep`` returns None; count every other one under the reason it returns.

  Episodes left without questions are dropped (counted as ``episodes_without_questions``).
  """
  out = []
  for ep in episodes:
    kept = []
    for q in ep.questions:
      reason = keep(ep, q)
      if reason is None:
        kept.append(q)
      else:
        report.add(reason, q.id)
    if kept:
      out.append(dataclasses.replace(ep, questions=tuple(kept)))
    else:
      report.add('episodes_without_questions', ep.id)
  return out


def normalised_text(text: str) -> str:
  return ' '.join(text.lower().split())


def assert_disjoint_questions(train: Sequence[Episode], scored: Sequence[Episode]) -> None:
  """Raise ValueError if any training question shares an id or a (normalised) text with a scored question."""
  assert_disjoint([q.id for e in train for q in e.questions], [q.id for e in scored for q in e.questions])
  assert_disjoint(
    [normalised_text(q.text) for e in train for q in e.questions],
    [normalised_text(q.text) for e in scored for q in e.questions],
  )


def corpus_fingerprint(episode: Episode) -> str:
  """sha256 of the episode's item texts, each up to case and whitespace (:func:`normalised_text`), sorted (write order
  does not matter): equal for a corpus copied under another episode id, also with a changed space or case."""
  h = hashlib.sha256()
  for text in sorted(normalised_text(it.text) for it in episode.items):
    h.update(text.encode('utf-8'))
    h.update(b'\0')
  return h.hexdigest()


def assert_disjoint_content(train: Sequence[Episode], scored: Sequence[Episode]) -> None:
  """Raise ValueError if a training question shares an id or a normalised text with a scored question, or a
  training episode has the same corpus (:func:`corpus_fingerprint`) as a scored episode (a conversation copied
  under a new id must not sit on both sides of a split)."""
  scored_fp = {corpus_fingerprint(e): e.id for e in scored}
  same = [(e.id, scored_fp[fp]) for e in train if (fp := corpus_fingerprint(e)) in scored_fp]
  if same:
    pairs = ', '.join(f'{a!r} (training) = {b!r} (scored)' for a, b in same[:10])
    raise EngramError(
      f'{len(same)} training episode(s) have the same corpus as a scored episode (a copy under another id): {pairs}'
    )
  for key, name in ((lambda q: q.id, 'id'), (lambda q: normalised_text(q.text), 'text')):
    scored_q = {key(q): e.id for e in scored for q in e.questions}
    shared = sorted({(e.id, scored_q[key(q)]) for e in train for q in e.questions if key(q) in scored_q})
    if shared:
      n = sum(key(q) in scored_q for e in train for q in e.questions)
      pairs = ', '.join(f'{a!r} (training) and {b!r} (scored)' for a, b in shared[:10])
      raise EngramError(f'{n} question {name}(s) are both in training and in scored episodes: {pairs}')


def assert_distinct_episodes(episodes: Sequence[Episode]) -> None:
  """Raise ValueError unless no two episodes share a question id, a normalised question text or a corpus; then
  every split by episode (cross-fitting folds, hold-out) is content-disjoint."""
  seen_q: dict[str, str] = {}
  seen_fp: dict[str, str] = {}
  for e in episodes:
    fp = corpus_fingerprint(e)
    if fp in seen_fp:
      raise EngramError(
        f'episodes {seen_fp[fp]} and {e.id} have the same corpus (a copied episode would sit on both sides of a split)'
      )
    seen_fp[fp] = e.id
    for q in e.questions:
      for key in (f'id:{q.id}', f'text:{normalised_text(q.text)}'):
        if key in seen_q and seen_q[key] != e.id:
          raise EngramError(
            f'episodes {seen_q[key]} and {e.id} share question {key[:80]!r} (it would sit on both sides of a split)'
          )
        seen_q[key] = e.id


def part_path(pilot: str, part: str, n_train: int, seed: int, *, pilot_dir: str | os.PathLike = PILOT_DIR) -> Path:
  """Where the committed id list of part ``part`` (train or confirm) of ``(pilot, n_train, seed)`` lives."""
  return Path(pilot_dir) / f'{pilot}.{part}.n{n_train}.seed{seed}.txt'


def pinned_part(
  pilot: str | None, part: str, n_train: int | None, seed: int, *, pilot_dir: str | os.PathLike = PILOT_DIR
) -> list[str] | None:
  """The committed ids of a part (None when that part is not pinned)."""
  if pilot is None or n_train is None:
    return None
  path = part_path(pilot, part, n_train, seed, pilot_dir=pilot_dir)
  if not path.is_file():
    return None
  return [line.strip() for line in path.read_text(encoding='utf-8').splitlines() if line.strip()]


def drawn_parts(ids: Iterable[str], *, pilot: str | None, n_train: int | None, seed: int) -> dict[str, list[str]]:
  """``train`` (``n_train`` ids drawn with ``seed`` outside the pilot set; all of them when None) and ``confirm``
  (in neither) from the ids of the data, sorted."""
  ids = set(ids)
  piloted = set(pilot_ids(pilot)) if pilot else set()
  train = set(
    disjoint_split(ids, scored=piloted, seed=seed, n_train=n_train if n_train is not None else len(ids - piloted))
  )
  confirm = ids - piloted - train
  assert_disjoint(sorted(confirm), sorted(piloted | train))
  return {'train': sorted(train), 'confirm': sorted(confirm)}


def load_part(
  root: str | os.PathLike | None = None,
  *,
  load: Callable[..., tuple[list[Episode], LoadReport]],
  part: str = 'all',
  pilot: str | None = None,
  n_train: int | None = None,
  seed: int = PILOT_SEED,
  official_skips: bool = False,
  exclude: Sequence[Callable[..., tuple[list[Episode], LoadReport]]] = (),
) -> tuple[list[Episode], LoadReport]:
  """Load a dataset and keep one part of its questions, counting everything left out.

  Args:
    root: data root.
    load: the loader, ``load(root) -> (episodes, report)``.
    part: ``'all'``; ``'pilot'`` (the committed pilot set ``pilot``); ``'train'``: ``n_train`` questions drawn
      with ``seed`` from those outside the pilot set (all of them when ``n_train`` is None), asserted disjoint;
      or ``'confirm'``: the questions in neither the pilot set nor that training split (asserted disjoint from
      both), for scoring once what was fit on ``train`` and chosen on ``pilot``.
    official_skips: apply LongMemEval's official skip rules (abstention; no user-side evidence) first.
    exclude: further loaders whose questions must not appear in this part (by id or normalised text), e.g.
      the 6K pilot when training on 32K FactConsolidation questions that repeat some 6K question texts.
  """
  episodes, report = load(root)
  # the ids in the data: those the loader read (before its own exclusions, which it counts), else those it returned
  loaded_ids = set(report.read_ids) if report.read_ids is not None else {q.id for e in episodes for q in e.questions}
  if official_skips:
    from engram_jax.metrics import official

    episodes = select_questions(
      episodes, lambda ep, q: official.official_skip_reason(q.id, [it.id for it in ep.items]), report
    )
  banned_ids: set[str] = set()
  banned_texts: set[str] = set()
  for other in exclude:
    eps, _ = other(root)
    banned_ids |= {q.id for e in eps for q in e.questions}
    banned_texts |= {normalised_text(q.text) for e in eps for q in e.questions}
  if banned_ids:
    episodes = select_questions(
      episodes,
      lambda ep, q: (
        'excluded_overlaps_scored' if q.id in banned_ids or normalised_text(q.text) in banned_texts else None
      ),
      report,
    )
  if part == 'all':
    chosen = None
  elif part == 'pilot':
    chosen = set(pilot_ids(pilot))
    for qid in sorted(chosen - loaded_ids):  # e.g. a damaged or older copy of the data
      report.add('pilot_ids_not_in_data', qid)
  elif part in ('train', 'confirm'):
    pinned = {p: pinned_part(pilot, p, n_train, seed) for p in ('train', 'confirm')}
    if pinned['train'] is not None and pinned['confirm'] is not None:  # committed: independent of the file
      piloted = set(pilot_ids(pilot)) if pilot else set()
      assert_disjoint(pinned['train'], sorted(piloted | set(pinned['confirm'])))
      assert_disjoint(pinned['confirm'], sorted(piloted))
      chosen = set(pinned[part])
      missing = sorted(chosen - loaded_ids)
      for qid in missing:
        report.add(f'pinned_{part}_ids_not_in_data', qid)
      if missing:
        shown = ', '.join(missing[:20]) + (f', ... ({len(missing)} in all)' if len(missing) > 20 else '')
        log.warning('%d of the %d pinned %s questions are not in the data: %s', len(missing), len(chosen), part, shown)
      kept = {q.id for e in episodes for q in e.questions}  # after the skips
      outside = kept - piloted - set(pinned['train']) - set(pinned['confirm'])
      for qid in sorted(outside):  # e.g. a question our copy lacks (upstream has 2): in no pinned part
        report.add('ids_in_no_pinned_part', qid)
    else:  # drawn from the ids of this data (moves with the file's contents)
      ids = [q.id for e in episodes for q in e.questions]
      chosen = set(drawn_parts(ids, pilot=pilot, n_train=n_train, seed=seed)[part])
      report.add(f'{part}_drawn_from_data', n=len(chosen))
  else:
    raise EngramError(f'Unknown part {part!r} (all, pilot, train or confirm)')
  if chosen is not None:
    episodes = select_questions(episodes, lambda ep, q: None if q.id in chosen else f'not_in_{part}', report)
  report.add(f'questions_in_{part}', n=sum(len(e.questions) for e in episodes))
  return episodes, report


def write_parts(*, root: str | os.PathLike | None = None, pilot_dir: str | os.PathLike = PILOT_DIR) -> dict[str, Path]:
  """Draw the parts of :data:`PINNED_PARTS` from the data (LongMemEval_S after the official skips, as
  ``conf/dataset/longmemeval_s.yaml`` loads it) and write their id lists; returns the paths."""
  import functools

  from engram_jax.data.longmemeval import load_longmemeval

  out = {}
  for pilot, n_train, seed in PINNED_PARTS:
    load = functools.partial(load_longmemeval, split='s', level='session', corpus='official')
    episodes, _ = load_part(root, load=load, part='all', official_skips=True)
    parts = drawn_parts([q.id for e in episodes for q in e.questions], pilot=pilot, n_train=n_train, seed=seed)
    for part, ids in parts.items():
      path = part_path(pilot, part, n_train, seed, pilot_dir=pilot_dir)
      path.write_text(''.join(f'{i}\n' for i in ids), encoding='utf-8')
      out[f'{pilot}.{part}'] = path
  return out


def main() -> None:
  """Regenerate the committed pilot files (``python -m engram_jax.data.splits``) or the pinned parts (``... parts``)."""
  import sys

  if sys.argv[1:] == ['parts']:
    for name, path in write_parts().items():
      print(f'{name} -> {path}')
    return
  for name, path in write_pilot_ids().items():
    print(f'{name}: {PILOT_SIZES[name]} ids -> {path}')


if __name__ == '__main__':
  main()
