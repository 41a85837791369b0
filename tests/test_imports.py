"""Import discipline, read from the source: the library never imports hydra, omegaconf, ``experiments`` or ``tests``,
and no module imports another module's private (``_name``) function."""

import ast
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
    if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
        and node.value.id in aliases):
      bad.append((node.value.id, node.attr, node.lineno))
  return bad


@pytest.mark.parametrize('path', EVERY, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_another_modules_private_names(path):
  bad = private_uses(path)
  assert not bad, f'{path.relative_to(ROOT)} uses private names of other modules: {bad}'


def test_the_checks_can_fail(tmp_path):
  p = tmp_path / 'x.py'
  p.write_text('import hydra\nfrom engram_jax.diversity import _map_queries\nfrom experiments import evaluate as ev\n'
               'x = ev._load\n')
  assert private_uses(p) == [('engram_jax.diversity', '_map_queries', 2), ('ev', '_load', 4)]
  assert [m for m, _, _ in _imports(p)][0] == 'hydra'
