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
      match=r"check_operator\('bm25_recent'\): operator bm25_recent .*"
      r'cold soft twin != hard leg: top-10 ids differ on [1-9]',
    ):
      check_operator('bm25_recent')


def _declared(leg, knobs):
  return registry.Operator(name='decl_test', leg=leg, knobs=knobs)


def test_declaration_must_match_the_leg():
  def leg(ep, key, *, a=1.0, b=2.0):
    del ep, key

  with pytest.raises(AssertionError, match=r"'decl_test'.*knobs \['b', 'a'\] do not match .*\['a', 'b'\]"):
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
    with pytest.raises(AssertionError, match=r"'flipped_test'\): knob c: the twin's gradient predicts F [-+]"):
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
  with pytest.raises(AssertionError, match=r"check_operator\('cfsr_bad_stages'\): its stages .* differ from the leg"):
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
    'twin': r"'perq_test'\): knob c \(per_question\): the twin given one value per row does not reproduce",
    'leg': r"'perq_test'\): knob c \(per_question\): the leg given one value per question differs",
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
