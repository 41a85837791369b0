"""Pipelines: named legs (a registered operator + depth + weight + knob values) and a fusion.

A leg runs a registered operator (:mod:`engram_jax.ops`) on padded episode arrays and returns ``[Q, N]`` scores
(``-inf`` = not ranked). A :class:`Pipeline` with one leg and ``fusion='none'`` ranks by that leg; with
``fusion='rrf'`` it fuses the legs by :func:`engram_jax.ops.rrf.rrf_fuse`. The final list is the top ``k`` under
the shared tie rule (:mod:`engram_jax.core.ranking`), and every real question gets exactly ``k`` real items (asserted by
:func:`check_equal_k`).

Legs are addressed by name, never by position: a knob's path is ``legs.<leg>.<knob>`` (``legs.cfsr.lam``), a
fusion weight ``legs.<leg>.weight``, the RRF offset ``k0`` -- the same paths as in the pipeline's YAML node::

    rrf_cos_bm25_cfsr:
      fusion: rrf
      k0: 60
      legs:
        cos: {op: cosine}
        bm25: {op: bm25}
        cfsr: {op: cfsr, depth: 50, weight: 3.0, lam: 0.005}

Each leg draws its random key by its position in the written order (``jax.random.split(key, n_legs)``), so
reordering legs changes nothing except the noise draw of a stochastic leg (cos2).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from engram_jax.core import ranking, validation
from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.errors import EngramError
from engram_jax.ops import registry, rrf
from engram_jax.ops.registry import LEG_KEYS

FUSIONS = ('none', 'rrf')


@dataclasses.dataclass(frozen=True, eq=False)
class LegSpec:
  """One leg: a registered operator with its knob values, a depth (static) and a fusion weight.

  Attributes:
    name: the leg's name in its pipeline (unique there); paths are ``legs.<name>.<knob>``.
    op: the registered operator's name.
    depth: how many of the leg's top items RRF reads (static).
    weight: the leg's RRF weight.
    options: every knob value of the operator (defaults filled in, validated), as ``(name, value)`` pairs.
  """

  name: str
  op: str
  depth: int = 10
  weight: float = 1.0
  options: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self) -> None:
    operator = registry.get(self.op)
    where = f'leg {self.name}'
    if isinstance(self.depth, bool) or not isinstance(self.depth, (int, np.integer)) or self.depth < 1:
      raise EngramError(f'{where}: depth must be an integer >= 1 (leg depth), got {self.depth!r}')
    if not validation.is_number(self.weight) or not 0 <= self.weight < math.inf:
      raise EngramError(f'{where}: weight must be >= 0 and finite (fusion weight), got {self.weight!r}')
    full = operator.options(dict(self.options), where=where)
    object.__setattr__(self, 'options', tuple(full.items()))
    object.__setattr__(self, 'score', functools.partial(operator.leg, **full))

  @property
  def operator(self) -> registry.Operator:
    return registry.get(self.op)

  def option(self, name: str) -> Any:
    return dict(self.options)[name]

  def replace(self, **changes: Any) -> LegSpec:
    """A copy with leg keys (``depth``, ``weight``) or knob values changed."""
    leg = {k: changes.pop(k) for k in ('depth', 'weight') if k in changes}
    return LegSpec(
      name=self.name,
      op=self.op,
      depth=int(leg.get('depth', self.depth)),
      weight=float(leg.get('weight', self.weight)),
      options=tuple({**dict(self.options), **changes}.items()),
    )


def make_leg(name: str, node: Mapping[str, Any]) -> LegSpec:
  """A :class:`LegSpec` from a YAML leg node ``{op, depth, weight, <knob>: value, ...}`` (``op`` defaults to the
  leg's name)."""
  node = dict(node)
  op = node.pop('op', name)
  depth = node.pop('depth', 10)
  weight = node.pop('weight', 1.0)
  if isinstance(weight, int) and not isinstance(weight, bool):
    weight = float(weight)
  return LegSpec(name=str(name), op=str(op), depth=depth, weight=weight, options=tuple(node.items()))


@dataclasses.dataclass(frozen=True, eq=False)
class Pipeline:
  """Named legs and a fusion (``'none'`` for one leg, ``'rrf'``). Hashes by identity, so it can be jit-static.

  Example:
    >>> from engram_jax import make_pipeline
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}}, name='dense')
    >>> pipe.fusion, pipe.leg('cos').op
    ('none', 'cosine')
  """

  legs: tuple[LegSpec, ...]
  fusion: str = 'none'
  k0: float = 60.0
  name: str = ''

  def __post_init__(self) -> None:
    if not self.legs:
      raise EngramError(f'pipeline {self.name}: no legs')
    if self.fusion not in FUSIONS:
      raise EngramError(f'pipeline {self.name}: fusion must be one of {list(FUSIONS)}, got {self.fusion!r}')
    if self.fusion == 'none' and len(self.legs) != 1:
      raise EngramError(f'pipeline {self.name}: fusion none needs exactly one leg, got {len(self.legs)}')
    names = [leg.name for leg in self.legs]
    if len(set(names)) != len(names):
      raise EngramError(f'pipeline {self.name}: leg names must be unique, got {names}')
    if not validation.is_number(self.k0) or not 0 < self.k0 < math.inf:
      raise EngramError(f'pipeline {self.name}: k0 must be > 0 and finite (RRF rank offset), got {self.k0!r}')

  def leg(self, name: str) -> LegSpec:
    for leg in self.legs:
      if leg.name == name:
        return leg
    raise EngramError(f'pipeline {self.name}: no leg {name!r}; legs: {[l.name for l in self.legs]}')


def make_pipeline(
  *, legs: Mapping[str, Mapping[str, Any]] | Sequence[LegSpec], fusion: str = 'none', k0: float = 60.0, name: str = ''
) -> Pipeline:
  """A :class:`Pipeline` from YAML-shaped legs (``{leg name: {op, depth, weight, knobs...}}``) or LegSpecs.

  Raises:
    ValueError: one line naming the pipeline, the leg and the bad option (unknown operator or knob, a value out
      of its range, duplicate leg names).

  Example:
    >>> from engram_jax import make_pipeline
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25', 'k1': 1.2}}, fusion='rrf', name='hybrid')
    >>> [(leg.name, leg.op, leg.depth) for leg in pipe.legs], pipe.k0
    ([('cos', 'cosine', 10), ('bm25', 'bm25', 10)], 60.0)
  """
  try:
    if isinstance(legs, Mapping):
      specs = tuple(make_leg(n, node) for n, node in legs.items())
    else:
      specs = tuple(legs)
  except ValueError as e:
    raise EngramError(f'pipeline {name}, {e}') from None
  return Pipeline(legs=specs, fusion=fusion, k0=float(k0), name=name)


# ---- knobs by path ---------------------------------------------------------------------------------------------


def split_path(pipe: Pipeline, path: str) -> tuple[str, str | None]:
  """``'k0'`` -> ``('k0', None)``; ``'legs.<leg>.<knob>'`` -> ``(<leg>, <knob>)`` (knob ``weight`` / ``depth`` are
  leg keys); ValueError on anything else."""
  parts = path.split('.')
  if parts == ['k0']:
    return 'k0', None
  if len(parts) == 3 and parts[0] == 'legs':
    leg = pipe.leg(parts[1])
    if parts[2] in ('weight', 'depth') or parts[2] in dict(leg.options):
      return parts[1], parts[2]
    raise EngramError(
      f'pipeline {pipe.name}: leg {parts[1]} ({leg.op}) has no knob {parts[2]!r}; knobs: '
      f'{["weight", "depth", *dict(leg.options)]}'
    )
  raise EngramError(f"pipeline {pipe.name}: knob paths are 'k0' or 'legs.<leg>.<knob>', got {path!r}")


def knob_value(pipe: Pipeline, path: str) -> Any:
  """The value of knob ``path`` (``k0``, ``legs.<leg>.weight``, ``legs.<leg>.<knob>``) in ``pipe``."""
  leg, knob = split_path(pipe, path)
  if knob is None:
    return pipe.k0
  spec = pipe.leg(leg)
  return getattr(spec, knob) if knob in ('weight', 'depth') else spec.option(knob)


def with_values(pipe: Pipeline, values: Mapping[str, Any], *, name: str | None = None) -> Pipeline:
  """``pipe`` with knobs set by path (a fit's or a tuning grid's values); validated like a YAML pipeline."""
  k0 = pipe.k0
  changes: dict[str, dict[str, Any]] = {}
  for path, value in values.items():
    leg, knob = split_path(pipe, path)
    if knob is None:
      k0 = float(value)
    else:
      changes.setdefault(leg, {})[knob] = value
  legs = tuple(l.replace(**changes[l.name]) if l.name in changes else l for l in pipe.legs)
  return Pipeline(legs=legs, fusion=pipe.fusion, k0=k0, name=pipe.name if name is None else name)


def reads_vectors(pipelines: Iterable[Pipeline]) -> bool:
  """Whether any leg of ``pipelines`` reads embeddings (its operator's ``vectors``); False: a run of them needs no
  embedder (a lexical-only run embeds nothing)."""
  return any(leg.operator.vectors for p in pipelines for leg in p.legs)


def build_options(pipelines: Iterable[Pipeline]) -> dict[str, Any]:
  """What :func:`engram_jax.core.batch.episode_arrays` must build for these pipelines' legs (e.g. the BM25 tokenizers),
  merged over every leg whose operator declares ``needs``: ``'tokenizers'`` and, where a leg reads precomputed
  per-question values (an external run, :mod:`engram_jax.ops.trec_run`), ``'inputs'`` (name -> builder)."""
  tokenizers = ['words']
  inputs: dict[str, Any] = {}
  for p in pipelines:
    for leg in p.legs:
      needs = leg.operator.needs
      if needs is not None:
        asked = needs(dict(leg.options))
        tokenizers += list(asked.get('tokenizers', ()))
        inputs.update(asked.get('inputs', {}))
  out: dict[str, Any] = {'tokenizers': tuple(dict.fromkeys(tokenizers))}
  if inputs:
    out['inputs'] = dict(sorted(inputs.items()))
  return out


# ---- running -----------------------------------------------------------------------------------------------------


def traced_values(pipeline: Pipeline) -> dict[str, float]:
  """The knobs a jitted run may take as arguments rather than constants, by path: every numeric knob its operator
  does not declare static, and with RRF the leg weights and ``k0``. Pipelines that differ only in these
  (a grid over ``lam``, the noise scales of cos2) share one compiled program (:func:`structure_key`)."""
  out: dict[str, float] = {}
  for leg in pipeline.legs:
    static = {k.name for k in leg.operator.knobs if k.static}
    for name, value in leg.options:
      if name not in static and isinstance(value, (int, float)) and not isinstance(value, bool):
        out[f'legs.{leg.name}.{name}'] = value
    if pipeline.fusion == 'rrf':
      out[f'legs.{leg.name}.weight'] = leg.weight
  if pipeline.fusion == 'rrf':
    out['k0'] = pipeline.k0
  return out


def structure_key(pipeline: Pipeline) -> tuple:
  """What a compiled program of ``pipeline`` depends on once :func:`traced_values` are arguments: the fusion and,
  per leg, its name, operator, depth and the values of its other knobs (static or non-numeric)."""
  traced = traced_values(pipeline)
  return (
    pipeline.fusion,
    tuple(
      (leg.name, leg.op, leg.depth, tuple((n, v) for n, v in leg.options if f'legs.{leg.name}.{n}' not in traced))
      for leg in pipeline.legs
    ),
  )


def legs_scores(pipeline: Pipeline, ep: EpisodeArrays, key: Array, values: Mapping[str, Any]) -> list[Array]:
  """Each leg's hard scores ``[Q, N]`` on one padded episode (leg ``i`` with the ``i``-th split of ``key``), its
  knobs replaced by ``values`` (by path; traced scalars, or ``[Q]`` arrays for a knob declared ``per_question``)."""
  keys = jax.random.split(key, len(pipeline.legs))
  out = []
  for spec, k_ in zip(pipeline.legs, keys):
    prefix = f'legs.{spec.name}.'
    mine = {p[len(prefix) :]: v for p, v in values.items() if p.startswith(prefix) and p[len(prefix) :] != 'weight'}
    out.append(spec.operator.leg(ep, k_, **{**dict(spec.options), **mine}) if mine else spec.score(ep, k_))
  return out


def pipeline_scores(
  pipeline: Pipeline, ep: EpisodeArrays, key: Array, values: Mapping[str, Any] | None = None
) -> Array:
  """Final scores ``[Q, N]`` of a pipeline on one padded episode (before the top-k cut).

  ``values`` (optional, by path, e.g. from :func:`traced_values`) replace the pipeline's knob values, leg weights
  and ``k0``; they may be traced arrays (one compiled program for every pipeline of the same
  :func:`structure_key`).

  Example:
    >>> import jax, numpy as np
    >>> from engram_jax import Episode, Item, Question, episode_arrays, make_pipeline, pipeline_scores
    >>> items = (Item('a', 'dog adopted', 'S1', 0), Item('b', 'invoice overdue', 'S1', 1))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('a',), ('S1',), 1),))
    >>> arrays = episode_arrays(ep, np.eye(2, 4, dtype=np.float32), np.eye(1, 4, dtype=np.float32), n_multiple=8)
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, fusion='rrf')
    >>> s = pipeline_scores(pipe, arrays, jax.random.key(0))
    >>> s.shape, int(s[0].argmax())  # [Q, N] padded; item 0 ranks first
    ((1, 2), 0)
  """
  values = dict(values or {})
  leg_scores = legs_scores(pipeline, ep, key, values)
  if pipeline.fusion == 'none':
    return jnp.where(ep.where, leg_scores[0], -jnp.inf)
  weights = [values.get(f'legs.{s.name}.weight', s.weight) for s in pipeline.legs]
  return rrf.rrf_fuse(
    jnp.stack(leg_scores),
    weights=jnp.stack([jnp.asarray(w, jnp.float32) for w in weights]),
    depths=[s.depth for s in pipeline.legs],
    where=ep.where,
    k0=values.get('k0', pipeline.k0),
  )


def pipeline_topk(
  pipeline: Pipeline, ep: EpisodeArrays, key: Array, *, k: int, values: Mapping[str, Any] | None = None
) -> Array:
  """Top-``k`` item indices ``[Q, k]`` under the shared tie rule. Jit with ``pipeline`` and ``k`` static
  (``values``: see :func:`pipeline_scores`).

  Example:
    >>> import jax, numpy as np
    >>> from engram_jax import Episode, Item, Question, episode_arrays, make_pipeline, pipeline_topk
    >>> texts = ['dog adopted', 'invoice overdue', 'hike in the alps']
    >>> items = tuple(Item(f'i{j}', t, 'S1', j) for j, t in enumerate(texts))
    >>> ep = Episode('e', items, (Question('q', 'which dog?', ('i0',), ('S1',), 1),))
    >>> arrays = episode_arrays(ep, np.eye(3, 4, dtype=np.float32), np.eye(1, 4, dtype=np.float32))
    >>> pipe = make_pipeline(legs={'bm25': {'op': 'bm25'}})
    >>> pipeline_topk(pipe, arrays, jax.random.key(0), k=2)[0].tolist()  # item 0 holds 'dog'; the rest tie at 0: later first
    [0, 2]
  """
  idx, vals = ranking.top_k(pipeline_scores(pipeline, ep, key, values), k=k, where=ep.where)
  return jnp.where(jnp.isneginf(vals), -1, idx)


def check_equal_k(
  topk: np.ndarray, n_questions: int, *, k: int, name: str, episode: str, n_items: int | None = None
) -> None:
  """Assert every real question got exactly ``k`` real, distinct items (indices below ``n_items`` when given)."""
  t = np.asarray(topk)[:n_questions]
  if t.shape[1] != k or np.any(t < 0):
    raise AssertionError(f'Pipeline {name} returned fewer than k={k} items in episode {episode}')
  if n_items is not None and t.size and t.max() >= n_items:
    raise AssertionError(f'Pipeline {name} returned a padding item (index {t.max()} >= {n_items}) in episode {episode}')
  if np.any(np.diff(np.sort(t, axis=1), axis=1) == 0):
    raise AssertionError(f'Pipeline {name} returned duplicate items in episode {episode}')


__all__ = [
  'LEG_KEYS',
  'LegSpec',
  'Pipeline',
  'build_options',
  'check_equal_k',
  'knob_value',
  'make_leg',
  'legs_scores',
  'make_pipeline',
  'pipeline_scores',
  'pipeline_topk',
  'split_path',
  'structure_key',
  'traced_values',
  'with_values',
]
