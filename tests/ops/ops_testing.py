"""Shared support of the operator tests (tests/ops/): gradient checks, small episodes, the checks of one operator's
registry declaration, and the jitted greedy pickers at fixed padded shapes (shared compilations)."""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import strategies
from jax.test_util import check_grads

from engram_jax import fit, ops
from engram_jax.core import batch
from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import pipeline
from engram_jax.ops import cfs, greedy, mmr, pools
from engram_jax.testing import reference as ref

COLD = 1e-7  # a temperature at which every soft op must equal its hard twin (inputs without ties)


def grads_ok(f, args, order=1, modes=('fwd', 'rev')):
  """``check_grads`` on the jitted ``f`` (eager op-by-op dispatch is what makes these tests slow)."""
  check_grads(jax.jit(f), args, order=order, modes=list(modes))


def unit_episode(n=30, d=8, q=3, seed=1):
  """``(docs [n, d], queries [q, d])`` unit-norm float64 rows."""
  rng = np.random.default_rng(seed)
  return ref.unit_vectors(rng, n, d), ref.unit_vectors(rng, q, d)


def jit_case():
  """The inputs of the jit / eager / vmap / all-masked checks of cosine, BM25 and RRF (one draw, as before)."""
  rng = np.random.default_rng(1)
  n, d, qn = 12, 6, 5
  docs = rng.normal(size=(n, d))
  docs /= np.linalg.norm(docs, axis=1, keepdims=True)
  queries = rng.normal(size=(qn, d))
  qtf = rng.integers(0, 2, size=(qn, 9)).astype(float)
  dtf = rng.integers(0, 3, size=(n, 9)).astype(float)
  legs = rng.normal(size=(2, qn, n))
  return {'n': n, 'qn': qn, 'docs': docs, 'queries': queries, 'qtf': qtf, 'dtf': dtf, 'legs': legs}


def check_jit_eager_vmap_and_all_masked(f, x, *, n, qn, vmap=True):
  """``f(x, where)``: jit == eager, (optionally) vmap over the rows of ``x`` == a loop, and an all-masked list is
  all ``-inf`` without NaN."""
  where = jnp.arange(n) < 9
  eager = f(x, where)
  np.testing.assert_allclose(jax.jit(f)(x, where), eager, rtol=1e-6)
  if vmap:
    looped = np.stack([f(x[i], where) for i in range(qn)])
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(x, where), looped, rtol=1e-6)
  none = f(x, jnp.zeros(n, bool))
  assert not np.any(np.isnan(np.asarray(none)))
  assert np.all(np.isneginf(np.asarray(none)))


# ---- one operator's registry declaration -----------------------------------------------------------------

N_ITEMS, N_QUESTIONS = 12, 2


def small_episode(seed=0, d=8):
  """A 12-item, 2-question episode with embeddings, padded to small buckets: question 0 sits between two
  near-duplicate items written apart (items 2 and 5, cosine 0.75), so the revision detector of the gated
  time-aware CFS-R is neither open nor shut, and the texts share words with the questions (BM25);
  the questions carry every text cue of engram_jax.core.features (a learned gate's inputs)."""
  rng = np.random.default_rng(seed)
  items = tuple(
    Item(
      id=f'i{k}',
      text=f'memory number {k} about cats' if k % 3 else f'note {k} on budgets',
      parent=f's{k // 4}',
      position=k,
    )
    for k in range(N_ITEMS)
  )
  qs = (
    Question(id='q0', text='cats memory now', gold=('i2',), gold_parents=('s0',), category=1),
    Question(id='q1', text='budgets: how many, and when', gold=('i9',), gold_parents=('s2',), category=2),
  )
  ep = Episode(id='e', items=items, questions=qs)
  docs = ref.unit_vectors(rng, N_ITEMS, d)
  other = docs[5] - (docs[5] @ docs[2]) * docs[2]
  docs[5] = 0.75 * docs[2] + np.sqrt(1 - 0.75**2) * other / np.linalg.norm(other)
  queries = ref.unit_vectors(rng, N_QUESTIONS, d)
  queries[0] = (docs[2] + docs[5]) / np.linalg.norm(docs[2] + docs[5])
  return ep, docs.astype(np.float32), queries.astype(np.float32)


def small_arrays(tokenizers=('words',)):
  ep, docs, queries = small_episode()
  return batch.episode_arrays(ep, docs, queries, n_multiple=16, q_multiple=4, v_multiple=32, tokenizers=tokenizers)


def _moved(kind, value):
  """Another value of a fitted knob, inside its range."""
  if kind == 'log':
    return value * 2.0
  if kind == 'logit':
    return value + 0.2 if value <= 0.5 else value - 0.2
  if kind == 'softplus':
    return value * 2.0 + 0.1
  return value + 0.3


def _flat(out):
  return np.asarray(out.probs if isinstance(out, greedy.SoftSelection) else out)


def check_declaration(name):
  """Operator ``name``'s declaration is consistent with its code.

  * its knobs are the leg's keyword arguments, and each knob's default is the leg's keyword default;
  * its leg runs (jitted) on a small EpisodeArrays: ``[Q, N]``, no NaN, ``-inf`` on padded items, a score for some
    item of every real question; a one-leg pipeline built from the registry name ranks by it with equal k;
  * a fitted knob is traced and has a soft twin; each fittable knob moves the soft twin's output (finite gradient).
  """
  op = ops.get(name)
  assert op.name == name
  params = inspect.signature(op.leg).parameters
  kw = {p.name: p.default for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
  assert [k.name for k in op.knobs] == list(kw), (name, [k.name for k in op.knobs], list(kw))
  assert op.defaults == kw, (name, op.defaults, kw)
  for knob in op.knobs:
    knob.validate(knob.default, where=f'operator {name}')  # the default is in its own range
    if knob.transform is not None:
      assert not knob.static

  arr = small_arrays(
    tokenizers=pipeline.build_options([pipeline.make_pipeline(legs={name: {'op': name}})])['tokenizers']
  )
  key = jax.random.key(0)
  scores = np.asarray(jax.jit(functools.partial(op.leg, **op.defaults))(arr, key))
  where = np.asarray(arr.where)
  assert scores.shape == arr.labels.shape, (name, scores.shape)
  assert not np.isnan(scores).any() and np.isneginf(scores[:, ~where]).all()
  assert np.isfinite(scores[:N_QUESTIONS]).any(axis=-1).all()
  pipe = pipeline.make_pipeline(legs={name: {'op': name}}, name=name)
  assert pipe.legs[0].op == name and dict(pipe.legs[0].options) == op.defaults
  by_pipe = np.asarray(jax.jit(functools.partial(pipeline.pipeline_scores, pipe))(arr, key))
  leg_key = jax.random.split(key, 1)[0]  # the leg's key inside the pipeline
  np.testing.assert_array_equal(by_pipe, np.asarray(jax.jit(functools.partial(op.leg, **op.defaults))(arr, leg_key)))
  top = jax.jit(functools.partial(pipeline.pipeline_topk, pipe, k=4))(arr, key)
  pipeline.check_equal_k(np.asarray(top), N_QUESTIONS, k=4, name=name, episode='e')

  if op.soft is None:
    assert op.fittable == ()
    return
  assert op.fittable, f'{name}: a soft twin with nothing to fit'
  settings = fit.Settings(greedy_pool=8, solve_batch=None)  # a greedy pool of real items only
  n_pad = arr.docs.shape[0]
  rows = op.soft.rows(arr, N_QUESTIONS, n_pad, op.defaults, settings)
  assert set(op.soft.fill) <= set(rows)
  rows = jax.tree_util.tree_map(jnp.asarray, rows)
  ctx = fit.SoftContext(
    where=jnp.asarray(pools.pad_items(np.broadcast_to(where, (N_QUESTIONS, n_pad)), n_pad, False)),
    cos=jnp.asarray(pools.question_cosines(arr, N_QUESTIONS, n_pad)),
    positions=jnp.asarray(np.broadcast_to(np.asarray(arr.positions), (N_QUESTIONS, n_pad))),
    temperatures=fit.Temperatures(),
    settings=settings,
  )

  def soft(values):
    return op.soft.scores(rows, {**op.defaults, **values}, ctx)

  base = {k: jnp.asarray(float(op.defaults[k])) for k in op.fittable}
  before = _flat(soft(base))
  assert not np.isnan(before).any()
  for knob in op.fittable:
    kind = op.knob(knob).transform
    after = _flat(soft({**base, knob: jnp.asarray(_moved(kind, float(op.defaults[knob])))}))
    assert not np.isnan(after).any()
    assert not np.allclose(after, before, rtol=0.0, atol=1e-7), f'{name}: knob {knob} does not move the soft twin'

    def total(v, knob=knob):
      out = soft({**base, knob: v})
      x = out.probs if isinstance(out, greedy.SoftSelection) else out
      return jnp.sum(jnp.where(jnp.isfinite(x), x * jnp.arange(x.shape[-1]), 0.0))

    g = jax.grad(total)(base[knob])
    assert np.isfinite(g), (name, knob, g)


# ---- the greedy pickers at fixed padded shapes ---------------------------------------------------------------

N_PAD, D_PAD, Q = 40, 16, 3  # fixed padded shapes: one compilation per static (k, pool)

mmr_jit = jax.jit(mmr.mmr_select, static_argnames=('k', 'pool'))
cfs_jit = jax.jit(cfs.cfs_select, static_argnames=('k', 'pool', 'floor'))

greedy_episodes = functools.partial(strategies.padded_episodes, n_pad=N_PAD, d_pad=D_PAD, q=Q)


def hyper(fn, **kw):
  """Passes the traced hyperparameters explicitly, as the hypothesis tests do, so that jit's cache
  (keyed on which keywords are given) is shared."""
  defaults = dict(lam=0.5) if fn is mmr_jit else dict(beta=0.2, sigma=0.4)
  return {**defaults, **kw}


def check_selection(sel, refs):
  idx = np.asarray(sel.indices)
  scores = np.asarray(sel.scores)
  assert idx.dtype == np.int32
  for qi, (r_idx, r_scores) in enumerate(refs):
    np.testing.assert_array_equal(idx[qi], r_idx)
    np.testing.assert_allclose(scores[qi], r_scores, rtol=1e-9, atol=1e-12)
  assert not np.isnan(scores).any()


def run(fn, queries, docs, where=None, **kw):
  """Calls a jitted op at the hypothesis shapes (so compilations are shared): pads the list to
  N_PAD rows (masked), dims to D_PAD and the queries to Q rows; returns numpy (indices, scores)."""
  queries = np.atleast_2d(queries)
  n, d = docs.shape
  wh = np.zeros(N_PAD, bool)
  wh[:n] = True if where is None else where
  qs = ref.pad(np.concatenate([queries, np.repeat(queries[:1], Q - len(queries), 0)]), Q, D_PAD)
  sel = fn(qs, ref.pad(docs, N_PAD, D_PAD), **hyper(fn, where=wh, **kw))
  return np.asarray(sel.indices)[: len(queries)], np.asarray(sel.scores)[: len(queries)]


def tie_docs():
  # 0: x = e2 (rel .6), 1: s = e1 (rel .8), 2: y = e3 (rel 0), 3: w = -e1 (rel -.8)
  docs = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1], [-1, 0, 0]], np.float64)
  query = np.array([0.8, 0.6, 0.0])
  return docs, query


def check_all_masked_and_short_lists(fn, pool):
  rng = np.random.default_rng(0)
  docs = ref.unit_vectors(rng, 8, 4)
  q = ref.unit_vectors(rng, 2, 4)
  idx, scores = run(fn, q, docs, where=np.zeros(8, bool), k=45, pool=pool)
  assert (idx == -1).all() and np.isneginf(scores).all()
  assert np.isneginf(np.asarray(greedy.selection_scores(greedy.Selection(idx, scores), n=8))).all()
  where = np.zeros(8, bool)
  where[[2, 5]] = True
  idx, scores = run(fn, q, docs, where=where, k=45, pool=pool)
  assert sorted(idx[:, :2].ravel().tolist()) == [2, 2, 5, 5] and (idx[:, 2:] == -1).all()
  assert not np.isnan(scores).any() and np.isfinite(scores[:, :2]).all()


def check_jit_eager_vmap_loop_batch(fn, jf):
  rng = np.random.default_rng(1)
  docs = ref.pad(ref.unit_vectors(rng, N_PAD, 8), N_PAD, D_PAD)
  qs = ref.pad(ref.unit_vectors(rng, Q, 8), Q, D_PAD)
  where = rng.random(N_PAD) < 0.8
  kw = hyper(jf, k=4, pool=6)  # the hypothesis tests' arguments and shapes: cached compilations
  eager = fn(qs, docs, where=where, **kw)
  jitted = jf(qs, docs, where=where, **kw)
  np.testing.assert_array_equal(eager.indices, jitted.indices)
  np.testing.assert_allclose(eager.scores, jitted.scores, rtol=1e-12)
  # vmap over single queries == a Python loop over them == the batched call.
  vmapped = jax.vmap(lambda q: jf(q, docs, where=where, **kw))(qs)
  loop = [jf(q, docs, where=where, **kw) for q in qs]
  np.testing.assert_array_equal(vmapped.indices, np.stack([s.indices for s in loop]))
  np.testing.assert_allclose(vmapped.scores, np.stack([s.scores for s in loop]), rtol=1e-12)
  np.testing.assert_array_equal(vmapped.indices, eager.indices)
  # Per-list docs [B, 1, N, D] with where [B, 1, N] broadcast against queries [B, Q, D]: equals one
  # call per list.
  docs_b = np.stack([docs, docs[::-1]])
  where_b = np.stack([where, where[::-1]])
  batched = jf(np.stack([qs, qs[::-1]]), docs_b[:, None], where=where_b[:, None], **kw)
  np.testing.assert_array_equal(batched.indices[0], jitted.indices)
  np.testing.assert_array_equal(batched.indices[1], jf(qs[::-1], docs_b[1], where=where_b[1], **kw).indices)


def check_soft_greedy_tends_to_hard(hard_fn, soft_fn, kw):
  docs, qs = unit_episode(n=30, q=3)
  where = np.ones(30, bool)
  where[[3, 17]] = False

  @jax.jit
  def run_all(qs, docs):
    return [
      (
        hard_fn(qs, docs, k=8, where=where, pool=pool, **kw),
        soft_fn(qs, docs, k=8, where=where, pool=pool, temperature=COLD, **kw),
        soft_fn(qs, docs, k=8, where=where, pool=pool, temperature=0.05, **kw),
      )
      for pool in (None, 12)
    ]

  for hard, soft, warm in run_all(qs, docs):
    np.testing.assert_array_equal(np.argmax(soft.probs, -1), hard.indices)
    np.testing.assert_allclose(np.max(soft.probs, -1), 1.0, atol=1e-9)
    np.testing.assert_allclose(soft.scores, hard.scores, atol=1e-9)
    # warm: a distribution per pick, masked items never picked
    np.testing.assert_allclose(np.sum(warm.probs, -1), 1.0, atol=1e-9)
    assert np.all(warm.probs[..., ~where] == 0)
