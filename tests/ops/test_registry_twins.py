"""The operator contract over the whole registry: every registered operator passes
:func:`engram_jax.testing.check_operator` (a new built-in operator is covered without writing a test; modules named
in ``ENGRAM_CHECK_OPS_MODULES``, comma-separated, are imported first, so an out-of-tree operator can be run through
the same test). Plus the checker's own tests: a twin with the ``[B, N]`` bug of issue 17 is rejected by name, a
declaration that drifts from its leg is rejected, the shared helpers reduce over the item axis only, and no default
of a declared knob is written outside its ``Knob(...)``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import re
from pathlib import Path

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

from engram_jax import ops
from engram_jax.ops import cfsr, pools, registry
from engram_jax.testing import check_operator
from engram_jax.testing.operators import check_declaration

ROOT = Path(__file__).resolve().parents[2]
for _module in filter(None, os.environ.get('ENGRAM_CHECK_OPS_MODULES', '').split(',')):
  importlib.import_module(_module)


@pytest.mark.parametrize('name', sorted(ops.OPERATORS))
def test_operator_contract(name):
  check_operator(name)


@contextlib.contextmanager
def registered_from(module_name: str):
  """Import (or re-import) a module that registers operators; restore the registry afterwards."""
  before = dict(registry.OPERATORS)
  try:
    module = importlib.reload(importlib.import_module(module_name))
    yield module
  finally:
    registry.OPERATORS.clear()
    registry.OPERATORS.update(before)


def test_buggy_batched_twin_is_rejected_by_name():
  with registered_from('tests.ops.buggy_recency'):
    with pytest.raises(
      AssertionError,
      match=r"check_operator\('bm25_recent'\) \[cold equality\]: .*operator bm25_recent .*"
      r'cold soft twin != hard leg: top-10 ids differ on [1-9]',
    ):
      check_operator('bm25_recent')


@contextlib.contextmanager
def registered(op: registry.Operator):
  """Register ``op`` for the block; restore the registry afterwards."""
  before = dict(registry.OPERATORS)
  try:
    registry.register(op)
    yield op
  finally:
    registry.OPERATORS.clear()
    registry.OPERATORS.update(before)


def _declared(leg, knobs):
  return registry.Operator(name='decl_test', leg=leg, knobs=knobs)


def test_declaration_must_match_the_leg():
  def leg(ep, key, *, a=1.0, b=2.0):
    del ep, key

  with pytest.raises(
    AssertionError, match=r"'decl_test'\) \[declaration\]: knobs \['b', 'a'\] do not match .*\['a', 'b'\]"
  ):
    check_declaration(_declared(leg, (registry.Knob('b', 2.0), registry.Knob('a', 1.0))))
  with pytest.raises(AssertionError, match=r"knob b: the leg's default 2.0 is not the declared 3.0"):
    check_declaration(_declared(leg, (registry.Knob('a', 1.0), registry.Knob('b', 3.0))))
  with pytest.raises(AssertionError, match=r'knob b: its default is out of its own range'):
    check_declaration(_declared(leg, (registry.Knob('a', 1.0, check='[0,1]'), registry.Knob('b', 2.0, check='[0,1]'))))
  with pytest.raises(
    AssertionError, match=r'knobs \[.a.\] have a transform \(fittable\) but the operator has no soft twin'
  ):
    check_declaration(_declared(leg, (registry.Knob('a', 1.0, transform='log'), registry.Knob('b', 2.0))))
  check_declaration(_declared(leg, (registry.Knob('a', 1.0), registry.Knob('b', 2.0))))


@given(st.integers(1, 4), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_helpers_reduce_over_the_item_axis_only(b, n, seed):
  """``write_time`` and ``minmax`` on ``[B, N]`` equal them row by row (as rax functions take leading axes)."""
  rng = np.random.default_rng(seed)
  where = np.zeros((4, 12), bool)  # one padded shape (one compilation): b rows of n items are real candidates
  where[:b, :n] = rng.random((b, n)) < 0.7
  b = 4
  positions = np.broadcast_to(np.arange(12), (4, 12))
  rows = np.stack([np.asarray(pools.write_time(positions[i], where[i])) for i in range(b)])
  np.testing.assert_array_equal(np.asarray(pools.write_time(positions, where)), rows)
  np.testing.assert_array_equal(np.asarray(jax.vmap(pools.write_time)(positions, where)), rows)
  x = rng.normal(size=(4, 12))
  mm = np.stack([np.asarray(cfsr.minmax(jnp.asarray(x[i]), where[i])) for i in range(b)])
  np.testing.assert_array_equal(np.asarray(cfsr.minmax(jnp.asarray(x), where)), mm)


def _literal(node):
  return node.value if isinstance(node, ast.Constant) and not isinstance(node.value, bool) else None


def test_no_default_literal_of_a_declared_knob_outside_its_declaration():
  """No function of the operator modules or their NumPy references gives a knob-named argument a literal default
  equal to that knob's declared default (signatures read the declaration: ``registry.knob_defaults``). Elsewhere a
  ``k`` or ``seed`` is another quantity (an evaluation cutoff, an RNG seed), not a knob."""
  declared = {}
  for op in ops.OPERATORS.values():
    for k in op.knobs:
      if k.default is not None and not isinstance(k.default, bool):
        declared.setdefault(k.name, set()).add(k.default)
  found = []
  for path in sorted((ROOT / 'engram_jax' / 'ops').glob('*.py')) + [ROOT / 'engram_jax' / 'testing' / 'reference.py']:
    for node in ast.walk(ast.parse(path.read_text())):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        continue
      args = node.args
      pairs = list(zip(args.args[len(args.args) - len(args.defaults) :], args.defaults))
      pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
      for arg, default in pairs:
        value = _literal(default)
        if value is not None and arg.arg in declared and value in declared[arg.arg]:
          found.append(f'{path.relative_to(ROOT)}:{default.lineno} {arg.arg}={value!r}')
  assert not found, f'default literals of declared knobs outside their Knob(...): {found}'


def _recent_leg(ep, key, *, c=0.3):
  del key
  s = jnp.einsum('qd,nd->qn', ep.queries, ep.docs)
  return jnp.where(ep.where, s + c * pools.write_time(ep.positions, ep.where), -jnp.inf)


def _flipped_gradient_twin(rows, values, ctx):
  """The hard formula's value, but d/dc of it is -t: cold equality holds, the gradient points the wrong way."""
  del rows
  ct = values['c'] * pools.write_time(ctx.positions, ctx.where)
  return jnp.where(ctx.where, ctx.cos + ct - 2.0 * (ct - jax.lax.stop_gradient(ct)), -jnp.inf)


def test_a_gradient_that_points_the_wrong_way_is_rejected():
  op = registry.Operator(
    name='flipped_test',
    leg=_recent_leg,
    knobs=(registry.Knob('c', 0.3, transform='identity'),),
    soft=registry.SoftTwin(rows=lambda *a: {}, scores=_flipped_gradient_twin),
  )
  before = dict(registry.OPERATORS)
  try:
    registry.register(op)
    with pytest.raises(
      AssertionError, match=r"'flipped_test'\) \[gradient sign\]: knob c: the twin's gradient predicts F [-+]"
    ):
      check_operator('flipped_test')
  finally:
    registry.OPERATORS.clear()
    registry.OPERATORS.update(before)


def test_stages_that_drift_from_the_leg_are_rejected():
  """A staged leg whose finish does not reproduce the leg (here: w read as 1 - w) fails check_stages by name."""
  from engram_jax.testing.episodes import random_padded_episodes
  from engram_jax.testing.operators import check_stages

  _, arrays = random_padded_episodes(0)
  good = cfsr.CFSR
  check_stages(good, arrays[:1], good.defaults, seed=0)
  bad_finish = lambda ep, p, key, **kw: cfsr.cfsr_finish(ep, p, key, **{**kw, 'w': 1.0 - kw['w']})
  bad = registry.Operator(
    name='cfsr_bad_stages',
    leg=good.leg,
    knobs=good.knobs,
    stages=registry.Stages(prepare=good.stages.prepare, finish=bad_finish, by=good.stages.by),
  )
  with pytest.raises(
    AssertionError, match=r"check_operator\('cfsr_bad_stages'\) \[stages\]: its stages .* differ from the leg"
  ):
    check_stages(bad, arrays[:1], bad.defaults, seed=0)
  traced = registry.Operator(
    name='cfsr_traced_by',
    leg=good.leg,
    knobs=good.knobs,
    stages=registry.Stages(prepare=good.stages.prepare, finish=good.stages.finish, by=('lam',)),
  )
  with pytest.raises(AssertionError, match='static knobs only'):
    check_stages(traced, arrays[:1], traced.defaults, seed=0)


def _per_question_leg(mean_of_rows: bool):
  def leg(ep, key, *, c=0.3):
    """``cos + c t`` with ``c`` a scalar or one value per question ``[Q]``."""
    del key
    c = jnp.asarray(c)
    c = jnp.mean(c) if mean_of_rows else (c[:, None] if c.ndim else c)  # the bug: one value for every question
    s = jnp.einsum('qd,nd->qn', ep.queries, ep.docs)
    return jnp.where(ep.where, s + c * pools.write_time(ep.positions, ep.where), -jnp.inf)

  return leg


def _per_question_twin(mean_of_rows: bool):
  def scores(rows, values, ctx):
    del rows
    c = jnp.asarray(values['c'])
    c = jnp.mean(c) if mean_of_rows else (c[:, None] if c.ndim else c)  # the bug: one value for the whole batch
    return jnp.where(ctx.where, ctx.cos + c * pools.write_time(ctx.positions, ctx.where), -jnp.inf)

  return scores


@pytest.mark.parametrize('bug', ['none', 'twin', 'leg'])
def test_a_per_question_knob_is_checked_in_the_leg_and_the_twin(bug):
  """A knob declared per_question passes when leg and twin take per-question values; a twin or a leg that averages
  them (each still right at a scalar value) is rejected by name."""
  op = registry.Operator(
    name='perq_test',
    leg=_per_question_leg(bug == 'leg'),
    knobs=(registry.Knob('c', 0.3, transform='identity', per_question=True),),
    soft=registry.SoftTwin(rows=lambda *a: {}, scores=_per_question_twin(bug == 'twin')),
  )
  message = {
    'twin': r"'perq_test'\) \[per-question\]: knob c \(per_question\): the twin given one value per row does not reproduce",
    'leg': r"'perq_test'\) \[per-question\]: knob c \(per_question\): the leg given one value per question differs",
  }
  before = dict(registry.OPERATORS)
  try:
    registry.register(op)
    if bug == 'none':
      check_operator('perq_test')
    else:
      with pytest.raises(AssertionError, match=message[bug]):
        check_operator('perq_test')
  finally:
    registry.OPERATORS.clear()
    registry.OPERATORS.update(before)


def test_a_per_question_knob_must_be_fittable():
  with pytest.raises(ValueError, match='a per-question knob must be fittable'):
    registry.Knob('c', 0.3, per_question=True)


# Issue 30: a fittable knob whose default is 0 (the prototype's recency weight) must still be exercised. The operator
# cos x (1 + c t^p) with c = 0 by default, and two twin bugs that c = 0 hides: the [B, N] batch-axis bug of issue 17
# (t over the whole batch) and a dropped factor (cos + c t^p: the cosine factor of the boost term dropped).


def _pow(t, p):
  """``t^p`` with 0 at ``t = 0`` and a finite gradient in ``p`` there."""
  pos = t > 0
  return jnp.where(pos, jnp.where(pos, t, 1.0) ** p, 0.0)


def _zero_default_leg(ep, key, *, c=0.0, p=1.0):
  del key
  s = jnp.einsum('qd,nd->qn', ep.queries, ep.docs)
  t = pools.write_time(ep.positions, ep.where)
  return jnp.where(ep.where, s * (1.0 + c * _pow(t, p)), -jnp.inf)


def _zero_default_twin(bug: str):
  def scores(rows, values, ctx):
    del rows
    c, p = values['c'], values['p']
    if bug == 'batch axis':  # N_real summed over the B rows too (pools.write_time before issue 17)
      n_real = jnp.sum(ctx.where)
      t = jnp.where(ctx.where, ctx.positions / jnp.maximum(n_real - 1, 1), 0.0)
    else:
      t = pools.write_time(ctx.positions, ctx.where)
    cos = jnp.where(ctx.where, ctx.cos, 0.0)  # -inf on padded items: never multiplied (a NaN gradient)
    s = cos + c * _pow(t, p) if bug == 'dropped factor' else cos * (1.0 + c * _pow(t, p))
    return jnp.where(ctx.where, s, -jnp.inf)

  return scores


def _zero_default_op(bug: str) -> registry.Operator:
  return registry.Operator(
    name='zero_default_test',
    leg=_zero_default_leg,
    knobs=(
      registry.Knob('c', 0.0, transform='identity', check='>=0', doc='recency boost'),
      registry.Knob('p', 1.0, transform='log', check='>0', doc='recency exponent'),
    ),
    soft=registry.SoftTwin(rows=lambda *a: {}, scores=_zero_default_twin(bug)),
  )


@pytest.mark.parametrize('bug', ['none', 'batch axis', 'dropped factor'])
def test_a_zero_default_knob_is_drawn_away_from_it(bug):
  """Both bugs are invisible at c = 0 (the declared default); the first random draw moves c (into its range, c >= 0)
  and exposes each, and the message names the part, the draw's values and c as the knob that exposed it."""
  with registered(_zero_default_op(bug)):
    if bug == 'none':
      check_operator('zero_default_test')
      return
    with pytest.raises(AssertionError) as e:
      check_operator('zero_default_test')
  message = str(e.value)
  print(f'{bug}: {message}')
  assert re.match(
    r"check_operator\('zero_default_test'\) \[cold equality\]: exposed by the draw of c \(moved alone from its "
    r'default it fails too\): operator zero_default_test \(leg zero_default_test, random draw 1 '
    r'\{c=0\.\d+, p=[\d.]+\} knob values\): cold soft twin != hard leg',
    message,
  ), message


@pytest.mark.parametrize('transform', ['log', 'softplus', 'logit'])
def test_a_default_on_the_transform_boundary_is_refused_at_declaration(transform):
  """0 under log (or softplus, or logit) has an infinite unconstrained value: every draw around it stays at it and a
  fit cannot move it. Refused when the knob is declared, in one line."""
  with pytest.raises(ValueError, match=rf"^knob c: default 0.0 is not inside the open range .* of its '{transform}'"):
    registry.Knob('c', 0.0, transform=transform, check='>=0')
  registry.Knob('c', 0.0, transform='identity', check='>=0')  # a zero default is fine where it is not a boundary


def test_random_draws_move_every_knob_inside_its_range():
  from engram_jax.testing.operators import random_values

  op = _zero_default_op('none')
  rng = np.random.default_rng(0)
  for _ in range(50):
    v = random_values(op, rng)
    assert v['c'] >= 0.25 and v['p'] != 1.0 and abs(np.log(v['p'])) >= 0.25, v
