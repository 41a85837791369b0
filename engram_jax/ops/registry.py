"""The operator registry: operator name -> its one declaration (hard leg, knobs, soft twin).

An operator module (``engram_jax/ops/<family>.py``) declares each operator once with :func:`register`:

* ``leg(ep, key, **knobs) -> [Q, N]`` scores of every question of a padded episode (``-inf`` = not ranked);
* its knobs (:class:`Knob`): name, default, the unconstrained transform used for fitting, whether it is static
  (sets shapes: k, pool, iterations) and its allowed range;
* its soft twin (:class:`SoftTwin`) for fitting, or ``soft=None`` (then nothing of it is fittable).

One source of truth for defaults: a knob's default is written only in its ``Knob(...)``. An operator module declares
its knobs first and derives every keyword default of its leg and helpers from them (:func:`knob_defaults`:
``lam: ArrayLike = _D['lam']``), so a signature cannot drift from the declaration;
:func:`engram_jax.testing.check_operator` asserts that the leg's keywords are the knobs, in order, with those
defaults, and that the soft twin equals the hard leg when cold.

The pipeline builder (:mod:`engram_jax.eval.pipeline`), the fitter (:mod:`engram_jax.fit`) and the bench iterate this
registry; none of them branches on operator kind. Adding an operator is one module that calls :func:`register`
(imported by ``engram_jax.ops`` for the built-in ones, or named in a run's ``ops_modules`` config option).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from engram_jax.core import validation
from engram_jax.core.errors import EngramError

# Leg-level keys of a pipeline YAML leg node; an operator's knobs may not use them.
LEG_KEYS = ('op', 'depth', 'weight')
TRANSFORMS = ('log', 'logit', 'softplus', 'identity')
# The open range of each bounded transform's values: a fittable knob's default must lie inside (Knob refuses a default
# on the boundary, e.g. 0 under log, where the unconstrained value is -inf).
OPEN_DOMAIN = {'log': (0.0, math.inf), 'softplus': (0.0, math.inf), 'logit': (0.0, 1.0)}


@dataclasses.dataclass(frozen=True)
class Knob:
  """One knob of an operator.

  Attributes:
    name: keyword of the leg function.
    default: the value used when a pipeline does not set it (the one place it is written).
    transform: how a fitted value is parametrised (``log`` for positive scales, ``logit`` for [0, 1],
      ``softplus``, ``identity``), or None when the knob cannot be fitted.
    static: True when it sets shapes or control flow (never traced, never fitted).
    check: allowed range: ``'>0'``, ``'>=0'``, ``'[0,1]'``, ``'int>=1'``, ``'int>=0'``, a tuple of allowed values,
      or None (unchecked).
    doc: one line for error messages and docs.
    per_question: True when the leg and its soft twin also take one value per question: ``[Q]`` (the episode's
      padded question axis) in the hard leg, ``[B]`` (one per row) in the twin, each question scored exactly as
      with that value as a scalar. Such a knob can be conditioned on the question
      (:mod:`engram_jax.fit.conditioned`); ``engram_jax.testing.check_operator`` checks both claims.

  Example:
    >>> from engram_jax import Knob
    >>> Knob('lam', 0.005, transform='log', check='>0', doc='ridge weight')
    Knob(name='lam', default=0.005, transform='log', static=False, check='>0', doc='ridge weight', per_question=False)
  """

  name: str
  default: Any
  transform: str | None = None
  static: bool = False
  check: str | tuple[Any, ...] | None = None
  doc: str = ''
  per_question: bool = False

  def __post_init__(self) -> None:
    if self.name in LEG_KEYS:
      raise ValueError(f'knob name {self.name!r} is reserved for the leg ({LEG_KEYS})')
    if self.transform is not None and self.transform not in TRANSFORMS:
      raise ValueError(f'knob {self.name}: unknown transform {self.transform!r}; allowed {TRANSFORMS}')
    if self.transform is not None and self.static:
      raise ValueError(f'knob {self.name}: a static knob cannot be fitted')
    if self.per_question and self.transform is None:
      raise ValueError(f'knob {self.name}: a per-question knob must be fittable (declare its transform)')
    bounds = OPEN_DOMAIN.get(self.transform)
    default = self.default
    if (
      bounds
      and isinstance(default, (int, float))
      and not isinstance(default, bool)
      and not bounds[0] < default < bounds[1]
    ):
      raise ValueError(
        f'knob {self.name}: default {default!r} is not inside the open range {bounds} of its {self.transform!r} '
        'transform (its unconstrained value is infinite: a fit cannot move it from there); declare a default '
        "inside, or transform='identity' with a check"
      )

  def canonical(self, value: Any) -> Any:
    """``value`` in the knob's declared type, so that a number's spelling never changes a compiled program: an
    int where the default is a float becomes a float (``lam=1`` -> ``1.0``: traced as float32, not int32), an
    integral float where the knob is an integer (``int>=...``, e.g. ``pool=150.0``) an int; NumPy scalars become
    Python numbers. Anything else is returned unchanged (and left to :meth:`validate`)."""
    if isinstance(value, (bool, np.bool_)) or value is None:
      return value
    if isinstance(value, np.generic) and isinstance(value.item(), (int, float)):
      value = value.item()
    if isinstance(self.default, float) and not isinstance(self.default, bool) and isinstance(value, int):
      return float(value)
    if self.check in ('int>=1', 'int>=0') and isinstance(value, float) and value.is_integer():
      return int(value)
    return value

  def validate(self, value: Any, where: str, *, name: str | None = None) -> None:
    """Raise a one-line ValueError naming ``where``, the knob (or ``name``: the argument it is given as), its
    allowed range and ``value``. Every number must be finite, checked or not; a traced value is not checked
    (:func:`engram_jax.core.validation.check_value`)."""
    c = self.check
    name = name or self.name
    what = f' ({self.doc})' if self.doc else ''
    if isinstance(c, tuple):
      if value not in c:
        raise EngramError(f'{where}: {name} must be one of {list(c)}{what}, got {value!r}')
      return
    if value is None:
      if c is not None and not self.static:
        raise EngramError(f'{where}: {name} must be a number{what}, got None')
      return
    if c is None and not (validation.is_number(value) or hasattr(value, 'dtype')):
      return  # unchecked and not a number (e.g. a batch size's None, a tokenizer's name)
    validation.check_value(value, name, where=where, check=c, doc=self.doc)


@dataclasses.dataclass(frozen=True)
class SoftTwin:
  """What the fitter needs to relax an operator.

  Attributes:
    rows: ``(ep, n_questions, n_pad, options, settings) -> {name: [Q, ...] array}``: everything per question that
      no fitted knob moves (the cosine pool and its Gram, BM25 term statistics, ...), computed once before
      training, with every item axis padded to ``n_pad``. ``options`` are all the leg's knob values (hand-set),
      ``settings`` the fit's :class:`engram_jax.fit.problem.Settings` (greedy pool, solve batch).
    scores: ``(rows, values, ctx) -> scores [B, N]`` or a ``SoftSelection``: the relaxed leg on a batch of rows,
      differentiable in the fitted knobs; ``values`` maps every knob name to its value (fitted ones traced),
      ``ctx`` is a :class:`engram_jax.fit.problem.SoftContext` (where, cosine, positions, temperatures).
    selection: True when ``scores`` returns a soft selection (greedy pickers: CFS, MMR), which RRF fuses by its
      pick probabilities and which needs an RRF fusion around it.
    fill: the padding value of each rows entry when episodes of different shapes are stacked (default 0).

  Example:
    >>> import engram_jax.ops as ops
    >>> ops.get('mmr').soft.selection, ops.get('cfsr').soft.selection  # MMR's twin returns soft picks
    (True, False)
  """

  rows: Callable[..., dict[str, Any]]
  scores: Callable[..., Any]
  selection: bool = False
  fill: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Stages:
  """A hard leg in two parts, so that a sweep shares the first across knob values that do not change it.

  ``finish(ep, prepare(ep, key, **{k: knobs[k] for k in by}), key, **knobs)`` must equal ``leg(ep, key, **knobs)``
  bit for bit (``engram_jax.testing.check_operator`` checks it). :func:`engram_jax.eval.evaluation.evaluate` with a leg
  cache stores ``prepare``'s output per episode group and ``by`` values, and runs only ``finish`` for each job.

  Attributes:
    prepare: ``(ep, key, **by knobs) -> pytree`` of per-question arrays (e.g. CFS-R's cosine pools and their Grams).
    finish: ``(ep, prepared, key, **every knob) -> [Q, N]`` scores.
    by: the knobs ``prepare`` reads (static knobs only: traced ones would be swept).
  """

  prepare: Callable[..., Any]
  finish: Callable[..., Any]
  by: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Operator:
  """One registered operator.

  Attributes:
    name: registry key (a pipeline YAML leg says ``op: <name>``).
    leg: the hard leg ``(ep: EpisodeArrays, key, **knobs) -> [Q, N]``.
    knobs: its knobs, in signature order.
    soft: its soft twin, or None when it cannot be fitted.
    doc: one line (for listings and docs).
    needs: optional ``options -> {build option: value}`` for :func:`engram_jax.core.batch.episode_arrays` (e.g. the
      term counts of a BM25 tokenizer).
    stages: optional :class:`Stages`: the leg split where a sweep can share its first part.
    check_options: optional ``(episodes, folder) -> {knob: value}``: the knob values under which
      :func:`engram_jax.testing.check_operator` runs the leg on its random episodes, for an operator whose defaults
      cannot run alone (``trec_run`` reads a file: it writes one for those episodes under ``folder``).
    vectors: False when the leg reads no embedding (BM25, an external run): a run whose legs all read none embeds
      nothing (:func:`engram_jax.eval.pipeline.reads_vectors`).

  Example:
    >>> import engram_jax.ops as ops
    >>> op = ops.get('cfsr')
    >>> op.name, [k.name for k in op.knobs if k.transform]  # the fittable knobs
    ('cfsr', ['lam', 'w'])
  """

  name: str
  leg: Callable[..., Any]
  knobs: tuple[Knob, ...]
  soft: SoftTwin | None = None
  doc: str = ''
  needs: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
  stages: Stages | None = None
  check_options: Callable[[Sequence[Any], str], Mapping[str, Any]] | None = None
  vectors: bool = True

  def knob(self, name: str) -> Knob:
    for k in self.knobs:
      if k.name == name:
        return k
    raise KeyError(name)

  @property
  def defaults(self) -> dict[str, Any]:
    return knob_defaults(self.knobs)

  @property
  def fittable(self) -> tuple[str, ...]:
    """Knobs that a gradient fit can move (a transform and a soft twin)."""
    if self.soft is None:
      return ()
    return tuple(k.name for k in self.knobs if k.transform is not None)

  def options(self, given: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Every knob's value: ``given`` over the defaults, each validated; unknown names are a one-line error."""
    unknown = sorted(set(given) - {k.name for k in self.knobs})
    if unknown:
      raise EngramError(
        f'{where}: operator {self.name} has no knob {unknown}; its knobs: '
        f'{[k.name for k in self.knobs]} (leg keys: {list(LEG_KEYS)})'
      )
    out = self.defaults
    out.update(given)
    for k in self.knobs:
      out[k.name] = k.canonical(out[k.name])
      k.validate(out[k.name], where)
    return out


def knob_defaults(knobs: Sequence[Knob]) -> dict[str, Any]:
  """``{name: default}`` of ``knobs``: what a module's signatures take their keyword defaults from."""
  return {k.name: k.default for k in knobs}


OPERATORS: dict[str, Operator] = {}


def check_knobs(op: str, where: str, *, names: Mapping[str, str] | None = None, **values: Any) -> None:
  """The boundary check of a public operator function (``where``): each knob value it was called with, against
  the declaration of the registered operator ``op`` (``names``: argument -> knob, where the function calls a knob
  otherwise). Traced values (under ``jit``, ``grad``, ``vmap``) are not checked; Python numbers and concrete arrays
  are (:meth:`Knob.validate`), so ``cfsr_scores(q, docs, lam=-1.0)`` is a one-line error, not a ranking.

  Example:
    >>> from engram_jax.ops.registry import check_knobs
    >>> check_knobs('cfsr', 'cfsr_scores', pool=20, lam=0.005, w=0.9)
    >>> try:
    ...   check_knobs('cfsr', 'cfsr_scores', pool=20, lam=-1.0)
    ... except ValueError as e:
    ...   print(e)
    cfsr_scores: lam must be > 0 (ridge strength), got -1.0
  """
  operator = get(op)
  for arg, value in values.items():
    operator.knob((names or {}).get(arg, arg)).validate(value, where, name=arg)


def register(op: Operator, *, replace: bool = False) -> Operator:
  """Add ``op`` to the registry (a second operator of the same name is an error unless ``replace``).

  Example:
    >>> import engram_jax.ops as ops
    >>> from engram_jax import Knob, Operator, register
    >>> from engram_jax.ops import registry
    >>> def half_cosine(ep, key, *, scale=0.5):
    ...   return scale * ops.cosine_scores(ep.queries, ep.docs, where=ep.where)
    >>> op = register(Operator('half_cosine', half_cosine, (Knob('scale', 0.5, check='>0'),), doc='cosine x scale'))
    >>> ops.get('half_cosine') is op
    True
    >>> del registry.OPERATORS['half_cosine']  # (tests add operators for a with-block: tests/ops/test_registry_twins.py)
  """
  if op.name in OPERATORS and not replace and OPERATORS[op.name] is not op:
    raise ValueError(f'operator {op.name!r} is already registered')
  OPERATORS[op.name] = op
  return op


def get(name: str) -> Operator:
  """The operator registered as ``name``; a one-line error listing the known names otherwise.

  Example:
    >>> import engram_jax.ops as ops
    >>> ops.get('cosine').doc
    'dense cosine similarity'
  """
  if name not in OPERATORS:
    raise EngramError(f'unknown operator {name!r}; registered: {sorted(OPERATORS)}')
  return OPERATORS[name]
