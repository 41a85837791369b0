"""A number's spelling never changes a compiled program: knob values are canonicalised to their declared type
before tracing (``lam=1`` and ``lam=1.0`` compile once and give the same result)."""

import numpy as np
import pytest

from engram_jax.core.types import Episode, Item, Question
from engram_jax.eval import evaluation, pipeline, timing
from engram_jax.ops import registry


def _episodes(n_items=24, n_q=3, dim=8, seed=0):
  rng = np.random.default_rng(seed)
  items = tuple(Item(f'i{j}', f'item {j} text', f'p{j // 4}', j) for j in range(n_items))
  qs = tuple(Question(f'q{j}', f'question {j}', (f'i{3 * j}',), (f'p{3 * j // 4}',), 'c') for j in range(n_q))
  ep = Episode(id='e0', items=items, questions=qs)
  d = rng.normal(size=(n_items, dim)).astype(np.float32)
  q = rng.normal(size=(n_q, dim)).astype(np.float32)
  return [ep], [(d / np.linalg.norm(d, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True))]


def _cfsr(lam):
  return pipeline.make_pipeline(
    legs={'cfsr': {'op': 'cfsr', 'lam': lam, 'pool': 12, 'iterations': 5}}, name=f'cfsr[{lam!r}]'
  )


def test_values_take_the_declared_type():
  cfsr = registry.get('cfsr')
  assert cfsr.knob('lam').canonical(1) == 1.0 and isinstance(cfsr.knob('lam').canonical(1), float)
  assert isinstance(cfsr.knob('lam').canonical(np.float32(0.5)), float)
  assert isinstance(cfsr.knob('pool').canonical(150.0), int) and cfsr.knob('pool').canonical(150.5) == 150.5
  assert cfsr.knob('w').canonical(True) is True  # left to validate (which refuses it)
  assert pipeline.traced_values(_cfsr(1)) == pipeline.traced_values(_cfsr(1.0))
  assert all(type(v) is float for v in pipeline.traced_values(_cfsr(1)).values())


def _requests(pipes):
  eps, embs = _episodes()
  timer = timing.RunTimer()
  res = evaluation.evaluate(eps, embs, pipes, k=5, metrics=['ndcg@5'], seed=0, progress=False)
  return timer.stop()['compile_requests'], res


def test_an_int_for_a_float_knob_compiles_once():
  _requests({'a': _cfsr(1.0)})  # warm: the metric programs
  one, alone = _requests({'a': _cfsr(1.0)})
  both, res = _requests({'a': _cfsr(1.0), 'b': _cfsr(1)})
  assert both == one  # the second pipeline reuses the first one's program: no compile for the type of a number
  assert res.retrieved['a'] == res.retrieved['b'] == alone.retrieved['a']


@pytest.mark.slow  # the counterfactual (compiles twice); the fast tier keeps the positive test
def test_without_canonical_values_an_int_would_recompile(monkeypatch):
  """The check above can fail: with the canonicalisation turned off, ``lam=1`` is traced as int32."""
  monkeypatch.setattr(registry.Knob, 'canonical', lambda self, value: value)
  _requests({'a': _cfsr(1.0)})
  one, _ = _requests({'a': _cfsr(1.0)})
  both, _ = _requests({'a': _cfsr(1.0), 'b': _cfsr(1)})
  assert both > one
