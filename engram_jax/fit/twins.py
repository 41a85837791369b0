r"""The twin contract on a fit's rows: each fitted leg's soft twin, cold, must reproduce its hard leg.

Fit soft, report hard: a soft twin that is not the hard leg in the cold limit fits the wrong function, and nothing
downstream notices (the fit runs, the loss falls, the hard scores barely move). So before step 0 the fitter runs
each fitted leg's twin exactly as it will in training (:func:`engram_jax.fit.problem.soft_leg` on the batched
``[B, N]`` rows of :func:`engram_jax.fit.problem.build_rows`) with every temperature times :data:`COLD`, and compares
it per question with the hard leg run on the question's own padded episode:

* a score twin: the top-``k`` item ids equal the hard leg's, except at ranks where the two items' hard scores are
  within the tolerance (near-ties may fall either way), and every hard top-``k`` score is reproduced within
  ``atol + rtol |hard|``;
* a selection twin (CFS, MMR: a :class:`engram_jax.ops.greedy.SoftSelection`): its cold pick order (the argmax of each
  pick's distribution, ties to the later item) equals the hard leg's picks.

:func:`cold_twin_gaps` returns one :class:`TwinGap` per fitted leg; :func:`engram_jax.testing.check_operator` runs the
same comparison (and more) on random episodes for one registered operator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core.batch import EpisodeArrays
from engram_jax.fit.problem import Problem, Rows, soft_leg
from engram_jax.ops import pools
from engram_jax.ops.greedy import SoftSelection
from engram_jax.ops.registry import Operator

COLD = 1e-9  # every temperature of the fit times this: the twin's cold limit (far below float32 score gaps)
RTOL = 1e-4  # score tolerance: |soft - hard| <= ATOL + RTOL |hard| on the hard top-k
ATOL = 1e-5


@dataclasses.dataclass(frozen=True)
class TwinGap:
  """How far one leg's cold soft twin is from its hard leg on a set of questions.

  Attributes:
    leg, op: the leg's name and its operator.
    at: which knob values (e.g. ``'hand-set'``, ``'moved'``).
    n_questions: questions compared.
    n_differ: questions whose cold top-``k`` ids (pick order for a selection twin) differ from the hard leg's
      beyond near-ties.
    n_off: questions with a hard top-``k`` score not reproduced within ``atol + rtol |hard|`` (score twins).
    max_diff: the largest ``|soft - hard|`` over the hard top-``k`` items (``inf`` where the twin does not rank an
      item the hard leg ranks; 0 for selection twins).
    worst: the row (question) of the first difference, -1 if none.
    k: the cutoff compared (the picks of a selection twin).
    selection: True for a selection twin (compared by pick order only).
  """

  leg: str
  op: str
  at: str
  n_questions: int
  n_differ: int
  n_off: int
  max_diff: float
  worst: int
  k: int
  selection: bool = False

  @property
  def ok(self) -> bool:
    return self.n_differ == 0 and self.n_off == 0

  def message(self) -> str:
    """One line naming the operator, the leg, the knob values and the gap."""
    what = 'pick order' if self.selection else f'top-{self.k} ids'
    score = (
      ''
      if self.selection
      else (
        f'; scores off on {self.n_off} questions, max |soft - hard| {self.max_diff:.3g} '
        f'over the hard top-{self.k} (tolerance {ATOL:g} + {RTOL:g} |hard|)'
      )
    )
    return (
      f'operator {self.op} (leg {self.leg}, {self.at} knob values): cold soft twin != hard leg: {what} differ '
      f'on {self.n_differ}/{self.n_questions} questions{score} (first at row {self.worst})'
    )


def leg_options(problem: Problem, l: int, vals: Mapping[str, Any]) -> dict[str, Any]:
  """Leg ``l``'s knob values for its hard leg: the hand-set options, every non-static knob found by path in ``vals``
  (as a Python float)."""
  leg = problem.legs[l]
  out = dict(leg.options)
  for knob in leg.operator.knobs:
    path = f'legs.{leg.name}.{knob.name}'
    if not knob.static and path in vals:
      out[knob.name] = float(vals[path])
  return out


def traced_options(op, options: Mapping[str, Any]) -> tuple[tuple[tuple[str, Any], ...], dict[str, Any]]:
  """``options`` split into the static knobs (a hashable tuple) and the rest, traced as float32 where numeric."""
  static, traced = [], {}
  for knob in op.knobs:
    v = options[knob.name]
    if knob.static or not isinstance(v, (int, float)) or isinstance(v, bool):
      static.append((knob.name, v))
    else:
      traced[knob.name] = jnp.asarray(v, jnp.float32)
  return tuple(static), traced


_JITTED: dict[tuple, tuple[Operator, Any]] = {}


def _cached(op: Operator, key: tuple, make):
  """A jitted function per (operator object, key): a re-registered operator of the same name gets its own."""
  hit = _JITTED.get((id(op), key))
  if hit is None or hit[0] is not op:
    hit = _JITTED[(id(op), key)] = (op, make())
  return hit[1]


def hard_fn(op: Operator, static: tuple[tuple[str, Any], ...]):
  """Operator ``op``'s jitted hard leg ``(arr, key, traced knob values) -> [Q, N]`` with its static knobs fixed."""
  return _cached(
    op, ('hard', static), lambda: jax.jit(lambda arr, key, traced: op.leg(arr, key, **dict(static), **traced))
  )


def hard_rows(
  problem: Problem,
  l: int,
  arrays: Sequence[EpisodeArrays],
  n_questions: Sequence[int],
  episode_index: Sequence[int],
  options: Mapping[str, Any],
  *,
  n_pad: int,
  seed: int,
) -> np.ndarray:
  """The hard leg's scores ``[Q, n_pad]`` of leg ``l`` at ``options`` for the questions of the episodes
  ``episode_index`` (in order), each episode scored alone with the key :func:`engram_jax.fit.problem.build_rows`
  gives it (``-inf`` on padded items). Non-static knobs are traced (one compilation per static setting)."""
  op = problem.legs[l].operator
  static, traced = traced_options(op, options)
  fn = hard_fn(op, static)
  base_key = jax.random.key(seed)
  out = []
  for e in episode_index:
    key = jax.random.split(jax.random.fold_in(base_key, e), len(problem.legs))[l]
    s = np.asarray(fn(arrays[e], key, traced))[: n_questions[e]]
    out.append(pools.pad_items(s, n_pad, -np.inf))
  return np.concatenate(out) if out else np.zeros((0, n_pad))


def soft_fn(problem: Problem, l: int):
  """Jitted ``(vals, rows, scale) ->`` leg ``l``'s soft output (:func:`engram_jax.fit.problem.soft_leg`)."""
  return _cached(
    problem.legs[l].operator,
    ('soft', problem, l),
    lambda: jax.jit(lambda v, r, scale: soft_leg(problem, l, v, r, scale)[0]),
  )


def soft_rows(
  problem: Problem, l: int, vals: Mapping[str, Any], rows: Rows, *, scale: float = COLD, batch_size: int = 256
):
  """Leg ``l``'s soft twin on ``rows`` (batches of ``batch_size`` questions) with every temperature times ``scale``:
  ``[Q, N]`` scores, or a :class:`SoftSelection` with ``probs [Q, K, N]``."""
  jvals = {p: jnp.asarray(v, jnp.float32) for p, v in vals.items()}
  fn = soft_fn(problem, l)
  n = rows.where.shape[0]
  parts = [
    fn(jvals, jax.tree_util.tree_map(lambda x, i=i: x[i : i + batch_size], rows), jnp.float32(scale))
    for i in range(0, n, batch_size)
  ]
  return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *parts)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """NumPy :func:`engram_jax.core.ranking.top_k` of ``[Q, N]`` scores (``-inf`` = unranked): ``(indices [Q, k], values
  [Q, k])`` by score, ties to the later item."""
  n = scores.shape[-1]
  later = np.broadcast_to(-np.arange(n), scores.shape)
  order = np.lexsort((later, -scores), axis=-1)[..., :k]
  return order, np.take_along_axis(scores, order, axis=-1)


def pick_order(sel: SoftSelection) -> np.ndarray:
  """``[Q, K]`` cold pick order of a soft selection: each pick's argmax (ties to the later item), -1 where a pick
  has no mass."""
  probs = np.asarray(sel.probs)
  n = probs.shape[-1]
  idx = n - 1 - np.argmax(probs[..., ::-1], axis=-1)
  return np.where(probs.sum(-1) > 0.5, idx, -1)


def hard_pick_order(hard: np.ndarray, k: int) -> np.ndarray:
  """``[Q, K]`` picks of a greedy leg from its leg scores (pick ``t`` scores ``K - t``), -1 past the picks."""
  idx, vals = top_k(np.asarray(hard, np.float64), min(k, hard.shape[-1]))
  return np.where(np.isfinite(vals), idx, -1)


def compare(
  soft,
  hard: np.ndarray,
  where: np.ndarray,
  *,
  k: int,
  leg: str,
  op: str,
  at: str,
  rtol: float = RTOL,
  atol: float = ATOL,
) -> TwinGap:
  """The :class:`TwinGap` of soft output ``soft`` (scores ``[Q, N]`` or a :class:`SoftSelection`) against the hard
  leg's scores ``hard [Q, N]`` (real items ``where [Q, N]``)."""
  n_q = hard.shape[0]
  if isinstance(soft, SoftSelection):
    s_pick = pick_order(soft)
    h_pick = hard_pick_order(hard, s_pick.shape[-1])
    differ = np.any(s_pick != h_pick, axis=-1)
    return TwinGap(
      leg=leg,
      op=op,
      at=at,
      n_questions=n_q,
      n_differ=int(differ.sum()),
      n_off=0,
      max_diff=0.0,
      worst=int(np.argmax(differ)) if differ.any() else -1,
      k=s_pick.shape[-1],
      selection=True,
    )
  soft = np.where(where, np.asarray(soft, np.float64), -np.inf)
  hard = np.where(where, np.asarray(hard, np.float64), -np.inf)
  kk = min(k, hard.shape[-1])
  h_idx, h_val = top_k(hard, kk)
  s_idx, s_val = top_k(soft, kk)
  h_at_s = np.take_along_axis(hard, s_idx, axis=-1)  # the hard score of the twin's item at each rank
  s_at_h = np.take_along_axis(soft, h_idx, axis=-1)  # the twin's score of the hard leg's item at each rank
  real = np.isfinite(h_val)
  tol = atol + rtol * np.abs(np.where(real, h_val, 0.0))
  tie = real & np.isfinite(h_at_s) & (np.abs(h_at_s - np.where(real, h_val, 0.0)) <= tol)
  same = (h_idx == s_idx) & (real == np.isfinite(s_val)) | tie | (~real & ~np.isfinite(s_val))
  differ = ~np.all(same, axis=-1)
  with np.errstate(invalid='ignore'):
    diff = np.where(real, np.abs(s_at_h - np.where(real, h_val, 0.0)), 0.0)
  diff = np.where(real & ~np.isfinite(s_at_h), np.inf, diff)
  off = np.any(diff > tol, axis=-1)
  bad = differ | off
  return TwinGap(
    leg=leg,
    op=op,
    at=at,
    n_questions=n_q,
    n_differ=int(differ.sum()),
    n_off=int(off.sum()),
    max_diff=float(diff.max(initial=0.0)),
    worst=int(np.argmax(bad)) if bad.any() else -1,
    k=kk,
  )


def moved_values(problem: Problem, l: int, vals: Mapping[str, Any]) -> dict[str, Any]:
  """``vals`` with every fitted knob of leg ``l`` moved to another in-range value (a step a fit could take)."""
  leg = problem.legs[l]
  out = dict(vals)
  for name in leg.fitted:
    path = f'legs.{leg.name}.{name}'
    out[path] = move(leg.operator.knob(name).transform, float(vals[path]))
  return out


def move(transform: str | None, value: float) -> float:
  """Another value of a knob with ``transform``, inside its range (doubles a positive scale, shifts a weight)."""
  if transform == 'log':
    return value * 2.0
  if transform == 'logit':
    return value + 0.2 if value <= 0.5 else value - 0.2
  if transform == 'softplus':
    return value * 2.0 + 0.1
  return value + 0.3


def cold_twin_gaps(
  problem: Problem,
  rows: Rows,
  arrays: Sequence[EpisodeArrays],
  n_questions: Sequence[int],
  vals: Mapping[str, Any],
  *,
  seed: int,
  at: str = 'hand-set',
  episode_index: Sequence[int] | None = None,
  rtol: float = RTOL,
  atol: float = ATOL,
  batch_size: int = 256,
) -> list[TwinGap]:
  """Every fitted leg's cold soft twin against its hard leg on the rows of the episodes ``episode_index`` (all by
  default), at knob values ``vals`` (by path, as :func:`engram_jax.fit.problem.make_problem` returns them).

  Args:
    problem, rows: the fit's problem and rows (:func:`engram_jax.fit.problem.build_rows` over the
      episodes whose padded arrays are ``arrays``, ``n_questions[e]`` real questions each, in row order).
    vals: every traced knob's value by path.
    seed: the seed ``build_rows`` was given (the hard legs' keys).
    at: a label for the values (in messages).

  Returns:
    One :class:`TwinGap` per fitted leg (empty when no leg is fitted: fusion weights alone have no twin to check).
  """
  starts = np.concatenate([[0], np.cumsum(n_questions)])
  episode_index = list(range(len(arrays))) if episode_index is None else list(episode_index)
  sel = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in episode_index]).astype(np.int64)
  sub = jax.tree_util.tree_map(lambda x: x[sel], rows)
  n_pad = rows.where.shape[-1]
  gaps = []
  for l, leg in enumerate(problem.legs):
    if not leg.fitted:
      continue
    hard = hard_rows(
      problem, l, arrays, n_questions, episode_index, leg_options(problem, l, vals), n_pad=n_pad, seed=seed
    )
    soft = soft_rows(problem, l, vals, sub, batch_size=batch_size)
    k = problem.legs[l].depth if isinstance(soft, SoftSelection) else problem.k
    gaps.append(compare(soft, hard, np.asarray(sub.where), k=k, leg=leg.name, op=leg.op, at=at, rtol=rtol, atol=atol))
  return gaps
