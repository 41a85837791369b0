"""The public API: every name in ``__all__`` of ``engram_jax`` and of its subpackages resolves, has a docstring
with a ``>>>`` example, and the example runs (doctest). optax's docs coverage check is the model: a public name
without an example fails here. ``import engram_jax`` itself stays light (no JAX until a name is used)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import subprocess
import sys

import pytest

PACKAGES = (
  'engram_jax',
  'engram_jax.core',
  'engram_jax.ops',
  'engram_jax.eval',
  'engram_jax.metrics',
  'engram_jax.fit',
  'engram_jax.data',
  'engram_jax.answer',
  'engram_jax.testing',
)


def public_objects() -> list[tuple[str, object]]:
  """(qualified public name, object) for every non-module name of every package's ``__all__``, each object once."""
  seen, out = set(), []
  for pkg in PACKAGES:
    module = importlib.import_module(pkg)
    for name in module.__all__:
      obj = getattr(module, name)
      if inspect.ismodule(obj) or id(obj) in seen:
        continue
      seen.add(id(obj))
      out.append((f'{pkg}.{name}', obj))
  return out


PUBLIC = public_objects()


@pytest.mark.parametrize('pkg', PACKAGES)
def test_all_is_explicit_and_resolves(pkg):
  module = importlib.import_module(pkg)
  assert module.__all__, f'{pkg} has an empty __all__'
  private = [n for n in module.__all__ if n.startswith('_')]
  assert not private, f'{pkg}.__all__ exports private names {private}'
  missing = [n for n in module.__all__ if not hasattr(module, n)]
  assert not missing, f'{pkg}.__all__ names {missing}, which do not resolve'


@pytest.mark.parametrize('qualname,obj', PUBLIC, ids=[q for q, _ in PUBLIC])
def test_public_name_has_a_docstring_with_an_example(qualname, obj):
  doc = inspect.getdoc(obj) or ''
  assert doc.strip(), f'{qualname} has no docstring'
  assert '>>>' in doc, f'{qualname} has no >>> example in its docstring'


@pytest.mark.parametrize('qualname,obj', PUBLIC, ids=[q for q, _ in PUBLIC])
def test_public_examples_run(qualname, obj):
  finder = doctest.DocTestFinder(recurse=False)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  tests = finder.find(obj, qualname, globs={})
  assert tests and any(t.examples for t in tests), f'{qualname}: no doctest found'
  out: list[str] = []
  for t in tests:
    runner.run(t, out=out.append)
  assert runner.failures == 0, f'{qualname}: {runner.failures} failing example(s)\n' + ''.join(out)


@pytest.mark.parametrize('pkg', [p for p in PACKAGES if p != 'engram_jax.testing'])
def test_package_docstring_examples_run(pkg):
  module = importlib.import_module(pkg)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  out: list[str] = []
  for t in doctest.DocTestFinder(recurse=False).find(module, pkg, globs={}):
    runner.run(t, out=out.append)
  assert runner.failures == 0, ''.join(out)


def test_coverage_check_fails_on_an_undocumented_name():
  """The check above is not vacuous: a public function without an example is caught."""

  def undocumented(x):
    """No example here."""
    return x

  with pytest.raises(AssertionError, match='no >>> example'):
    test_public_name_has_a_docstring_with_an_example('toy.undocumented', undocumented)


def test_import_engram_jax_imports_no_jax():
  code = (
    'import sys, engram_jax; assert engram_jax.__all__; bad = {"jax", "numpy"} & set(sys.modules); assert not bad, bad'
  )
  subprocess.run([sys.executable, '-c', code], check=True)
