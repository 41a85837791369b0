"""The shape of the house (issue 50 item 6): the library's layers import downwards only; no module of the project
imports another that imports it back (lazy imports inside functions included); one module importer; the entry
points are short named steps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# each subpackage of engram_jax may import those before it, never after (answer and testing sit on top)
LAYERS = ('core', 'metrics', 'data', 'ops', 'eval', 'fit', 'answer', 'testing')


def _module(path: Path) -> str:
  return '.'.join(path.relative_to(ROOT).with_suffix('').parts).removesuffix('.__init__')


def _imports(path: Path) -> set[str]:
  """Every module of the project ``path`` imports, at any depth (functions included), but under TYPE_CHECKING."""
  tree = ast.parse(path.read_text())
  typing_only = set()
  for n in ast.walk(tree):
    if isinstance(n, ast.If) and 'TYPE_CHECKING' in ast.unparse(n.test):
      typing_only |= {id(x) for x in ast.walk(n)}
  out = set()
  for n in ast.walk(tree):
    if id(n) in typing_only:
      continue
    if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
      out.add(n.module)
      out |= {f'{n.module}.{a.name}' for a in n.names}
    elif isinstance(n, ast.Import):
      out |= {a.name for a in n.names}
  return {m for m in out if m.split('.')[0] in ('engram_jax', 'experiments')}


def _graph() -> dict[str, set[str]]:
  files = [p for d in ('engram_jax', 'experiments') for p in (ROOT / d).rglob('*.py')]
  mods = {_module(p): p for p in files}
  return {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}


def test_the_library_layers_import_downwards():
  bad = []
  for m, deps in _graph().items():
    parts = m.split('.')
    if parts[0] != 'engram_jax' or len(parts) < 2 or parts[1] not in LAYERS:
      continue
    for d in deps:
      dp = d.split('.')
      if len(dp) > 1 and dp[1] in LAYERS and LAYERS.index(dp[1]) > LAYERS.index(parts[1]):
        bad.append(f'{m} -> {d}')
  assert not bad, bad


def test_no_import_circle_between_modules():
  """Package __init__ files re-export their modules, so a package and its own modules are left out of the cycles."""
  graph = _graph()
  circles = []
  for a, deps in graph.items():
    for b in deps:
      if a in graph.get(b, ()) and a < b and not (b.startswith(a + '.') or a.startswith(b + '.')):
        circles.append(f'{a} <-> {b}')
  assert not circles, circles


def test_one_module_importer():
  """User-named modules (operators, components, dataset metrics, reports, an artifact's) are imported by
  engram_jax.core.modules alone (experiments/docs_site.py imports the package's own modules for the API pages)."""
  allowed = {'engram_jax/core/modules.py', 'experiments/docs_site.py'}
  users = sorted(
    str(p.relative_to(ROOT))
    for d in ('engram_jax', 'experiments')
    for p in (ROOT / d).rglob('*.py')
    if 'research' not in p.parts and 'import_module(' in p.read_text().replace('modules.import_module(', '')
  )
  assert set(users) <= allowed, users


@pytest.mark.parametrize('path', ['experiments/evaluate.py', 'experiments/fit.py'])
def test_entry_points_are_short_named_steps(path):
  tree = ast.parse((ROOT / path).read_text())
  long = [
    f'{n.name}: {n.end_lineno - n.lineno + 1} lines'
    for n in ast.walk(tree)
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60
  ]
  assert not long, long


def test_every_run_prints_its_slowest_tests():
  """Issue 50 item 7: CI's output names the slowest tests (pytest's --durations in the configured options)."""
  import tomllib

  opts = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['pytest']['ini_options']['addopts']
  assert '--durations=' in opts


def _reads_of_node(path: Path, key: str) -> list[str]:
  """The functions of ``path`` that read a config's node ``key`` (``cfg.<key>`` or ``cfg['<key>']``)."""
  out = []
  for fn in ast.walk(ast.parse(path.read_text())):
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    for n in ast.walk(fn):
      attr = isinstance(n, ast.Attribute) and n.attr == key
      item = isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == key
      if (attr or item) and isinstance(n.value, ast.Name) and n.value.id == 'cfg':
        out.append(f'{path.relative_to(ROOT)}:{fn.name}')
        break
  return out


def test_the_fit_settings_cross_once_as_typed_settings():
  """Issue 50 item 6: the config's ``fit`` node is read in one function (experiments.lib.fit_setup.read, which hands
  it to the library's FitConfig.from_mapping); every other fit setting is read from the typed FitRun / FitConfig."""
  readers = [r for p in sorted((ROOT / 'experiments').rglob('*.py')) for r in _reads_of_node(p, 'fit')]
  assert readers == ['experiments/lib/fit_setup.py:read'], readers


def test_the_eval_settings_cross_once_as_typed_settings():
  """Issue 50 item 6: the entry points and their library (experiments/*.py, experiments/lib/) read the config's
  ``eval`` node in one function (experiments.lib.common.eval_settings, which hands it to the library's
  EvalConfig.from_mapping) and pass the typed settings on; the research scripts and benches read their own."""
  paths = sorted([*(ROOT / 'experiments').glob('*.py'), *(ROOT / 'experiments' / 'lib').glob('*.py')])
  readers = [r for p in paths for r in _reads_of_node(p, 'eval')]
  assert readers == ['experiments/lib/common.py:eval_settings'], readers
