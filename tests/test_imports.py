"""Import discipline, read from the source: the library never imports hydra, omegaconf, ``experiments`` or ``tests``,
no module imports another module's private (``_name``) function,
and the library's modules import each other without a cycle."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted((ROOT / 'engram_jax').rglob('*.py'))
EVERY = LIBRARY + sorted((ROOT / 'experiments').rglob('*.py')) + sorted((ROOT / 'tests').rglob('*.py'))
BANNED_IN_LIBRARY = ('hydra', 'omegaconf', 'experiments', 'tests')


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
  """``(module, imported names, line)`` for every import statement in ``path``."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'), filename=str(path))):
    if isinstance(node, ast.Import):
      out += [(a.name, [], node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      out.append((node.module, [a.name for a in node.names], node.lineno))
  return out


def _private(name: str) -> bool:
  return name.startswith('_') and not name.startswith('__')


def _project_module(module: str) -> bool:
  return module.split('.')[0] in ('engram_jax', 'experiments', 'tests')


@pytest.mark.parametrize('path', LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_imports_no_config_framework_or_entry_points(path):
  bad = [(m, line) for m, _, line in _imports(path) if m.split('.')[0] in BANNED_IN_LIBRARY]
  assert not bad, f'{path.relative_to(ROOT)} imports {bad}'


def private_uses(path: Path) -> list[tuple[str, str, int]]:
  """``(module or alias, private name, line)`` for every private name of another project module that ``path``
  imports or reads as an attribute (``from m import _f``, ``import m as ev; ev._load``)."""
  bad = []
  for module, names, line in _imports(path):
    if _project_module(module):
      bad += [(module, n, line) for n in names if _private(n)]
      bad += [(module, part, line) for part in module.split('.') if _private(part)]
  tree = ast.parse(path.read_text(encoding='utf-8'))
  aliases = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      aliases |= {a.asname or a.name.split('.')[0] for a in node.names if _project_module(a.name)}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _project_module(node.module):
      aliases |= {a.asname or a.name for a in node.names}
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and _private(node.attr)
      and isinstance(node.value, ast.Name)
      and node.value.id in aliases
    ):
      bad.append((node.value.id, node.attr, node.lineno))
  return bad


@pytest.mark.parametrize('path', EVERY, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_another_modules_private_names(path):
  bad = private_uses(path)
  assert not bad, f'{path.relative_to(ROOT)} uses private names of other modules: {bad}'


def test_the_checks_can_fail(tmp_path):
  p = tmp_path / 'x.py'
  p.write_text(
    'import hydra\nfrom engram_jax.diversity import _map_queries\nfrom experiments import evaluate as ev\n'
    'x = ev._load\n'
  )
  assert private_uses(p) == [('engram_jax.diversity', '_map_queries', 2), ('ev', '_load', 4)]
  assert [m for m, _, _ in _imports(p)][0] == 'hydra'


def module_name(path: Path, root: Path = ROOT) -> str:
  """``engram_jax/ops/bm25.py`` -> ``engram_jax.ops.bm25``; a package's ``__init__.py`` -> the package."""
  parts = list(path.relative_to(root).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def import_graph(paths: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
  """Module -> the project modules it imports, read from the source (every import statement: top level, inside a
  function or under ``if TYPE_CHECKING``). ``from pkg import name`` points at ``pkg.name`` when that is a module,
  else at ``pkg``; relative imports are resolved. A package's ``__init__`` running before its submodules is not
  counted as an edge (every submodule would otherwise form a loop with its own package)."""
  modules = {module_name(p, root): p for p in paths}
  graph: dict[str, set[str]] = {m: set() for m in modules}

  def known(name: str) -> str | None:
    while name and name not in modules:
      name = name.rpartition('.')[0]
    return name or None

  for mod, path in modules.items():
    package = mod if path.name == '__init__.py' else mod.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'), filename=str(path))):
      targets = []
      if isinstance(node, ast.Import):
        targets = [known(a.name) for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          anchor = package.split('.')[: len(package.split('.')) - node.level + 1]
          base = '.'.join(anchor + ([base] if base else []))
        targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in modules else known(base) for a in node.names]
      graph[mod] |= {t for t in targets if t is not None and t != mod}
  return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle of ``graph`` (a list of modules, first == last), or None when it is acyclic."""
  try:
    tuple(graphlib.TopologicalSorter(graph).static_order())
  except graphlib.CycleError as e:
    return list(e.args[1])
  return None


def test_the_library_has_no_import_cycle():
  graph = import_graph(LIBRARY)
  assert (
    'engram_jax.core.lexicon' in graph['engram_jax.core.batch']
    and 'engram_jax.core.batch' in graph['engram_jax.ops.bm25']
  )
  cycle = import_cycle(graph)
  assert cycle is None, f'import cycle in engram_jax: {" -> ".join(cycle)}'


def test_the_cycle_check_can_fail(tmp_path):
  pkg = tmp_path / 'pkg'
  (pkg / 'sub').mkdir(parents=True)
  (pkg / '__init__.py').write_text('')
  (pkg / 'sub' / '__init__.py').write_text('from pkg.sub import b  # noqa\n')
  (pkg / 'a.py').write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from pkg.sub.b import X\n')
  (pkg / 'sub' / 'b.py').write_text('def f():\n  from .. import a\n')
  graph = import_graph(sorted(pkg.rglob('*.py')), tmp_path)
  assert graph == {'pkg': set(), 'pkg.sub': {'pkg.sub.b'}, 'pkg.a': {'pkg.sub.b'}, 'pkg.sub.b': {'pkg.a'}}
  assert sorted(import_cycle(graph)[1:]) == ['pkg.a', 'pkg.sub.b']
  del graph['pkg.sub.b']
  graph['pkg.sub.b'] = set()
  assert import_cycle(graph) is None


HEAVY = ('statsmodels', 'scipy.stats', 'flax', 'optax', 'sentence_transformers', 'torch', 'transformers', 'matplotlib')


def test_the_entry_point_imports_no_heavy_module_it_may_not_use():
  """``import experiments.evaluate`` (every run's start) leaves the heavy libraries to the code that uses them:
  statsmodels for McNemar, scipy.stats, flax and optax for fitting and the learned gate, sentence-transformers and
  torch for embedding, matplotlib for plots (issue 20: start-up time)."""
  import subprocess
  import sys

  code = f'import sys, experiments.evaluate; print(sorted(m for m in {HEAVY!r} if m in sys.modules))'
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]', f'imported at start-up: {out.stdout.strip()}'
