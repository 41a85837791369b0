"""docs/extending.md runs: every code block is extracted and run, in order, so the guide cannot go stale.

* A Python block whose first line is ``# <path>.py`` becomes the module of that path (``mypkg/recent.py`` ->
  ``mypkg.recent`` in ``sys.modules``, as if it were on the path); ``# in <path>.py`` runs in that module (the one a
  block above defined, else a copy of the library module's namespace, so nothing global changes); any other block runs
  on its own (e.g. a ``check_operator`` call).
* A YAML block whose first line is ``# conf/<group>/<name>.yaml`` is written into a copy of ``conf/`` (``(these
  keys)``: merged into the file a block above wrote) and built: a pipeline node by the pipeline builder, a dataset node
  by its loader on a tiny file of the format the loader documents.
* A command block: each ``python -m experiments.evaluate|fit ...`` line is composed against that copy of ``conf/``
  (the Hydra overrides as written), its ``ops_modules`` imported and its pipelines built (for ``fit``: the problem
  with its ``fit.params``); each ``python -m experiments.bench ...`` line runs as written (slow tier).

Registered operators, ``sys.modules`` entries and configs are restored afterwards.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import shutil
import sys
import types
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.utils import get_method

from engram_jax import fit
from engram_jax.eval import checks as data_checks
from engram_jax.ops import registry
from experiments.lib import checks, common

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / 'docs' / 'extending.md'
BLOCK = re.compile(r'^```(\w+)\n(.*?)^```', re.S | re.M)


def blocks() -> list[tuple[str, str]]:
  return [(m.group(1), m.group(2)) for m in BLOCK.finditer(DOC.read_text())]


def _module_name(path: str) -> str:
  return path.removesuffix('.py').replace('/', '.')


class DocRun:
  """Runs the blocks of the guide in order (module docstring)."""

  def __init__(self, conf: Path, data: Path):
    self.conf, self.data = conf, data
    self.modules: dict[str, types.ModuleType] = {}

  def python(self, src: str) -> None:
    head = src.splitlines()[0]
    m = re.fullmatch(r'# (in )?([\w/]+\.py)', head.strip())
    if m and not m.group(1):  # a module of its own
      name = _module_name(m.group(2))
      for i in range(1, name.count('.') + 1):  # parent packages that do not exist (mypkg)
        parent = name.rsplit('.', i)[0]
        if parent not in sys.modules:
          pkg = types.ModuleType(parent)
          pkg.__path__ = []
          sys.modules[parent] = pkg
          self.modules[parent] = pkg
      module = types.ModuleType(name)
      module.__file__ = f'{DOC}:{name}'
      sys.modules[name] = module
      self.modules[name] = module
      exec(compile(src, f'{DOC.name} [{name}]', 'exec'), module.__dict__)
    elif m:  # inside a module: the doc's own, or a copy of the library's
      name = _module_name(m.group(2))
      namespace = self.modules[name].__dict__ if name in self.modules else dict(vars(importlib.import_module(name)))
      exec(compile(src, f'{DOC.name} [in {name}]', 'exec'), namespace)
    else:
      exec(compile(src, f'{DOC.name} [{head}]', 'exec'), {'__name__': 'doc_block'})

  def yaml(self, src: str) -> None:
    m = re.fullmatch(r'# (conf/\w+/\w+\.yaml)( \(these keys\))?', src.splitlines()[0].strip())
    assert m, f'a YAML block of {DOC.name} must start with "# conf/<group>/<name>.yaml": {src[:60]!r}'
    path = self.conf.parent / m.group(1)
    node = yaml.safe_load(src)
    if m.group(2):
      node = {**yaml.safe_load(path.read_text()), **node}
    path.write_text(yaml.safe_dump(node))
    group = path.parent.name
    if group == 'pipeline':
      for name, spec in node.items():
        common.pipeline_from_node(name, spec)
    elif group == 'dataset':
      self.dataset(path.stem, node)
    else:
      raise AssertionError(f'no check for a conf/{group} block')

  def dataset(self, name: str, node: dict) -> None:
    """Load a tiny file of the format the loader's docstring gives, and check the dataset's metrics."""
    root = self.data
    (root / name).mkdir(parents=True, exist_ok=True)
    record = {
      'id': 'rec1',
      'turns': [
        {'id': 't1', 'text': 'we adopted a cat', 'session': 's1'},
        {'id': 't2', 'text': '   ', 'session': 's1'},
        {'id': 't3', 'text': 'the cat is called Io', 'session': 's2'},
      ],
      'questions': [
        {'id': 'q1', 'text': 'what is the cat called?', 'evidence': ['t3', 'tX']},
        {'id': 'q2', 'text': 'unanswerable', 'evidence': []},
      ],
    }
    (root / name / f'{name}.json').write_text(json.dumps([record]))
    episodes, report = get_method(node['loader']['_target_'])(str(root))
    assert [len(e.items) for e in episodes] == [2] and [len(e.questions) for e in episodes] == [1]
    counts = report.counts
    assert counts['blank_turn_dropped'] == 1 and counts['excluded_no_evidence'] == 1, counts
    data_checks.check_metrics(
      list(node['metrics']), k=10, supported=list(common.dataset_metrics(node)), where=f'dataset {name}'
    )

  def command(self, line: str) -> None:
    argv = shlex.split(line)
    assert argv[:2] == ['python', '-m'], line
    tool, args = argv[2], argv[3:]
    if tool == 'experiments.bench':
      return  # run as written by test_bench_commands (slow tier)
    config = {'experiments.evaluate': 'config', 'experiments.fit': 'fit'}[tool]
    with initialize_config_dir(config_dir=str(self.conf), version_base='1.3'):
      cfg = compose(config_name=config, overrides=args)
    for module in cfg.get('ops_modules') or []:
      assert module in sys.modules or importlib.import_module(module), module
    if tool == 'experiments.evaluate':
      pipes, _ = common.build_pipelines(cfg)
      assert pipes, line
    else:
      checks.check_fit(cfg)
      (name,) = list(cfg.pipeline)
      pipe = common.hand_set_pipeline(name, cfg.pipeline[name])
      fit.make_problem(pipe, list(cfg.fit.params or cfg.fit.params_by_pipeline[name]))


@pytest.fixture
def doc_run(tmp_path):
  shutil.copytree(ROOT / 'conf', tmp_path / 'conf')
  run = DocRun(tmp_path / 'conf', tmp_path / 'data')
  before, components = dict(registry.OPERATORS), dict(fit.components.COMPONENTS)
  try:
    yield run
  finally:
    registry.OPERATORS.clear()
    registry.OPERATORS.update(before)
    fit.components.COMPONENTS.clear()
    fit.components.COMPONENTS.update(components)
    for name in run.modules:
      sys.modules.pop(name, None)


def test_blocks_are_found():
  kinds = [lang for lang, _ in blocks()]
  assert kinds.count('python') >= 6 and kinds.count('yaml') >= 4 and kinds.count('bash') >= 4, kinds
  assert set(kinds) <= {'python', 'yaml', 'bash'}, kinds


def test_every_block_runs(doc_run):
  for i, (lang, src) in enumerate(blocks()):
    try:
      if lang == 'python':
        doc_run.python(src)
      elif lang == 'yaml':
        doc_run.yaml(src)
      else:
        for line in src.splitlines():
          if line.strip() and not line.lstrip().startswith('#'):
            doc_run.command(line)
    except Exception as e:
      raise AssertionError(
        f'{DOC.name}: code block {i + 1} ({lang}, {src.splitlines()[0]!r}) fails: {type(e).__name__}: {e}'
      ) from e
  assert {'recent', 'bm25_recent', 'cfsr_recent'} <= set(registry.OPERATORS)
  assert 'lenweights' in fit.components.COMPONENTS


@pytest.mark.slow
def test_bench_commands(doc_run):
  from experiments.bench import cli as bench

  for lang, src in blocks():
    if lang == 'python':
      doc_run.python(src)
  lines = [
    line
    for lang, src in blocks()
    if lang == 'bash'
    for line in src.splitlines()
    if line.startswith('python -m experiments.bench')
  ]
  assert lines
  for line in lines:
    rows = bench.main(shlex.split(line)[3:])
    assert rows, line
