r"""The operator contract, checked for one registered operator: :func:`check_operator`.

A soft twin that does not reproduce its hard leg fits the wrong function silently (issue 17: a twin that computed the
write fraction over a whole ``[B, N]`` batch instead of per row shrank it by B, and the fit still ran). So every
operator in the registry, built in or out of tree, is held to the same checks, on the batched rows the fitter runs
(:func:`engram_jax.fit.build_rows`, :func:`engram_jax.fit.soft_leg`) over random padded episodes
(:func:`engram_jax.testing.episodes.random_padded_episodes`: several episode sizes padded to one N, so the masks
are ragged, and B >= 2 questions per episode):

1. **Declaration.** The leg's keyword arguments are the knobs, in order, with the declared defaults; every default
   is in its own range; a static knob has no transform; an operator without a twin has nothing fittable. The leg
   runs jitted: ``[Q, N]`` scores, no NaN, ``-inf`` on padded items, a score for every real question, and the same
   scores for the same key (a stochastic leg is reproducible from a fixed key).
2. **Cold equality** (operators with a twin). With every temperature times :data:`engram_jax.fit.twins.COLD` the
   twin reproduces the hard leg on every question: the same top-10 ids (near-ties within the tolerance exempt) and
   every hard top-10 score within ``1e-5 + 1e-4 |hard|``; a selection twin (CFS, MMR) the same pick order. At the
   declared defaults and at two random draws (:func:`random_values`) that move **every** fittable knob away from its
   default (a step of 0.25 to 1 in its unconstrained parametrisation, inside its declared range), whatever the
   default: a default that would pin the draws (0 under ``log``) is refused when the knob is declared. A draw that
   fails is re-run with each knob moved alone, and the message names the knobs whose draw exposed the gap.
3. **Gradients and direction.** For every fittable knob, a fixed random linear functional ``F`` of the twin's output
   (its scores, or each pick's distribution weighted ``K - t``: a scalar loss) has a finite, non-zero gradient at
   the fit's temperatures.
   Moving the knob (steps of 0.05, 0.5 and 1.5 in its unconstrained parametrisation, up to the first that moves the
   hard leg) changes ``F`` of the hard leg and of the cold twin with the same sign; a knob that moves the twin but
   never the hard leg fails; and where the twin does not depend on the temperatures (it is the hard formula), the
   gradient predicts the sign of the hard leg's change over a step of 0.01.
4. **Per-question knobs** (declared ``per_question``). The hard leg given one value per question (``[Q]``, three
   values spread over the questions) scores each question as the leg given that question's value as a scalar (the
   same items ranked, scores within float rounding, :data:`PER_QUESTION_RTOL`), and the twin given one value per row (``[B]``) reproduces it cold, as in 2.

A failure raises AssertionError ``check_operator('<name>') [<part>]: ...`` naming the operator, the part of the
contract that failed (:data:`PARTS`: declaration, leg, stages, cold equality, gradient sign, per-question), the knob
values, the knob whose draw exposed it (cold equality) or that was moved (gradient sign, per-question), and the
largest difference.
"""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax import fit
from engram_jax.eval import pipeline
from engram_jax.fit import twins
from engram_jax.fit.knobs import inverse
from engram_jax.ops import pools, registry
from engram_jax.ops.greedy import SoftSelection
from engram_jax.testing.episodes import random_padded_episodes

STEPS = (0.05, 0.5, 1.5)  # knob steps in the unconstrained parametrisation, smallest first
GRAD_STEP = 0.01  # the step over which a temperature-free twin's gradient must predict the hard change
PER_QUESTION_RTOL = 1e-6  # per-question vs scalar value in the hard leg: float rounding only (XLA may fuse a
# broadcast column and a scalar into different instructions, e.g. a fused multiply-add in one of them)


PARTS = ('declaration', 'leg', 'stages', 'cold equality', 'gradient sign', 'per-question')  # what a message names
DRAW = (0.25, 1.0)  # |step| of a random draw from the default, in the knob's unconstrained parametrisation


def _fail(name: str, part: str, what: str) -> None:
  """Raise the check's AssertionError: ``check_operator('<name>') [<part>]: <what>``."""
  assert part in PARTS, part
  raise AssertionError(f'check_operator({name!r}) [{part}]: {what}')


def check_declaration(op: registry.Operator) -> None:
  """Part 1 (without running the leg): knobs against the leg's signature, defaults in range, static knobs and
  twins consistent."""
  params = list(inspect.signature(op.leg).parameters.values())
  if len(params) < 2 or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
    _fail(op.name, 'declaration', f'the leg must be leg(ep, key, *, knobs...), got {inspect.signature(op.leg)}')
  kw = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
  names = [k.name for k in op.knobs]
  if names != list(kw):
    _fail(
      op.name, 'declaration', f"knobs {names} do not match the leg's keyword arguments {list(kw)} (names and order)"
    )
  for k in op.knobs:
    if kw[k.name] is not inspect.Parameter.empty and kw[k.name] != k.default:
      _fail(
        op.name,
        'declaration',
        f"knob {k.name}: the leg's default {kw[k.name]!r} is not the declared {k.default!r} "
        '(derive it from the declaration: registry.knob_defaults)',
      )
    try:
      k.validate(k.default, where=f'operator {op.name}')
    except ValueError as e:
      _fail(op.name, 'declaration', f'knob {k.name}: its default is out of its own range: {e}')
    if k.static and k.transform is not None:
      _fail(op.name, 'declaration', f'knob {k.name}: a static knob cannot be fittable (transform {k.transform!r})')
  with_transform = [k.name for k in op.knobs if k.transform is not None]
  if op.soft is None and with_transform:
    _fail(
      op.name, 'declaration', f'knobs {with_transform} have a transform (fittable) but the operator has no soft twin'
    )
  if op.soft is not None and not op.fittable:
    _fail(op.name, 'declaration', 'a soft twin with nothing to fit (no knob has a transform)')


def check_leg(op: registry.Operator, arrays, options: Mapping[str, Any], n_questions, *, seed: int) -> None:
  """Part 1 (running the leg): shapes, NaN, padding, a score per real question, reproducible from a fixed key."""
  static, traced = twins.traced_options(op, options)
  hard = twins.hard_fn(op, static)  # the compilation the cold-equality check reuses
  fn = lambda arr, key: hard(arr, key, traced)
  key = jax.random.key(seed)
  for arr, nq in zip(arrays, n_questions):
    s = np.asarray(fn(arr, key))
    where = np.asarray(arr.where)
    if s.shape != np.asarray(arr.labels).shape:
      _fail(op.name, 'leg', f'the leg returned {s.shape}, expected [Q, N] = {np.asarray(arr.labels).shape}')
    if np.isnan(s).any():
      _fail(op.name, 'leg', f'the leg returned NaN ({int(np.isnan(s).sum())} entries)')
    if not np.isneginf(s[:, ~where]).all():
      _fail(op.name, 'leg', 'the leg scores padded items (they must be -inf)')
    if not np.isfinite(s[:nq][:, where]).any(axis=-1).all():
      _fail(op.name, 'leg', 'the leg ranks no item for some real question')
    again = np.asarray(fn(arr, key))
    if not np.array_equal(s, again):
      _fail(
        op.name, 'leg', f'the leg is not reproducible from a fixed key (max difference {np.nanmax(np.abs(s - again))})'
      )


def check_stages(op: registry.Operator, arrays, options: Mapping[str, Any], *, seed: int) -> None:
  """A staged leg (:class:`engram_jax.ops.registry.Stages`): ``finish(prepare(...))`` equals the leg bit for bit,
  each jitted, on every episode."""
  st = op.stages
  if set(st.by) - {k.name for k in op.knobs}:
    _fail(op.name, 'stages', f'stages.by names unknown knobs {sorted(set(st.by) - {k.name for k in op.knobs})}')
  traced = [n for n in st.by if not op.knob(n).static]
  if traced:
    _fail(op.name, 'stages', f'stages.by may name static knobs only (a sweep moves traced ones), got {traced}')
  key = jax.random.key(seed)
  whole = jax.jit(lambda arr: op.leg(arr, key, **options))
  staged = jax.jit(lambda arr: st.finish(arr, st.prepare(arr, key, **{n: options[n] for n in st.by}), key, **options))
  for i, arr in enumerate(arrays):
    a, b = np.asarray(whole(arr)), np.asarray(staged(arr))
    if not np.array_equal(a, b):
      both = np.isfinite(a) & np.isfinite(b)
      diff = np.abs(a[both] - b[both]).max(initial=0.0)
      _fail(
        op.name,
        'stages',
        f'its stages (finish after prepare) differ from the leg on episode {i}: '
        f'{int((a != b).sum())} entries, max |difference| {diff:.3g}',
      )


def check_per_question(
  op: registry.Operator,
  problem,
  arrays,
  n_questions,
  rows,
  every: Mapping[str, float],
  knob: str,
  *,
  n_pad: int,
  seed: int,
) -> None:
  """Part 4 for one ``per_question`` knob (module docstring), at the other knobs' declared defaults."""
  name, path = op.name, f'legs.{op.name}.{knob}'
  transform = op.knob(knob).transform
  raw0 = inverse(transform, float(op.defaults[knob]))
  choices = np.asarray([_forward(transform, raw0 + d) for d in (-0.5, 0.0, 0.5)], np.float32)
  static, traced = twins.traced_options(op, twins.leg_options(problem, 0, every))
  fn = twins.hard_fn(op, static)
  rng = np.random.default_rng(seed + 4)
  base_key = jax.random.key(seed)
  hard, per_row = [], []
  for e, (arr, nq) in enumerate(zip(arrays, n_questions)):
    key = jax.random.split(jax.random.fold_in(base_key, e), len(problem.legs))[0]
    pick = rng.integers(0, len(choices), size=arr.queries.shape[0])
    got = np.asarray(fn(arr, key, {**traced, knob: jnp.asarray(choices[pick])}))
    for j, v in enumerate(choices):
      want = np.asarray(fn(arr, key, {**traced, knob: jnp.float32(v)}))
      rows_j = (pick == j) & (np.arange(len(pick)) < nq)
      a, b = got[rows_j], want[rows_j]
      same_mask = np.array_equal(np.isfinite(a), np.isfinite(b)) and np.array_equal(
        a[~np.isfinite(a)], b[~np.isfinite(b)]
      )
      if not (same_mask and np.allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=PER_QUESTION_RTOL, atol=0.0)):
        diff = np.abs(a[np.isfinite(a) & np.isfinite(b)] - b[np.isfinite(a) & np.isfinite(b)]).max(initial=0.0)
        _fail(
          name,
          'per-question',
          f'knob {knob} (per_question): the leg given one value per question differs from the leg given '
          f"{knob}={v:.4g} on episode {e}'s questions {np.flatnonzero(rows_j).tolist()} (max |difference| "
          f'{diff:.3g})',
        )
    hard.append(pools.pad_items(got[:nq], n_pad, -np.inf))
    per_row.append(choices[pick[:nq]])
  vals = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  vals[path] = jnp.asarray(np.concatenate(per_row))
  soft = twins.soft_fn(problem, 0)(vals, rows, jnp.float32(twins.COLD))
  soft = jax.tree_util.tree_map(np.asarray, soft)
  gap = twins.compare(
    soft,
    np.concatenate(hard),
    np.asarray(rows.where),
    k=10,
    leg=name,
    op=name,
    at=f'{knob} per question in {choices.tolist()}',
  )
  if not gap.ok:
    _fail(
      name,
      'per-question',
      f'knob {knob} (per_question): the twin given one value per row does not reproduce the leg: {gap.message()}',
    )


def random_values(op: registry.Operator, rng: np.random.Generator) -> dict[str, float]:
  """A draw of every fittable knob away from its default and inside its declared range.

  Each knob's unconstrained value (:func:`engram_jax.fit.knobs.inverse` of its default) moves by a step of random
  sign and size in :data:`DRAW` (the other sign when the first leaves the knob's ``check``), whatever the default:
  no draw can stay at the default (a default on a transform's boundary, where the unconstrained value is infinite,
  is refused by :class:`engram_jax.ops.registry.Knob`).
  """
  out = {}
  for name in op.fittable:
    knob = op.knob(name)
    raw0 = inverse(knob.transform, float(knob.default))
    step = float(rng.uniform(*DRAW)) * float(rng.choice((-1.0, 1.0)))
    errors = []
    for s in (step, -step):
      v = _forward(knob.transform, raw0 + s)
      try:
        knob.validate(v, where=f'check_operator({op.name!r}) random draw')
      except ValueError as e:
        errors.append(str(e))
        continue
      out[name] = v
      break
    else:
      _fail(op.name, 'declaration', f'knob {name}: no value {DRAW} away from its default is in range: {errors}')
  return out


def exposing_knobs(values: Mapping[str, float], defaults: Mapping[str, float], fails) -> list[str]:
  """The knobs of a failing draw that fail alone: ``fails({**defaults, k: values[k]})`` for each knob ``k`` moved
  by the draw (in order); empty when only a combination of them fails."""
  return [k for k in values if values[k] != defaults[k] and fails({**defaults, k: values[k]})]


def _functional(out, u: jax.Array) -> jax.Array:
  """``F``: a fixed random linear functional of a twin's (or hard leg's) output: scores (``-inf`` as 0), or each
  pick's distribution weighted ``K - t``."""
  if isinstance(out, SoftSelection):
    k = out.probs.shape[-2]
    w = (k - jnp.arange(k, dtype=out.probs.dtype))[:, None]
    return jnp.sum(jnp.sum(out.probs * w, axis=-2) * u)
  x = jnp.asarray(out)
  return jnp.sum(jnp.where(jnp.isfinite(x), x, 0.0) * u)


def check_operator(name: str, *, seed: int = 0) -> None:
  """Check operator ``name`` of the registry against its contract (module docstring); AssertionError on failure,
  naming the operator, the check, the knob and the largest difference. An operator without a soft twin is checked
  for its declaration (and that its leg runs) only.

  Out-of-tree operators get the same check: register the module, then call ``check_operator('<name>')``.

  Example:
    >>> from engram_jax import check_operator
    >>> check_operator('tide')  # returns None, or raises AssertionError naming the check and the knob
  """
  op = registry.get(name)
  check_declaration(op)
  given: dict[str, Any] = {}
  with tempfile.TemporaryDirectory() as folder:
    if op.check_options is not None:  # an operator whose defaults cannot run alone (a file to read): its own options
      given.update(op.check_options(random_padded_episodes(seed)[0], folder))
    built = pipeline.build_options([pipeline.make_pipeline(legs={name: {'op': name, **given}})])
    episodes, arrays = random_padded_episodes(seed, tokenizers=built['tokenizers'], inputs=built.get('inputs'))
  options = op.options(given, where=f'check_operator({name!r})')
  n_questions = [len(e.questions) for e in episodes]
  check_leg(op, arrays, options, n_questions, seed=seed)
  if op.stages is not None:
    check_stages(op, arrays, options, seed=seed)
  if op.soft is None:
    return

  n_pad = max(a.docs.shape[0] for a in arrays)
  pipe = pipeline.make_pipeline(legs={name: {'op': name}}, fusion='rrf', name=name)
  paths = [f'legs.{name}.{k}' for k in op.fittable]
  # a greedy twin's pool covers every item, so that it is compared with the hard leg over the same candidates
  settings = fit.Settings(greedy_pool=n_pad, solve_batch=None)
  problem, _, every = fit.make_problem(pipe, paths, settings=settings)
  rows = fit.build_rows(problem, pipe, episodes, arrays, seed=seed)
  where = np.asarray(rows.where)

  def run(values: Mapping[str, float], scale: float = twins.COLD):
    vals = {**every, **{f'legs.{name}.{k}': v for k, v in values.items()}}
    hard = twins.hard_rows(
      problem, 0, arrays, n_questions, range(len(arrays)), twins.leg_options(problem, 0, vals), n_pad=n_pad, seed=seed
    )
    return hard, twins.soft_rows(problem, 0, vals, rows, scale=scale)

  # 2. cold equality at the defaults and at random draws, each moving every fittable knob away from its default
  rng = np.random.default_rng(seed)
  defaults = {k: float(op.defaults[k]) for k in op.fittable}
  draws = [('the declared defaults', defaults)]
  draws += [(f'random draw {i + 1}', random_values(op, rng)) for i in range(2)]

  def cold_gap(values: Mapping[str, float], label: str):
    hard, soft = run(values)
    return twins.compare(soft, hard, where, k=10, leg=name, op=name, at=f'{label} {_fmt(values)}')

  for label, values in draws:
    gap = cold_gap(values, label)
    if gap.ok:
      continue
    if values is defaults:
      _fail(name, 'cold equality', gap.message())
    culprits = exposing_knobs(values, defaults, lambda v: not cold_gap(v, 'one knob moved').ok)
    if culprits:
      exposed = f'exposed by the draw of {", ".join(culprits)} (moved alone from its default it fails too)'
    else:
      exposed = 'exposed by the draws together (no knob moved alone from its default fails)'
    _fail(name, 'cold equality', f'{exposed}: {gap.message()}')

  # 3. gradients and direction, at the declared defaults; a knob that the defaults make inert (a zero gradient
  # there, e.g. an exponent whose weight defaults to 0) at random draw 1 instead, which moves every knob
  u = jnp.asarray(rng.normal(size=where.shape) * where, jnp.float32)
  grad_fn = jax.jit(jax.grad(lambda v, r: _functional(fit.soft_leg(problem, 0, v, r, 1.0)[0], u)))
  f = lambda out: float(_functional(jax.tree_util.tree_map(jnp.asarray, out), u))
  scale_f = 1e-5 * (1.0 + float(jnp.sum(jnp.abs(u))))

  def directions(base: Mapping[str, float], label: str, knobs, *, defer_inert: bool) -> list[str]:
    """Part 3 at ``base`` for ``knobs``; returns the knobs with a zero gradient there when ``defer_inert``."""
    vals = {**every, **{f'legs.{name}.{k}': v for k, v in base.items()}}
    f_grad = grad_fn({p: jnp.asarray(v, jnp.float32) for p, v in vals.items()}, rows)
    warm = twins.soft_rows(problem, 0, vals, rows, scale=1.0)
    hard0, cold = run(base)
    smooth = not isinstance(warm, SoftSelection) and np.allclose(
      np.where(np.isfinite(warm), warm, 0.0), np.where(np.isfinite(cold), cold, 0.0), rtol=1e-5, atol=1e-6
    )
    f_hard0, f_cold0 = f(hard0), f(cold)
    at = f'at {label} {_fmt(base)}'
    inert = []
    for knob in knobs:
      g = float(f_grad[f'legs.{name}.{knob}'])
      if g == 0.0 and defer_inert:
        inert.append(knob)
        continue
      if not np.isfinite(g) or g == 0.0:
        _fail(
          name,
          'gradient sign',
          f'knob {knob}: the gradient of F through the twin is {g} (must be finite and non-zero) {at}',
        )
      transform = op.knob(knob).transform
      raw0 = inverse(transform, base[knob])
      moved_hard = False
      for step in STEPS:
        value = _forward(transform, raw0 + step)
        hard1, cold1 = run({**base, knob: value})
        d_hard, d_cold = f(hard1) - f_hard0, f(cold1) - f_cold0
        if abs(d_hard) <= scale_f:
          continue
        moved_hard = True
        if np.sign(d_hard) != np.sign(d_cold) or abs(d_cold) <= scale_f:
          _fail(
            name,
            'gradient sign',
            f'knob {knob}: moving it {base[knob]:.4g} -> {value:.4g} {at} changes F of the hard leg by '
            f'{d_hard:+.4g} but of the cold twin by {d_cold:+.4g} (opposite ways)',
          )
        break
      if not moved_hard:
        value = _forward(transform, raw0 + STEPS[-1])
        d_cold = f(run({**base, knob: value})[1]) - f_cold0
        if abs(d_cold) > scale_f:
          _fail(
            name,
            'gradient sign',
            f'knob {knob}: moving it {base[knob]:.4g} -> {value:.4g} {at} moves the twin (F by {d_cold:+.4g}) but '
            'never the hard leg',
          )
      if smooth:
        value = _forward(transform, raw0 + GRAD_STEP)
        d_hard = f(run({**base, knob: value})[0]) - f_hard0
        predicted = g * (value - base[knob])
        if abs(d_hard) > scale_f and abs(predicted) > scale_f and np.sign(d_hard) != np.sign(predicted):
          _fail(
            name,
            'gradient sign',
            f"knob {knob}: the twin's gradient predicts F {predicted:+.4g} for {base[knob]:.4g} -> "
            f'{value:.4g} {at}, the hard leg moves {d_hard:+.4g} (opposite ways)',
          )
    return inert

  inert = directions(defaults, 'the declared defaults', op.fittable, defer_inert=True)
  if inert:
    directions(draws[1][1], f'{draws[1][0]} (the defaults leave {", ".join(inert)} inert)', inert, defer_inert=False)

  # 4. per-question knobs
  for k in op.knobs:
    if k.per_question:
      check_per_question(op, problem, arrays, n_questions, rows, every, k.name, n_pad=n_pad, seed=seed)


def _forward(transform: str, raw: float) -> float:
  """:data:`engram_jax.fit.knobs.FORWARD` in float64 NumPy (a knob's value from its unconstrained value)."""
  return float(
    {
      'log': np.exp,
      'logit': lambda x: 1.0 / (1.0 + np.exp(-x)),
      'softplus': lambda x: np.logaddexp(0.0, x),
      'identity': lambda x: x,
    }[transform](raw)
  )


def _fmt(values: Mapping[str, float]) -> str:
  return '{' + ', '.join(f'{k}={v:.4g}' for k, v in values.items()) + '}'
