r"""An external system's ranked lists as a leg: ``trec_run`` reads a TREC run file (``qid Q0 docid rank score tag``,
the format of trec_eval, ranx, ir_measures and pyserini) and scores each question's items by the run's order.

The file is read once on the host (memoised by its sha256) and turned, per episode, into a ``[Q, N]`` array of
per-question item values (:attr:`engram_jax.core.batch.EpisodeArrays.leg_inputs`, built by
:func:`engram_jax.core.batch.episode_arrays` from the operator's ``needs``); the leg returns it. So the leg is a pure
function of arrays, fuses with the project's legs by weighted RRF, and a fit treats it as a constant leg (its
weight and ``k0`` are fittable, nothing of the run is).

Matching, per episode:

* a question is the run's ``qid`` ``<episode id>/<question id>`` or ``<question id>`` (the first found), with
  ``%`` and whitespace percent-encoded as :func:`engram_jax.eval.trec.trec_qids` writes them; so a run written from
  our own files, or by a tool given our question ids, matches;
* an item is the run's ``docid`` equal to its id (percent-encoded as :func:`engram_jax.core.trecid.trec_id`);
* the run's order of a question: score descending, ties by the rank column ascending, then file order. The leg's
  value of the item at position ``r`` (1-based) of that order is ``-r``, so the leg ranks exactly as the run does
  (our tie rule never applies); RRF reads only ranks.

Not matched, counted (:func:`reports`, written by ``experiments.evaluate`` into ``run_info.json``):

* items the run does not rank for a question score ``-inf`` (not ranked): inside an RRF fusion that leg adds
  nothing for them; a run used alone (``fusion: none``) must rank at least ``k`` items per question;
* doc ids the episode does not know (lines of a matched question), counted and skipped;
* questions the run lacks: ``missing='skip'`` (the default) scores no item for them, counted (in a fusion the
  other legs decide; the question is still scored); ``missing='error'`` refuses in one line naming the file and the
  first missing question;
* the run's qids no question matched (another dataset's, or a typo), counted.

A malformed line (not six fields, a rank that is not an integer, a score that is not a finite number, a docid twice
for one qid) is a one-line :class:`~engram_jax.core.errors.EngramError` naming the file and the line.

Example:
  >>> import tempfile, pathlib
  >>> import numpy as np
  >>> from engram_jax import Episode, Item, Question
  >>> from engram_jax.ops.trec_run import RunScores
  >>> items = tuple(Item(f'i{j}', 'x', 'S1', j) for j in range(3))
  >>> ep = Episode('e', items, (Question('q1', 'x?', ('i0',), ('S1',), 1),))
  >>> path = pathlib.Path(tempfile.mkdtemp()) / 'ext.trec'
  >>> _ = path.write_text('q1 Q0 i2 1 9.5 other\nq1 Q0 i0 2 3.0 other\nq1 Q0 zz 3 1.0 other\n')
  >>> RunScores.of(str(path))(ep).tolist()  # i2 first, i0 second, i1 not ranked; zz unknown (counted)
  [[-2.0, -inf, -1.0]]
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array

from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.errors import EngramError
from engram_jax.core.trecid import trec_id
from engram_jax.core.types import Episode
from engram_jax.ops.registry import Knob, Operator, knob_defaults, register

MISSING = ('skip', 'error')

KNOBS = (
  Knob('path', '', static=True, doc='the TREC run file (qid Q0 docid rank score tag)'),
  Knob('missing', 'skip', static=True, check=MISSING, doc='a question the run lacks: scored by no item, or an error'),
)
_D = knob_defaults(KNOBS)


@functools.lru_cache(maxsize=8)
def read_run(path: str, sha256: str) -> dict[str, list[str]]:
  """``{qid: [docid, ...]}`` of a TREC run file, each question's docids in the run's order (score descending, ties
  by rank ascending, then file order). ``sha256`` is the file's (the memo's key: a changed file is read again).

  Raises:
    EngramError: one line naming the file and the line of the first malformed line.
  """
  del sha256
  rows: dict[str, list[tuple[float, int, int, str]]] = {}
  seen: dict[tuple[str, str], int] = {}
  with open(path, encoding='utf-8') as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      fields = line.split()
      where = f'{path}:{lineno}'
      if len(fields) != 6:
        raise EngramError(f'{where}: a TREC run line has 6 fields (qid Q0 docid rank score tag), got {len(fields)}')
      qid, _, docid, rank, score, _ = fields
      try:
        r = int(rank)
      except ValueError:
        raise EngramError(f'{where}: rank {rank!r} is not an integer (qid {qid}, docid {docid})') from None
      try:
        s = float(score)
      except ValueError:
        s = math.nan
      if not math.isfinite(s):
        raise EngramError(f'{where}: score {score!r} is not a finite number (qid {qid}, docid {docid})')
      if (qid, docid) in seen:
        raise EngramError(f'{where}: docid {docid} appears twice for qid {qid} (first at line {seen[qid, docid]})')
      seen[qid, docid] = lineno
      rows.setdefault(qid, []).append((-s, r, lineno, docid))
  if not rows:
    raise EngramError(f'{path}: the run file has no lines')
  return {qid: [d for *_, d in sorted(lines)] for qid, lines in rows.items()}


def file_sha256(path: str) -> str:
  """The file's sha256 (hex); a one-line EngramError when it cannot be read."""
  if not path:
    raise EngramError(
      'trec_run: no run file (path is empty); give it: ext_run=FILE for the conf/pipeline/*ext pipelines, or '
      'legs.<leg>.path=FILE (docs/formats.md)'
    )
  try:
    with open(path, 'rb') as f:
      return hashlib.file_digest(f, 'sha256').hexdigest()
  except OSError as e:
    raise EngramError(f'trec_run: cannot read the run file {path} ({e.strerror or e})') from None


# (path, sha256) -> {episode id: counts}: what the runs' builders matched, for reports()
_COUNTS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}


@dataclasses.dataclass(frozen=True)
class RunScores:
  """The builder of one run's ``[Q, N]`` leg input per episode (``episode_arrays(inputs={name: RunScores(...)})``).
  Its repr (path, content hash, missing rule) keys the padded arrays in a leg cache."""

  path: str
  sha256: str
  missing: str = _D['missing']

  @classmethod
  def of(cls, path: str, *, missing: str = _D['missing']) -> RunScores:
    path = os.path.abspath(path) if path else path
    return cls(path, file_sha256(path), missing)

  def __call__(self, episode: Episode) -> np.ndarray:
    run = read_run(self.path, self.sha256)
    index = {trec_id(it.id): i for i, it in enumerate(episode.items)}
    out = np.full((len(episode.questions), episode.n_items), -np.inf, np.float32)
    counts = {'questions': len(episode.questions), 'missing': 0, 'unknown_docids': 0, 'ranked': 0}
    missing, unknown, matched = [], [], []
    for i, q in enumerate(episode.questions):
      qid = next((c for c in (trec_id(f'{episode.id}/{q.id}'), trec_id(q.id)) if c in run), None)
      if qid is None:
        missing.append(q.id)
        continue
      matched.append(qid)
      r = 0
      for docid in run[qid]:
        j = index.get(docid)
        if j is None:
          unknown.append(docid)
          continue
        r += 1
        out[i, j] = -r
      counts['ranked'] += r
    if missing and self.missing == 'error':
      raise EngramError(
        f'{self.path}: the run has no lines for {len(missing)} of {len(episode.questions)} questions of episode '
        f'{episode.id} (first: {missing[0]}); missing=skip scores no item for them'
      )
    counts.update(missing=len(missing), unknown_docids=len(unknown), first_missing=missing[:3])
    counts.update(first_unknown=sorted(set(unknown))[:3], matched_qids=matched)
    _COUNTS.setdefault((self.path, self.sha256), {})[episode.id] = counts
    return out


def input_name(path: str, missing: str) -> str:
  """The name of a run's leg input (:attr:`EpisodeArrays.leg_inputs`)."""
  return f'trec_run:{missing}:{os.path.abspath(path) if path else path}'


def reports(paths: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
  """Per run file read in this process (``paths``: those only; the last content read of each): questions, questions missing from the run (and the
  first ids), doc ids the episodes do not know (and the first), items ranked, the run's qids no question matched.

  Example:
    >>> from engram_jax.ops import trec_run
    >>> isinstance(trec_run.reports(), dict)
    True
  """
  keep = None if paths is None else {os.path.abspath(p) for p in paths if p}
  out = {}
  for (path, sha), per_episode in _COUNTS.items():
    if keep is not None and path not in keep:
      continue
    run = read_run(path, sha)
    matched = {qid for c in per_episode.values() for qid in c['matched_qids']}
    out[path] = {
      'sha256': sha,
      'episodes': len(per_episode),
      'questions': sum(c['questions'] for c in per_episode.values()),
      'questions_missing': sum(c['missing'] for c in per_episode.values()),
      'first_missing': [m for c in per_episode.values() for m in c['first_missing']][:3],
      'unknown_docids': sum(c['unknown_docids'] for c in per_episode.values()),
      'first_unknown': sorted({u for c in per_episode.values() for u in c['first_unknown']})[:3],
      'items_ranked': sum(c['ranked'] for c in per_episode.values()),
      'run_qids_unmatched': len(set(run) - matched),
    }
  return out


def match(path: str, episodes: Sequence[Episode]) -> dict[str, Any]:
  r"""How a run file matches ``episodes`` (read before any scoring, as the leg's builder matches it): questions and
  those the run lacks, the run's lines for matched questions and their doc ids no episode knows, the fewest items a
  matched question ranks, the run's qids no question matched, the first ids of each, and the likely cause when
  nothing or little matches (:func:`likely_cause`).

  Example:
    >>> import tempfile, pathlib
    >>> from engram_jax import Episode, Item, Question
    >>> items = tuple(Item(f'i{j}', 'x', 'S1', j) for j in range(3))
    >>> ep = Episode('e', items, (Question('q1', 'x?', ('i0',), ('S1',), 1),))
    >>> path = pathlib.Path(tempfile.mkdtemp()) / 'ext.trec'
    >>> _ = path.write_text('Q1 Q0 i2 1 9.5 other\n')
    >>> m = match(str(path), [ep])
    >>> m['questions_missing'], m['cause']
    (1, 'the question ids differ in case (run: Q1, episode: q1)')
  """
  run = read_run(path, file_sha256(path))
  out = {'questions': 0, 'questions_missing': 0, 'lines': 0, 'unknown_docids': 0, 'fewest_ranked': None}
  missing, unknown, matched, ours_q, ours_d = [], [], set(), [], []
  for e in episodes:
    index = {trec_id(it.id) for it in e.items}
    ours_d += list(index)[:50]
    for q in e.questions:
      out['questions'] += 1
      cands = (trec_id(f'{e.id}/{q.id}'), trec_id(q.id))
      ours_q.append(cands[1])
      qid = next((c for c in cands if c in run), None)
      if qid is None:
        missing.append(q.id)
        continue
      matched.add(qid)
      known = [d for d in run[qid] if d in index]
      unknown += [d for d in run[qid] if d not in index]
      out['lines'] += len(run[qid])
      n = len(known)
      out['fewest_ranked'] = n if out['fewest_ranked'] is None else min(out['fewest_ranked'], n)
  out.update(questions_missing=len(missing), unknown_docids=len(unknown), first_missing=missing[:3])
  out.update(first_unknown=sorted(set(unknown))[:3], run_qids_unmatched=len(set(run) - matched))
  cause = None
  if missing:
    cause = likely_cause([q for q in run if q not in matched], ours_q, 'question')
  if cause is None and unknown:
    cause = likely_cause(sorted(set(unknown)), ours_d, 'doc')
  out['cause'] = cause
  return out


def likely_cause(theirs: Sequence[str], ours: Sequence[str], what: str) -> str | None:
  """Why ids of the run do not match ours, when a transformation would match them: case, or percent-encoding.

  >>> likely_cause(['D1%3A3'], ['D1:3'], 'doc')
  'the doc ids differ in percent-encoding (run: D1%3A3, episode: D1:3)'
  """
  from urllib.parse import unquote

  for name, norm in (('case', str.casefold), ('percent-encoding', lambda x: unquote(unquote(x)))):
    by = {norm(o): o for o in ours}
    hit = next((t for t in theirs if norm(t) in by and by[norm(t)] != t), None)
    if hit is not None:
      return f'the {what} ids differ in {name} (run: {hit}, episode: {by[norm(hit)]})'
  return None


def check_match(path: str, report: Mapping[str, Any], *, max_unmatched: float, alone_k: int | None = None) -> None:
  """Refuse a run that matches nothing, or whose share of missing questions or of unknown doc ids (of the lines of
  matched questions) is over ``max_unmatched``; with ``alone_k`` (the leg is a pipeline's only leg), a question that
  ranks fewer than ``alone_k`` known items. One line naming the file, the first ids and the likely cause.

  Raises:
    EngramError: as above.
  """
  q, miss = report['questions'], report['questions_missing']
  lines, unknown = report['lines'], report['unknown_docids']
  cause = f'; likely cause: {report["cause"]}' if report.get('cause') else ''
  if q and (miss == q or miss / q > max_unmatched):
    raise EngramError(
      f'{path}: the run has no lines for {miss} of {q} questions (first: {", ".join(report["first_missing"])}){cause}; '
      f'over the threshold {max_unmatched:g} (ext_run_max_unmatched)'
    )
  if lines and (unknown == lines or unknown / lines > max_unmatched):
    raise EngramError(
      f'{path}: {unknown} of the {lines} lines of matched questions name doc ids no episode has (first: '
      f'{", ".join(report["first_unknown"])}){cause}; over the threshold {max_unmatched:g} (ext_run_max_unmatched)'
    )
  fewest = report.get('fewest_ranked')
  if alone_k is not None and fewest is not None and fewest < alone_k:
    raise EngramError(
      f'{path}: used alone, the run must rank at least k={alone_k} known items per question; one ranks {fewest} '
      '(fuse it with another leg, or lower eval.k)'
    )


def trec_run_leg(ep: EpisodeArrays, key: Array, *, path: str = _D['path'], missing: str = _D['missing']) -> Array:
  """``[Q, N]``: ``-r`` for the item at position ``r`` of the run's order of each question, ``-inf`` for items the
  run does not rank (and padding).

  Raises:
    ValueError: when ``ep`` was built without this run's input (``episode_arrays(inputs=...)``, asked for by the
      operator's ``needs`` through :func:`engram_jax.eval.pipeline.build_options`).
  """
  del key
  name = input_name(path, missing)
  if name not in ep.leg_inputs:
    raise ValueError(
      f'trec_run: the run {path!r} was not read into these arrays (leg inputs {sorted(ep.leg_inputs)}); build '
      'them with episode_arrays(..., **build_options(pipelines))'
    )
  return jnp.where(ep.where, ep.leg_inputs[name], -jnp.inf)


def _needs(options: Mapping[str, Any]) -> dict[str, Any]:
  path, missing = options['path'], options['missing']
  return {'inputs': {input_name(path, missing): RunScores.of(path, missing=missing)}}


def _check_options(episodes, folder: str) -> dict[str, Any]:
  """A run over check_operator's random episodes (every question ranks its episode's items in reverse write order,
  plus an unknown docid), written under ``folder``."""
  lines = []
  for ep in episodes:
    for q in ep.questions:
      ids = [it.id for it in ep.items][::-1] + ['not-an-item']
      lines += [f'{trec_id(q.id)} Q0 {trec_id(d)} {r} {len(ids) - r}.0 ext' for r, d in enumerate(ids, start=1)]
  path = os.path.join(folder, 'check.trec')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return {'path': path}


TREC_RUN = register(
  Operator(
    name='trec_run',
    leg=trec_run_leg,
    doc="an external TREC run file's ranked lists (read on the host; a constant leg)",
    knobs=KNOBS,
    needs=_needs,
    check_options=_check_options,
    vectors=False,
  )
)
