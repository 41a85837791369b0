r"""The component registry: a learned component's name -> its class, which declares both halves.

A component (:class:`engram_jax.fit.train.Component`) is a frozen dataclass whose fields are its config keys (with
their defaults) and whose ``name`` keys this registry. Its soft half changes the soft problem in the fit
(``inputs`` / ``init`` / ``apply``); its hard half says how scoring applies the saved parameters:

* ``hard_queries(params, queries [Q, D]) -> [Q, D]``: the queries the legs see (the adapter adapts them);
* ``hard_inputs(base, n_questions)``: what its hard values read from one padded episode's base arrays (``None``);
* ``hard_values(problem, params, raw, vals, inputs) -> vals``: the knob values after it, scalars or ``[Q]`` per
  question (the conditioned knobs); each component applies to the values the previous one left;
* ``conditions``: the knob paths it writes (two components writing one knob are refused in one line:
  :func:`check_composition`).

What the entry point reads from it (each optional, with a default here; nothing outside a component's own module
names it):

* its config keys: its dataclass fields (with their defaults) and ``config_keys``, more keys of its config node that
  are not parameters of the component (name -> default, :data:`REQUIRED` for none), read by :func:`from_config`;
* ``settings(node) -> dict``: the fit settings (:class:`engram_jax.fit.Settings` fields) of a fit with it, from its
  config node (the adapter's own ``cfsr_grad``); :func:`variant_settings` merges them in order;
* ``check_problem(pipe, problem)``: a ``ValueError`` when it cannot fit ``problem`` (:func:`check_problem`);
* ``identity_exempt``: ``None``, or why its initial parameters change the hard scores by design (the contract
  :func:`engram_jax.testing.check_component` then skips that part and checks the rest);
* ``fixed_dimension``: true when its parameters are tied to the embedder's dimension (an artifact with it cannot
  apply to vectors of another).

What it saves is its parameter pytree (``<name>/<key path>`` in the artifact). :func:`hard_scores` and
:func:`score_episodes` iterate the components; nothing here branches on a component's name. Built-in components
register on import (``engram_jax.fit.adapter``, ``engram_jax.fit.conditioned``); an out-of-tree one calls
:func:`register_component` at import time and is recorded in an artifact's ``modules``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from engram_jax.core import ranking
from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode
from engram_jax.eval.pipeline import Pipeline, check_equal_k, legs_scores, split_path, with_values
from engram_jax.fit.knobs import Knobs
from engram_jax.fit.problem import Problem, per_question_fusion
from engram_jax.metrics import labels as metrics_lib
from engram_jax.ops import rrf

COMPONENTS: dict[str, type] = {}
REQUIRED = dataclasses.MISSING  # a ``config_keys`` entry without a default


def register_component(cls: type, *, replace: bool = False) -> type:
  """Register a component class under its ``name`` (usable as a class decorator); a second class under one name is
  an error unless ``replace``.

  Example:
    >>> import dataclasses
    >>> from engram_jax.fit import Conditioning, register_component
    >>> from engram_jax.fit.components import COMPONENTS, check_composition
    >>> @register_component
    ... @dataclasses.dataclass(frozen=True)
    ... class Mine(Conditioning):  # a component with its own name (a real one declares its own halves)
    ...   name = 'mine'
    >>> sorted(COMPONENTS)
    ['adapter', 'conditioned', 'mine']
    >>> del COMPONENTS['mine']  # (tests register for a with-block: registered_component)
  """
  name = getattr(cls, 'name', None)
  if not isinstance(name, str) or not name:
    raise ValueError(f'component {cls.__name__} declares no name')
  if name in COMPONENTS and not replace and COMPONENTS[name] is not cls:
    raise ValueError(f'component {name!r} is already registered')
  COMPONENTS[name] = cls
  return cls


@contextlib.contextmanager
def registered_component(cls: type) -> Iterator[type]:
  """Register ``cls`` for the length of a ``with`` block (a test's toy component)."""
  before = COMPONENTS.get(cls.name)
  register_component(cls, replace=True)
  try:
    yield cls
  finally:
    if before is None:
      COMPONENTS.pop(cls.name, None)
    else:
      COMPONENTS[cls.name] = before


def get_component(name: str) -> type:
  """The component class registered as ``name``; one line listing the registered ones otherwise."""
  if name not in COMPONENTS:
    raise EngramError(f'unknown component {name!r}; registered: {sorted(COMPONENTS)}')
  return COMPONENTS[name]


def component_spec(c: Any) -> dict[str, Any]:
  """A component's spec as JSON (its kind under ``name``)."""
  spec = {'name': c.name, **dataclasses.asdict(c)}
  return {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}


def component_of(spec: Mapping[str, Any]) -> Any:
  """The component a :func:`component_spec` describes.

  >>> import engram_jax.fit
  >>> component_of({'name': 'adapter', 'rank': 8, 'lr_scale': 0.1}).rank
  8
  """
  spec = dict(spec)
  cls = get_component(spec.pop('name'))
  fields = {f.name for f in dataclasses.fields(cls)}
  return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items() if k in fields})


def config_keys(cls: type) -> dict[str, Any]:
  """Every key of a component's config node and its default (:data:`REQUIRED` when it has none): its dataclass
  fields, then its ``config_keys``.

  >>> import engram_jax.fit
  >>> config_keys(get_component('adapter'))['soft_query_legs']
  False
  """
  out = {f.name: f.default for f in dataclasses.fields(cls)}
  out.update(getattr(cls, 'config_keys', {}))
  return out


def _coerce(value: Any, kind: Any) -> Any:
  """A config value as the declared type ``kind`` (a field's annotation, or the type name of a ``config_keys``
  default): ``int`` (integral numbers only), ``float``, ``bool`` (true or false only), ``tuple[...]`` (a list, not a
  string); others as given. A value of another kind is a ``ValueError``, never a guess (``bool('false')`` is True,
  ``int(2.7)`` is 2, ``tuple('k0')`` is ``('k', '0')``)."""
  kind = kind if isinstance(kind, str) else getattr(kind, '__name__', str(kind))
  if kind.startswith('tuple'):
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
      raise ValueError(f'expected a list, got {value!r}')
    return tuple(value)
  if kind == 'bool':
    if not isinstance(value, (bool, np.bool_)):
      raise ValueError(f'expected true or false, got {value!r}')
    return bool(value)
  if kind in ('int', 'float'):
    number = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
    if kind == 'float' and number:
      return float(value)
    if kind == 'int' and number and float(value).is_integer():
      return int(value)
    raise ValueError(f'expected {"an integer" if kind == "int" else "a number"}, got {value!r}')
  return value


def from_config(name: str, node: Mapping[str, Any], where: str | None = None) -> Any:
  """The component ``name`` from its config node (a plain mapping; ``where``: how the error names it, default
  ``fit.<name>``): unknown keys and missing required ones refused in one line, values as the fields' types.

  >>> import engram_jax.fit
  >>> from_config('adapter', {'rank': 2, 'lr_scale': 1, 'cfsr_grad': 'implicit'})
  Adapter(rank=2, lr_scale=1.0, soft_query_legs=False)
  """
  cls = get_component(name)
  where = where or f'fit.{name}'
  keys = config_keys(cls)
  node = dict(node)
  unknown = sorted(set(node) - set(keys))
  if unknown:
    raise EngramError(f'{where}: unknown keys {unknown}; allowed {list(keys)}')
  required = [k for k, v in keys.items() if v is REQUIRED]
  missing = [k for k in required if k not in node]
  if missing:
    example = getattr(cls, 'config_example', '')
    raise EngramError(
      f'{where} is missing {", ".join(missing)}; it needs {", ".join(required)}'
      + (f' (e.g. {example})' if example else '')
    )
  fields = {f.name: f.type for f in dataclasses.fields(cls)}
  values = {}
  for k, v in node.items():  # fields as their annotations; other keys as their defaults' types (none: as given)
    default = keys[k]
    kind = fields.get(k) or ('any' if default is REQUIRED or default is None else type(default).__name__)
    try:
      coerced = _coerce(v, kind)
    except (TypeError, ValueError) as e:
      raise EngramError(f'{where}.{k}: {e}') from None
    if k in fields:
      values[k] = coerced
  try:
    return cls(**values)
  except (TypeError, ValueError) as e:
    raise EngramError(f'{where}: {e}') from None


def variant_settings(components: Sequence[Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
  """The fit settings the components of one fit ask for (each one's ``settings(node)``, in order; a bad value in a
  node, and two components that ask for different values of one setting, are refused in one line)."""
  out: dict[str, Any] = {}
  by: dict[str, str] = {}
  for c in components:
    hook = getattr(c, 'settings', None)
    try:
      asked = hook(dict(nodes.get(c.name) or {})) if hook else {}
    except ValueError as e:  # a bad value in its node: one line naming the component
      raise EngramError(f'fit.{c.name}: {e}') from None
    for key, value in asked.items():
      if key in out and out[key] != value:
        raise EngramError(f'components {by[key]!r} and {c.name!r} ask for {key}={out[key]!r} and {value!r}')
      out[key], by[key] = value, c.name
  return out


def check_problem(components: Sequence[Any], pipe: Pipeline, problem: Problem) -> None:
  """Each component's ``check_problem(pipe, problem)`` (a ``ValueError`` when it cannot fit it)."""
  for c in components:
    hook = getattr(c, 'check_problem', None)
    if hook is not None:
      hook(pipe, problem)


def identity_exempt(component: Any) -> str | None:
  """Why ``component`` is not the identity at initialisation by design (its ``identity_exempt``), else None."""
  return getattr(component, 'identity_exempt', None)


def fixed_dimension(components: Sequence[Any]) -> list[str]:
  """The components whose parameters are tied to the embedder's dimension (``fixed_dimension``)."""
  return [c.name for c in components if getattr(c, 'fixed_dimension', False)]


def check_composition(components: Sequence[Any]) -> None:
  """Refuse, in one line, two components of one name or two that write one knob (``conditions``)."""
  seen: dict[str, str] = {}
  names = [c.name for c in components]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise EngramError(f'components {dup} are listed twice; each component applies once per fit')
  for c in components:
    for path in getattr(c, 'conditions', ()):
      if path in seen:
        raise EngramError(
          f'components {seen[path]!r} and {c.name!r} both condition knob {path!r}; one knob, one component'
        )
      seen[path] = c.name


def hard_queries(components: Sequence[Any], learned: Mapping[str, Any], queries: np.ndarray) -> np.ndarray:
  """``[Q, D]`` the queries the legs see: each component's ``hard_queries`` in order."""
  for c in components:
    queries = c.hard_queries(learned[c.name], queries)
  return queries


def per_question(components: Sequence[Any]) -> bool:
  """True when a component gives knobs one value per question (scoring fuses question by question)."""
  return any(c.per_question for c in components)


def hard_scores(
  pipe: Pipeline,
  problem: Problem,
  components: Sequence[Any],
  res: Any,
  fixed: Mapping[str, float],
  ep: EpisodeArrays,
  inputs: Mapping[str, Any],
  key: Array,
) -> Array:
  """Final scores ``[Q, N]`` of the hard pipeline on one padded episode (``ep``: the queries the legs see) with every
  component's values: the fit's scalar knobs, then each ``hard_values`` in order (``inputs``: each component's
  ``hard_inputs``, over the padded question axis); the legs at the per-question operator knobs, fused by
  :func:`engram_jax.ops.rrf.rrf_fuse` question by question."""
  fitted = with_values(pipe, res.values)
  vals: dict[str, Any] = {p: jnp.asarray(v, jnp.float32) for p, v in fixed.items()}
  vals.update(Knobs(raw=dict(res.raw), transforms=problem.fitted).values())
  for c in components:
    vals = c.hard_values(problem, res.learned[c.name], res.raw, vals, inputs.get(c.name))
  written = [p for c in components for p in getattr(c, 'conditions', ())]
  operator_knobs = {p: vals[p] for p in written if split_path(pipe, p)[1] not in (None, 'weight')}
  legs = jnp.stack(legs_scores(fitted, ep, key, operator_knobs))
  if fitted.fusion == 'none':
    return jnp.where(ep.where, legs[0], -jnp.inf)
  weights, k0 = per_question_fusion(problem, vals, legs.shape[1])
  depths = [s.depth for s in fitted.legs]
  return jax.vmap(lambda s, w, k_: rrf.rrf_fuse(s, weights=w, depths=depths, where=ep.where, k0=k_), in_axes=(1, 0, 0))(
    legs, weights, k0
  )


def hard_inputs(components: Sequence[Any], base: EpisodeArrays, n_questions: int) -> dict[str, Any]:
  """Each component's ``hard_inputs`` of one episode (its base arrays: the queries before any component)."""
  return {c.name: c.hard_inputs(base, n_questions) for c in components}


def score_episodes(
  pipe: Pipeline,
  problem: Problem,
  components: Sequence[Any],
  res: Any,
  fixed: Mapping[str, float],
  episodes: Sequence[Episode],
  arrays: Sequence[EpisodeArrays],
  *,
  k: int,
  metrics: Sequence[str],
  seed: int,
  indices: Sequence[int],
  episode_metrics: Mapping[str, Callable] | None = None,
  feature_arrays: Sequence[EpisodeArrays] | None = None,
  retrieved: list | None = None,
) -> dict[str, np.ndarray]:
  """Per-question metrics (NumPy float64) of :func:`hard_scores` on ``episodes`` (episode ``i`` of the run gets key
  ``fold_in(key(seed), indices[i])``, as :func:`engram_jax.eval.evaluation.evaluate`): label metrics and the
  dataset's ``episode_metrics``. ``feature_arrays``: the base arrays the components' hard inputs read when they are
  not ``arrays`` (a component changed the queries the legs see). ``retrieved`` (a list) receives each question's
  top-k item ids."""
  episode_metrics = dict(episode_metrics or {})
  parsed = {m: metrics_lib.parse_metric(m, tuple(episode_metrics)) for m in metrics}  # unknown names: before work

  def topk(ep, inputs, key):
    fused = hard_scores(pipe, problem, components, res, fixed, ep, inputs, key)
    idx, v = ranking.top_k(fused, k=k, where=ep.where)
    return jnp.where(jnp.isneginf(v), -1, idx)

  run = jax.jit(topk)
  out: dict[str, list] = {m: [] for m in metrics}
  base = jax.random.key(seed)
  for i, e, a, fa in zip(indices, episodes, arrays, feature_arrays or arrays):
    nq = len(e.questions)
    if fa.queries.shape[0] != a.queries.shape[0]:
      raise ValueError(
        f'episode {e.id}: feature arrays pad {fa.queries.shape[0]} questions, arrays {a.queries.shape[0]}'
      )
    top = np.asarray(run(a, hard_inputs(components, fa, nq), jax.random.fold_in(base, i)))[:nq]
    check_equal_k(top, nq, k=k, name=pipe.name, episode=e.id, n_items=e.n_items)  # as evaluation.evaluate
    if retrieved is not None:
      retrieved.extend(np.array([it.id for it in e.items], dtype=object)[top].tolist())
    labels = np.asarray(a.labels)[:nq]
    for m in metrics:
      base_m, cut = parsed[m]
      if base_m in episode_metrics:
        vals = [episode_metrics[base_m](e, q_, row, cut) for q_, row in zip(e.questions, top.tolist())]
        out[m].append(np.asarray(vals, np.float64))
      else:
        out[m].append(np.asarray(metrics_lib.METRICS[base_m](top, labels, k=cut), np.float64))
  return {m: np.concatenate(v) for m, v in out.items()}
