r"""A low-rank query adapter fit through the soft pipeline: :math:`q' = (q + U V^\top q) / \|q + U V^\top q\|`.

``U, V`` are ``[D, r]`` (rank ``r`` from config); ``U`` starts at 0, so the adapter starts as the identity, and both
are fit jointly with the pipeline's scalar knobs on the soft twins (approx-NDCG@k). Hard scoring embeds nothing
again: it runs the hard pipeline on the adapted query embeddings (:func:`adapt_queries`), every leg that reads the
query (cosine, the CFS-R pool and solve, ...) seeing :math:`q'`.

What the soft pipeline recomputes from :math:`q'` at every step, per question of the minibatch:

* the cosine list (``rows.cos``, the twins' context) and a constant ``cosine`` leg's scores: ``docs @ q'``, from
  the episode's item embeddings (gathered per question: ``[B, N, D]``). A constant leg is ranked hard in the soft
  fusion, so by default these scores pass no gradient to the adapter (and the context's temperature scales stop
  theirs): the adapter then learns only through fitted legs that read the query (a CFS-R leg's pool cosines).
  With ``soft_query_legs`` (``fit.adapter.soft_query_legs: true``) every constant cosine leg is soft-ranked in the
  fusion at the fitted legs' rank temperature (:func:`engram_jax.fit.problem.soft_scores`, ``soft_constant``), so
  the adapter learns through it too; cold, that soft rank is the hard one. The default (false) is what the
  confirmed ``locomo_adapter`` / ``lme_adapter`` runs used, kept so that they reproduce;
* a fitted CFS-R-family leg's pool cosines ``pool_cos`` (the NNLS right-hand side :math:`b = C q'`), recomputed
  from the pool's rows. **The pool itself (its items and its Gram block) is held from the base embedding.** The
  pool is a hard top-P cut (no gradient through membership), its Gram :math:`C C^\top` does not depend on the query
  at all, and re-pooling per step would re-gather ``[B, P, P]`` blocks from the episode Gram for every step. The
  hard scorer does re-pool under :math:`q'`. This is an approximation that grows with how far the adapter moves the
  query (on LoCoMo a rank-8 adapter moved it to a cosine of 0.39-0.75 with the base query); its cost is not yet
  measured (no soft-vs-hard gap monitor for adapter fits).
  The gradient reaches ``b`` only when the CFS-R twin differentiates its solve in ``b``: ``fit.cfsr_grad`` must be
  ``implicit`` (KKT, nothing stored) or ``reverse`` (unrolled); ``forward`` stops it (checked).
* BM25 and other lexical legs do not read the query embedding and stay as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array
from jax.typing import ArrayLike

from engram_jax.core.batch import EpisodeArrays
from engram_jax.core.types import Episode
from engram_jax.fit.components import register_component
from engram_jax.fit.problem import CFSR_GRADS, Problem, Rows


@register_component
@dataclasses.dataclass(frozen=True)
class Adapter:
  """The query adapter as a component of a fit (:class:`engram_jax.fit.train.Component`): its rank and its learning
  rate as a fraction of the scalar knobs' (from config); parameters ``{'u', 'v'}`` ``[D, rank]``; it recomputes from
  the adapted query what reads the query in the soft problem (:func:`adapted_rows`).

  Example:
    >>> from engram_jax.fit import Adapter
    >>> a = Adapter(rank=4, lr_scale=1.0)  # q' = (q + U V^T q) / |q + U V^T q|, U, V [D, 4]
    >>> a.name, a.rank
    ('adapter', 4)
  """

  rank: int
  lr_scale: float
  soft_query_legs: bool = False  # soft-rank constant cosine legs in the fusion (their gradient reaches q')
  name: ClassVar[str] = 'adapter'
  per_question: ClassVar[bool] = False
  # its config node's keys beyond the fields: the adapter fit's CFS-R gradient (required) and the report's
  # train_gap diagnostic (experiments/lib/fit_adapter.py)
  config_keys: ClassVar[dict[str, Any]] = {'cfsr_grad': dataclasses.MISSING, 'train_gap': False}
  config_example: ClassVar[str] = (
    "'fit.adapter={rank: 8, lr_scale: 0.1, cfsr_grad: implicit}' (cfsr_grad: implicit or reverse, how the CFS-R twin "
    'passes the gradient to the query; conf/fit/default.yaml)'
  )
  fixed_dimension: ClassVar[bool] = True  # U, V are [D, rank]: it applies to vectors of the fit's dimension only

  def __post_init__(self) -> None:
    if int(self.rank) < 1 or not self.lr_scale > 0:
      raise ValueError(f'adapter.rank must be >= 1 and adapter.lr_scale > 0, got {self.rank}, {self.lr_scale}')

  def settings(self, node: Mapping[str, Any]) -> dict[str, Any]:
    """A fit with the adapter runs on its own CFS-R gradient setting (``cfsr_grad`` of its config node)."""
    grad = str(node['cfsr_grad'])
    if grad not in CFSR_GRADS:
      raise ValueError(f'cfsr_grad must be one of {list(CFSR_GRADS)}, got {grad!r}')
    return {'cfsr_grad': grad}

  def check_problem(self, pipe: Any, problem: Problem) -> None:
    del pipe
    self.check(problem)

  def check(self, problem: Problem) -> None:
    """The CFS-R twin must pass gradients to its pool cosines when a fitted leg has them."""
    pooled = [leg.name for leg in problem.legs if leg.fitted and leg.op.startswith(('cfsr', 'tcfsr'))]
    if pooled and problem.settings.cfsr_grad == 'forward':
      raise ValueError(
        f'a query adapter needs fit.cfsr_grad=implicit or reverse (legs {pooled} read the query '
        'through their NNLS right-hand side; forward mode passes no gradient there)'
      )
    if not pooled and not (self.soft_query_legs and query_legs(problem)):
      why = (
        'it has no cosine leg'
        if not query_legs(problem)
        else 'its cosine legs are ranked hard in the soft fusion: set fit.adapter.soft_query_legs=true'
      )
      raise ValueError(
        f'the query adapter of {problem.name} would get no gradient: no fitted leg reads the query '
        f'(CFS-R pool cosines) and {why}'
      )

  def inputs(self, problem: Problem, episodes: Sequence[Episode], arrays: Sequence[EpisodeArrays]) -> Inputs:
    del problem
    return build_inputs(episodes, arrays)

  def batch(self, inputs: Inputs, idx: Array) -> Inputs:
    return Inputs(query=inputs.query[idx], docs=inputs.docs, episode=inputs.episode[idx])

  def init(self, inputs: Inputs, seed: int) -> dict[str, Array]:
    return init_params(self, inputs.query.shape[-1], seed)

  def soft_constant(self, problem: Problem) -> tuple[int, ...]:
    return query_legs(problem) if self.soft_query_legs else ()

  def apply(
    self,
    problem: Problem,
    params: Mapping[str, Array],
    raw: Mapping[str, Array],
    vals: dict,
    rows: Rows,
    inputs: Inputs,
  ) -> tuple[dict, Rows]:
    del raw
    return vals, adapted_rows(problem, rows, inputs, params)

  # ---- the hard half (engram_jax.fit.components) ----

  conditions: ClassVar[tuple[str, ...]] = ()  # it writes no knob

  def hard_queries(self, params: Mapping[str, Any], queries: np.ndarray) -> np.ndarray:
    return adapt_queries(params, queries)

  def hard_inputs(self, base: EpisodeArrays, n_questions: int) -> None:
    del base, n_questions

  def hard_values(self, problem: Problem, params: Any, raw: Mapping[str, Array], vals: dict, inputs: Any) -> dict:
    del problem, params, raw, inputs
    return vals


@struct.dataclass
class Inputs:
  """Per-question query embeddings and per-episode item embeddings (padded to one N)."""

  query: Array  # [Q, D]
  docs: Array  # [E, N, D]
  episode: Array  # [Q] int32, each question's episode (row into ``docs``)


def build_inputs(episodes: Sequence[Episode], arrays: Sequence[EpisodeArrays]) -> Inputs:
  n_pad = max(a.docs.shape[0] for a in arrays)
  docs = np.stack([np.pad(np.asarray(a.docs, np.float32), [(0, n_pad - a.docs.shape[0]), (0, 0)]) for a in arrays])
  query = np.concatenate([np.asarray(a.queries, np.float32)[: len(e.questions)] for e, a in zip(episodes, arrays)])
  ep = np.concatenate([np.full(len(e.questions), i, np.int32) for i, e in enumerate(episodes)])
  return Inputs(query=jnp.asarray(query), docs=jnp.asarray(docs), episode=jnp.asarray(ep))


def init_params(spec: Adapter, dim: int, seed: int) -> dict[str, Array]:
  """``U = 0`` (identity adapter), ``V ~ N(0, 1/D)``."""
  v = jax.random.normal(jax.random.key(seed), (dim, int(spec.rank)), jnp.float32) / np.sqrt(dim)
  return {'u': jnp.zeros((dim, int(spec.rank)), jnp.float32), 'v': v}


def adapt(params: Mapping[str, Array], q: ArrayLike) -> Array:
  """``[..., D]`` unit-norm adapted queries."""
  q = jnp.asarray(q)
  x = q + (q @ params['v']) @ params['u'].T
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def adapt_queries(params: Mapping[str, Any], queries: np.ndarray) -> np.ndarray:
  """NumPy-in, NumPy-out :func:`adapt` (float32) for hard scoring."""
  return np.asarray(adapt({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(queries, jnp.float32)))


def adapted_rows(problem: Problem, rows: Rows, inputs: Inputs, params: Mapping[str, Array]) -> Rows:
  """``rows`` (a batch) with everything that reads the query recomputed from the adapted query (see the module
  docstring: the cosine list, a constant cosine leg, fitted CFS-R legs' pool cosines; pools held)."""
  q = adapt(params, inputs.query)
  d = inputs.docs[inputs.episode]
  cos = jnp.where(rows.where, jnp.einsum('bnd,bd->bn', d, q), -jnp.inf)
  legs = []
  for l, leg in enumerate(problem.legs):
    x = rows.legs[l]
    if not leg.fitted and leg.op == 'cosine':
      x = cos
    elif leg.fitted and isinstance(x, dict) and 'pool_cos' in x:
      x = {**x, 'pool_cos': jnp.where(x['pool_valid'], jnp.take_along_axis(cos, x['pool_idx'], axis=-1), x['pool_cos'])}
    legs.append(x)
  return rows.replace(cos=cos, legs=tuple(legs))


def query_legs(problem: Problem) -> tuple[int, ...]:
  """Indices of the constant legs whose scores :func:`adapted_rows` recomputes from the adapted query (cosine)."""
  return tuple(l for l, leg in enumerate(problem.legs) if not leg.fitted and leg.op == 'cosine')
