r"""The component contract: what every learned component (:mod:`engram_jax.fit.components`) must satisfy.

:func:`check_component` runs three checks on a pipeline's episodes and refuses, in one line naming the part, the
component and the knob (or the queries), the first that fails:

1. **identity at initialisation**: with its initial parameters the hard pipeline's final scores are those without it
   (skipped for a component that declares why not: ``identity_exempt``, e.g. the conditioned knobs' ``gate`` form);
2. **soft = hard** at random parameters (the initial ones plus seeded noise) on batched rows: the knob values its soft
   half writes (``conditions``) equal its hard half's on the same questions, and the cosine lists the soft rows carry
   equal those of the queries its hard half gives the legs;
3. **gradients**: the soft loss's gradient with respect to its parameters is finite, reaches every parameter, and
   reaches every entry the loss depends on (an entry with a zero gradient is moved by a finite difference: if the
   loss moves, its gradient was stopped).

The hard half runs as the scorers run it (:func:`engram_jax.fit.apply.fused`: compiled, with its parameters
round-tripped through an artifact's tensors, so NumPy arrays as a loaded artifact hands them); what it raises there
is refused in one line (part ``hard half``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode
from engram_jax.eval.pipeline import Pipeline
from engram_jax.fit import apply as road
from engram_jax.fit import artifact, train
from engram_jax.fit import components as registry
from engram_jax.fit import problem as P
from engram_jax.fit.knobs import Knobs


def _refuse(part: str, c: Any, what: str, why: str) -> EngramError:
  return EngramError(f'check_component: {part}: component {c.name!r}, {what}: {why}')


def _noisy(params: Any, seed: int, scale: float) -> Any:
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed), max(len(leaves), 1))
  return tree.unflatten(
    [x + scale * jax.random.normal(k, jnp.shape(x), jnp.asarray(x).dtype) for x, k in zip(leaves, keys)]
  )


def check_component(
  component: Any,
  pipe: Pipeline,
  params: Sequence[str],
  episodes: Sequence[Episode],
  arrays: Sequence[EpisodeArrays],
  *,
  seed: int = 0,
  noise: float = 0.5,
  batch: int = 16,
  atol: float = 1e-4,
  settings: P.Settings | None = None,
  temperatures: P.Temperatures | None = None,
) -> None:
  """Check ``component`` on ``pipe`` fitted over ``params`` with ``episodes`` (their padded ``arrays``);
  ``settings`` / ``temperatures``: the fit's (default the library's), e.g. the CFS-R gradient a query adapter needs.

  Raises:
    EngramError: one line, ``check_component: <part>: component '<name>', knob <path> (or queries): <why>``.

  Example:
    >>> from engram_jax.fit import Conditioning
    >>> from engram_jax.testing.components import check_component
    >>> from engram_jax.testing.synthetic import toy_fit_data
    >>> episodes, embeddings, arrays, pipe = toy_fit_data()
    >>> cond = Conditioning(knobs=('legs.bm25.weight',), features=('cues', 'pool'), hidden=0, rank=2, net_lr_scale=1.0)
    >>> check_component(cond, pipe, ['legs.bm25.weight'], episodes, arrays)  # passes: returns None
  """
  c = component
  extra = {'settings': settings} if settings is not None else {}
  extra.update({'temperatures': temperatures} if temperatures is not None else {})
  problem, knobs, every = P.make_problem(pipe, list(params), **extra)
  rows = P.build_rows(problem, pipe, episodes, arrays, seed=seed)
  inputs = c.inputs(problem, episodes, arrays)
  init = c.init(inputs, seed)
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  scalar = {**fixed, **Knobs(raw=dict(knobs.raw), transforms=problem.fitted).values()}
  base_res = train.FitResult(
    values=train.fitted_values(problem, scalar), losses=[], train_rows=0, wall_s=0.0, raw=dict(knobs.raw), learned={}
  )

  arts = {
    flag: artifact.in_memory(pipe, problem, every, (c,) if flag else (), {'fit': base_res}, {}) for flag in (0, 1)
  }

  def hard(ps, with_component: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each episode's final scores and the queries its legs saw, through the scorers' own road
    (:func:`engram_jax.fit.apply.fused`: compiled, the parameters as a saved artifact hands them, NumPy)."""
    res = dataclasses.replace(base_res, learned={c.name: ps}) if with_component else base_res
    try:
      res = artifact.from_tensors(artifact.tensors(res), res.values)
    except (TypeError, ValueError) as e:
      raise _refuse('hard half', c, 'parameters', f'cannot be saved as an artifact ({type(e).__name__}: {e})') from None
    out = []
    for i, (e, a) in enumerate(zip(episodes, arrays)):
      nq = len(e.questions)
      docs = np.asarray(a.docs, np.float32)[: e.n_items]
      q = np.asarray(a.queries, np.float32)[:nq]
      try:
        fused, seen = road.fused(arts[with_component], res, e, docs, q, jax.random.key(i))
      except EngramError:
        raise
      except Exception as err:  # noqa: BLE001 - whatever the component's hard half raises is the refusal
        why = f'{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ""}'
        raise _refuse(
          'hard half', c, 'as the scorer runs it (compiled, its parameters NumPy arrays as an artifact loads them)', why
        ) from None
      out.append((np.asarray(fused)[:nq], np.asarray(seen.queries)[:nq]))
    return out

  # 1. identity at initialisation (unless the component declares why not). Its hard half acts through two channels,
  # the queries the legs see and the knob values; when both are the base ones to ``atol`` at init it is the identity
  # up to rounding (which may break exact cosine ties differently: a bag-of-words embedder has them), else the hard
  # scores must be those without it.
  exempt = registry.identity_exempt(c) is not None
  moves = None if exempt else _init_moves(c, problem, init, knobs, scalar, episodes, arrays, atol)
  got, want = (hard(init, True), hard(None, False)) if moves is not None else ([], [])
  for (g, _), (w, _), e in zip(got, want, episodes):
    real = np.isfinite(w)
    if not np.array_equal(real, np.isfinite(g)) or not np.allclose(g[real], w[real], atol=atol):
      bad = float(np.max(np.abs(np.where(real, g, 0.0) - np.where(real, w, 0.0))))
      raise _refuse(
        'identity at initialisation',
        c,
        f'{moves} (episode {e.id})',
        f'its initial parameters change the hard scores by {bad:.3g}',
      )

  # 2. soft = hard at random parameters, batched rows
  ps = _noisy(init, seed + 1, noise)
  idx = jnp.arange(min(batch, rows.where.shape[0]))
  rows_b = jax.tree_util.tree_map(lambda x: x[idx], rows)
  vals, rows_soft = c.apply(problem, ps, dict(knobs.raw), dict(scalar), rows_b, c.batch(inputs, idx))
  hard_vals, cos = [], []
  for (e, a), (_, queries) in zip(zip(episodes, arrays), hard(ps, True)):
    nq = len(e.questions)
    hv = c.hard_values(problem, ps, dict(knobs.raw), dict(scalar), c.hard_inputs(a, nq))
    hard_vals.append({p: np.broadcast_to(np.asarray(hv[p]), (a.queries.shape[0],))[:nq] for p in c.conditions})
    n = rows.where.shape[1]
    docs = np.zeros((n, a.docs.shape[1]), np.float32)
    docs[: a.docs.shape[0]] = np.asarray(a.docs)[:n]
    cos.append(queries @ docs.T)
  for path in c.conditions:
    h = np.concatenate([v[path] for v in hard_vals])[np.asarray(idx)]
    s = np.broadcast_to(np.asarray(vals[path]), h.shape)
    if not np.allclose(s, h, atol=atol, rtol=1e-4):
      bad = float(np.max(np.abs(s - h)))
      raise _refuse(
        'soft = hard', c, f'knob {path}', f'its soft and hard values differ by {bad:.3g} at random parameters'
      )
  hard_cos = np.concatenate(cos)[np.asarray(idx)]
  where = np.asarray(rows_b.where)
  soft_cos = np.asarray(rows_soft.cos)
  if not np.allclose(np.where(where, soft_cos, 0.0), np.where(where, hard_cos, 0.0), atol=atol):
    bad = float(np.max(np.abs(np.where(where, soft_cos, 0.0) - np.where(where, hard_cos, 0.0))))
    raise _refuse('soft = hard', c, 'queries', f'the soft rows and the hard legs see cosines {bad:.3g} apart')

  # 3. finite gradients that reach every parameter, and every entry the soft loss depends on
  full = {train.KNOBS: dict(knobs.raw), c.name: ps}
  loss = functools.partial(train.loss_fn, problem=problem, max_gold=train.max_gold_of(rows), components=(c,))
  batch_inputs = {c.name: c.batch(inputs, idx)}

  def soft_loss(p):
    return loss(p, fixed, rows_b, batch_inputs, jnp.ones(idx.shape[0]))

  grads = jax.grad(soft_loss)(full)[c.name]
  for key, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    name = jax.tree_util.keystr(key)
    g = np.asarray(g)
    if not np.all(np.isfinite(g)):
      raise _refuse('gradients', c, f'parameter {name}', 'the soft loss gradient is not finite')
    if not np.any(g != 0):
      raise _refuse('gradients', c, f'parameter {name}', 'no gradient reaches it from the soft loss')
    stopped = _stopped_entry(jax.jit(soft_loss), full, c.name, key, g, seed=seed)
    if stopped is not None:
      entry, slope = stopped
      raise _refuse(
        'gradients', c, f'parameter {name}{list(entry)}',
        f'no gradient reaches this entry, yet the soft loss moves with it ({slope:.3g} per unit, by finite '
        'differences): a stopped gradient',
      )  # fmt: skip


def _stopped_entry(
  soft_loss, full: dict, name: str, key, g: np.ndarray, *, seed: int, max_entries: int = 32, eps: float = 1e-2
) -> tuple[tuple[int, ...], float] | None:
  """The first entry of parameter ``key`` of component ``name`` whose gradient is 0 although the loss changes with
  it (a central finite difference over ``eps``, beyond float32 noise), among up to ``max_entries`` zero-gradient
  entries (a seeded sample); None when every such entry is truly unreached (no row of the data reads it)."""
  zero = np.argwhere(g == 0)
  if not len(zero):
    return None
  if len(zero) > max_entries:
    zero = zero[np.random.default_rng(seed).choice(len(zero), max_entries, replace=False)]
  leaves, tree = jax.tree_util.tree_flatten_with_path(full[name])
  pos = [k for k, _ in leaves].index(key)
  base = float(soft_loss(full))
  tol = 1e-5 * max(1.0, abs(base)) / eps + 1e-4
  for entry in zero:
    entry = tuple(int(i) for i in entry)
    moved = []
    for sign in (1.0, -1.0):
      vals = [v for _, v in leaves]
      vals[pos] = jnp.asarray(vals[pos]).at[entry].add(sign * eps)
      moved.append(float(soft_loss({**full, name: jax.tree_util.tree_unflatten(tree, vals)})))
    slope = (moved[0] - moved[1]) / (2 * eps)
    if abs(slope) > tol:
      return entry, slope
  return None


def _init_moves(c, problem, init, knobs, scalar, episodes, arrays, atol: float) -> str | None:
  """What ``c`` at its initial parameters moves by more than ``atol`` (``'queries'`` or ``'knob <path>'``), else None."""
  for e, a in zip(episodes, arrays):
    nq = len(e.questions)
    q = np.asarray(a.queries, np.float32)[:nq]
    if np.max(np.abs(np.asarray(c.hard_queries(init, q), np.float32) - q), initial=0.0) > atol:
      return 'queries'
    vals = c.hard_values(problem, init, dict(knobs.raw), dict(scalar), c.hard_inputs(a, nq))
    for path, v in vals.items():
      base = np.asarray(scalar.get(path, np.nan), np.float32)
      if np.max(np.abs(np.asarray(v, np.float32)[..., :nq] - base) if np.ndim(v) else np.abs(v - base)) > atol:
        return f'knob {path}'
  return None
