r"""A fitted (or hand-set) pipeline as a thing one calls: one's own items and label-free questions in, top-k out.

:func:`retrieve` takes a loaded artifact (:func:`engram_jax.fit.load_artifact`, or its path) or a hand-set
:class:`~engram_jax.eval.pipeline.Pipeline`, the items of one memory in write order (texts, or
:class:`~engram_jax.core.types.Item` s) and questions (texts, or :class:`~engram_jax.core.types.Question` s whose
``gold`` is never read), and returns each question's top-``k`` item ids and the pipeline's final scores at them. It
scores through the one road from a fit to a score (:func:`engram_jax.fit.apply.rank`, its guards first): the fit's knob values, the query
adapter (queries adapted), the conditioned knobs (per-question fusion, the module reading the base queries). Vectors
are given (``item_vectors`` / ``question_vectors``, unit-norm) or embedded: with ``embedder`` (``texts -> [T, D]``),
else with the encoder the artifact's manifest records (``embedder.encoder``: its ``_target_`` and arguments).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from engram_jax.core import modules, ranking
from engram_jax.core.batch import episode_arrays
from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval.pipeline import Pipeline, build_options, pipeline_scores
from engram_jax.fit import apply
from engram_jax.fit.artifact import Artifact, load

log = logging.getLogger(__name__)


class Retrieved(NamedTuple):
  """One question's ranking: ``ids`` ``[k]`` item ids, best first (fewer when the memory holds fewer items), and
  ``scores`` ``[k]`` float32, the pipeline's final (fused) scores at them.

  Example:
    >>> import numpy as np
    >>> from engram_jax import Retrieved
    >>> r = Retrieved(ids=['D1:3', 'D1:1'], scores=np.array([0.031, 0.016], np.float32))
    >>> r.ids[0]
    'D1:3'
  """

  ids: list[str]
  scores: np.ndarray


def encoder_of(spec: Mapping[str, Any]) -> Callable[[list[str]], np.ndarray]:
  """The encoder an embedder config node describes (``{'model_id': ..., 'encoder': {'_target_': 'pkg.fn', ...}}``,
  as an artifact's manifest records it): ``fn(**arguments)``, imported without Hydra.

  >>> enc = encoder_of({'model_id': 'hashing-64', 'encoder': {'_target_': 'engram_jax.data.embed.hashing_encoder', 'dim': 64}})
  >>> enc(['a dog']).shape
  (1, 64)
  """
  node = dict((spec or {}).get('encoder') or {})
  target = node.pop('_target_', None)
  if not isinstance(target, str) or '.' not in target:
    raise EngramError(f'the embedder spec names no encoder (_target_): {dict(spec or {})}; pass embedder=')
  module, _, name = target.rpartition('.')
  fn = getattr(modules.import_module(module, f'the encoder {target}'), name, None)
  if fn is None:
    raise EngramError(f'the encoder {target}: module {module!r} has no {name!r}; pass embedder=')
  return fn(**{k: v for k, v in node.items() if not k.startswith('_')})


def _items(items: Sequence[str | Item]) -> tuple[Item, ...]:
  out = []
  for i, it in enumerate(items):
    if isinstance(it, str):
      out.append(Item(id=str(i), text=it, parent='', position=i))
    elif isinstance(it, Item):
      out.append(dataclasses.replace(it, position=i))
    else:
      raise EngramError(f'item {i}: expected a text or an Item, got {type(it).__name__}')
  if not out:
    raise EngramError('retrieve: no items to rank')
  return tuple(out)


def _questions(questions: Sequence[str | Question], anchor: str) -> tuple[Question, ...]:
  """The questions with a placeholder gold (``anchor``): the padded arrays carry labels, scoring never reads them."""
  out = []
  for j, q in enumerate(questions):
    if isinstance(q, str):
      q = Question(id=f'q{j}', text=q, gold=(), gold_parents=(), category=0)
    elif not isinstance(q, Question):
      raise EngramError(f'question {j}: expected a text or a Question, got {type(q).__name__}')
    out.append(dataclasses.replace(q, gold=(anchor,), gold_parents=()))
  return tuple(out)


def _vectors(given, texts: list[str], encode, what: str) -> np.ndarray:
  if given is None:
    given = encode(texts)
  v = np.asarray(given, np.float32)
  if v.ndim != 2 or v.shape[0] != len(texts):
    raise EngramError(f'{what}: expected [{len(texts)}, D] vectors, got shape {list(v.shape)}')
  return v


def retrieve(
  model: Artifact | Pipeline | str | Path,
  items: Sequence[str | Item],
  questions: Sequence[str | Question],
  *,
  k: int = 10,
  item_vectors: np.ndarray | None = None,
  question_vectors: np.ndarray | None = None,
  embedder: Callable[[list[str]], np.ndarray] | None = None,
  fit: str = 'final',
  seed: int = 0,
  force: bool = False,
) -> list[Retrieved]:
  """Rank one's own items for label-free questions with a fitted artifact or a hand-set pipeline.

  Args:
    model: an :class:`~engram_jax.fit.artifact.Artifact`, the path of one (or of a fit's run folder), or a
      :class:`~engram_jax.eval.pipeline.Pipeline`.
    items: ``[N]`` the memory, in write order: texts (ids ``'0'``, ``'1'``, ...) or ``Item`` s (their ids).
    questions: ``[Q]`` texts or ``Question`` s (``gold`` may be empty; it is not read).
    k: how many items per question; static.
    item_vectors, question_vectors: ``[N, D]`` / ``[Q, D]`` unit-norm vectors; embedded when None.
    embedder: ``texts -> [T, D]`` for what is embedded; default: the artifact's recorded encoder.
    fit: the artifact's fit to apply (``'final'``, or a fold such as ``'fold_00'``).
    force: apply an artifact to vectors it was not fitted on (another embedder, or one nothing vouches for: given
      vectors without the ``embedder`` that made them; another dimension) anyway, with a warning; never an
      adapter to another dimension.
    seed: the key of stochastic legs (question set ``i`` of a run gets ``fold_in(key(seed), 0)``, as episode 0 of
      :func:`engram_jax.eval.evaluation.evaluate`).

  Returns:
    One :class:`Retrieved` per question, in order.

  Raises:
    EngramError: no items, a string where a list is meant, ``k`` not a positive integer, a missing fit, no way to
      embed, vectors of the wrong shape, vectors the artifact was not fitted on (its embedder and dimension; pass
      the ``embedder`` that made given vectors), a changed or unservable external run leg, a component it cannot
      apply (:func:`engram_jax.fit.apply.guard`).

  Example:
    >>> from engram_jax import make_pipeline, retrieve
    >>> from engram_jax.data import hashing_encoder
    >>> pipe = make_pipeline(legs={'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, fusion='rrf', name='hybrid')
    >>> memory = ['I adopted a dog named Rex.', 'The invoice is overdue.', 'We hiked in the Alps in May.']
    >>> top = retrieve(pipe, memory, ['Which dog did I adopt?'], k=2, embedder=hashing_encoder(dim=64))
    >>> top[0].ids[0], top[0].scores.shape  # one Retrieved per question: ids best first, the fused scores
    ('0', (2,))
  """
  if isinstance(model, (str, Path)):
    model = load(model)
  k = apply.check_k(k)
  its = _items(apply.check_list(items, 'items'))
  qs = _questions(apply.check_list(questions, 'questions'), its[0].id)
  if not qs:
    return []
  encode, vouch = embedder, embedder
  if encode is None and (item_vectors is None or question_vectors is None):
    spec = model.manifest.get('embedder') if isinstance(model, Artifact) else None
    if spec is None:
      raise EngramError('retrieve: pass embedder= (texts -> [T, D]) or item_vectors= and question_vectors=')
    encode, vouch = encoder_of(spec), spec  # the fit's own encoder: its node vouches for the vectors
  docs = _vectors(item_vectors, [it.text for it in its], encode, 'item_vectors')
  queries = _vectors(question_vectors, [q.text for q in qs], encode, 'question_vectors')
  episode = Episode('retrieve', its, qs)
  if isinstance(model, Artifact):
    vectors = apply.vectors_of(vouch, docs.shape[1])
    idx, vals, forced = apply.rank(model, episode, docs, queries, k=k, seed=seed, fit=fit, vectors=vectors, force=force)
    for why in forced:
      log.warning('retrieve: force=True: applying %s although %s', model.path, why)
  else:
    arrays = episode_arrays(episode, docs, queries, **build_options([model]))
    key = jax.random.fold_in(jax.random.key(seed), 0)
    fused = jax.jit(lambda ep, key_: pipeline_scores(model, ep, key_))(arrays, key)
    idx, vals = ranking.top_k(fused, k=min(k, len(its)), where=jnp.asarray(arrays.where))
    idx, vals = np.asarray(idx)[: len(qs)], np.asarray(vals, np.float32)[: len(qs)]
  return [Retrieved([its[i].id for i in row], v) for row, v in zip(idx.tolist(), vals)]
