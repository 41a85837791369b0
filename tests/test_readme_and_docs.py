"""README.md and docs/: every fenced block is executed or dry-run, generated pages are current, the API reference
covers every public name.

Blocks, by their fence:

* ``python``: executed for real (the README's quickstart).
* ``bash``: every command line (``\\`` continuations joined, ``&&`` chains split, ``# ...`` comments and ``VAR=value``
  prefixes dropped) is dry-run by :func:`check_command`: ``experiments.evaluate`` / ``experiments.fit`` lines (and any
  Hydra app of ``experiments/``) are composed by Hydra as written (a wrong option or a missing ``+`` fails), then
  checked as the entry point checks them before loading data (metrics, loaders, baselines, pipelines; a fit's knobs;
  a protocol refused by the ledger fails unless forced, and a forced one must write to a scratch ledger, not the
  committed one; a reader on a dataset with no answer task fails); a path argument (``fitted=``, a run or sweep
  folder) must exist or be written by an earlier command of the same page (``hydra.run.dir`` / ``hydra.sweep.dir``).
  Other ``python -m`` tools must exist and accept each ``--flag`` given; ``python -c`` code must compile; ``pip``
  extras must exist in ``pyproject.toml``. Short runs (``embedder=hashing`` on one conversation) also run for real in
  ``test_short_commands_run``.
* ``yaml``: parsed; ``text``: printed output, checked against the committed run it shows where it is a results table.

``docs/extending.md`` is executed by ``tests/experiments/test_docs.py`` (operators, YAML, commands) and is left out here.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from experiments import docs_site
from experiments.lib import checks, common, protocol

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / 'conf'
PAGES = [ROOT / 'README.md'] + sorted(p for p in (ROOT / 'docs').glob('*.md') if p.name != 'extending.md')
FENCE = re.compile(r'^```(\w*)\n(.*?)^```', re.S | re.M)
HYDRA_APPS = {'experiments.evaluate': 'config', 'experiments.fit': 'fit'}
ALLOWED_PROGRAMS = {'mkdir', 'cd', 'bash', 'git', 'cmp'}
PLACEHOLDER = re.compile(r'^[A-Z][A-Z_]*(/.*)?$')  # RUN_DIR, SWEEP_DIR, RUN/results.json: the reader's own path


def blocks(page: Path) -> list[tuple[str, str]]:
  """(fence language, body) of every fenced block of ``page``."""
  return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text())]


def command_lines(src: str) -> list[list[str]]:
  """The commands of a bash block as argv lists: continuations joined, comments dropped, ``&&`` chains split."""
  out = []
  for line in src.replace('\\\n', ' ').splitlines():
    argv = shlex.split(line, comments=True)
    cmd: list[str] = []
    for tok in argv + ['&&']:
      if tok == '&&':
        if cmd:
          out.append(cmd)
        cmd = []
      else:
        cmd.append(tok)
  return out


def _strip_env(argv: list[str]) -> list[str]:
  while argv and re.fullmatch(r'[A-Z_][A-Z0-9_]*=.*', argv[0]):
    argv = argv[1:]
  return argv


def _first_of_sweeps(args: list[str]) -> list[str]:
  """A multirun's overrides with every sweep reduced to its first value (the first job)."""
  parsed = OverridesParser.create().parse_overrides(args)
  out = []
  for arg, o in zip(args, parsed):
    out.append(f'{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}' if o.is_sweep_override() else arg)
  return out


@dataclass
class Page:
  """Dry-run state of one page: the folders its commands write (so later commands may read them)."""

  name: str
  written: list[str] = field(default_factory=list)
  counts: dict[str, int] = field(default_factory=dict)

  def note(self, kind: str) -> None:
    self.counts[kind] = self.counts.get(kind, 0) + 1

  def check_path(self, path: str, what: str) -> None:
    if PLACEHOLDER.match(path) or (ROOT / path).exists() or Path(path).is_absolute() and Path(path).exists():
      return
    if any(path == w or path.startswith(w.rstrip('/') + '/') for w in self.written):
      return
    raise AssertionError(f'{what} {path!r}: no such path, and no earlier command on {self.name} writes it')


def hydra_config(config_name: str, args: list[str]):
  with initialize_config_dir(config_dir=str(CONF), version_base='1.3'):
    cfg = compose(config_name=config_name, overrides=args, return_hydra_config=True)
    if cfg.get('protocol_name'):
      fixed = protocol.fixed_config(str(cfg.protocol_name), config_name)
    else:
      fixed = None
  return cfg, fixed


def check_hydra_app(page: Page, module: str, args: list[str]) -> None:
  """Compose ``module``'s Hydra config with ``args`` and check it as the entry point does before loading data."""
  flags = [a for a in args if a.startswith('-')]
  assert set(flags) <= {'-m', '--multirun'}, f'{module}: flags {flags} are not dry-run here'
  args = [a for a in args if not a.startswith('-')]
  if flags:
    args = _first_of_sweeps(args)
  config_name = HYDRA_APPS.get(module) or _hydra_config_name(module)
  cfg, fixed = hydra_config(config_name, args)
  for key in ('run', 'sweep'):
    page.written.append(str(cfg.hydra[key].dir))
  OmegaConf.set_struct(cfg, False)
  cfg.pop('hydra')
  for arg in args:
    key, _, value = arg.lstrip('+~').partition('=')
    if key == 'fitted':
      page.check_path(value, 'fitted=')
      if not (ROOT / value).exists():  # written by an earlier command of the page: not read in a dry run
        cfg.fitted = None
  if module == 'experiments.evaluate':
    checks.check_evaluate(cfg)
    pipes, _ = common.build_pipelines(cfg)
    assert pipes
    reader = cfg.get('reader') or {}
    if reader.get('name') not in (None, 'none'):
      for name, ds in checks.datasets_of(cfg).items():
        assert ds.get('answer') is not None, f'reader={reader.get("name")}: dataset {name} declares no answer task'
  elif module == 'experiments.fit':
    checks.check_fit(cfg)
    if cfg.get('protocol_name'):
      info = protocol.check(cfg, fixed=fixed)
      if info['forced']:
        ledger = Path(str(cfg.get('protocol_ledger') or protocol.LEDGER))
        assert ledger.resolve() != protocol.LEDGER.resolve(), 'a forced protocol run must write to a scratch ledger'


def _hydra_config_name(module: str) -> str:
  src = Path(importlib.util.find_spec(module).origin).read_text()
  m = re.search(r"@hydra\.main\([^)]*config_name='(\w+)'", src)
  assert m, f'{module} is not a Hydra app'
  return m.group(1)


def check_tool(page: Page, module: str, args: list[str]) -> None:
  """A non-Hydra ``python -m`` tool: it exists, takes each ``--flag`` given, and its path arguments exist."""
  spec = importlib.util.find_spec(module)
  assert spec is not None, f'python -m {module}: no such module'
  origin = Path(spec.origin)
  if origin.name == '__init__.py' and (origin.parent / '__main__.py').exists():
    origin = origin.parent / '__main__.py'
  src = origin.read_text()
  if '@hydra.main' in src:
    return check_hydra_app(page, module, args)
  package = origin.parent
  sources = (
    src + ''.join(p.read_text() for p in package.glob('*.py')) if module.startswith('experiments.bench') else src
  )
  for a in args:
    if a.startswith('--'):
      flag = a.split('=', 1)[0]
      assert f"'{flag}'" in sources or f'"{flag}"' in sources, f'python -m {module}: no option {flag}'
  if module in ('experiments.collect', 'experiments.research.plateau', 'experiments.research.boundary_table'):
    if args and not args[0].startswith('-') and '=' not in args[0]:
      page.check_path(args[0], f'{module} folder')


def check_pip(argv: list[str]) -> None:
  extras = yaml.safe_load('{}') or {}
  import tomllib

  extras = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']
  for i, a in enumerate(argv):
    m = re.fullmatch(r'\.\[([\w,-]+)\]', a)
    if m:
      missing = [e for e in m.group(1).split(',') if e not in extras]
      assert not missing, f'pip: no extra {missing} in pyproject.toml'
    if a in ('-c', '-r'):
      assert (ROOT / argv[i + 1]).exists(), f'pip {a} {argv[i + 1]}: no such file'


def check_command(page: Page, argv: list[str]) -> str:
  """Dry-run one command; returns its kind (for the counts)."""
  argv = _strip_env(argv)
  assert argv and argv[0] != '...', f'an incomplete command: {argv}'
  prog = argv[0].removeprefix('.venv/bin/')
  if prog in ('python', 'python3'):
    rest = argv[1:]
    if rest[:2] == ['-m', 'venv']:
      return 'venv'
    if rest[:2] == ['-X', 'importtime']:
      rest = rest[2:]
    if rest[:1] == ['-c']:
      compile(rest[1], '<python -c>', 'exec')
      return 'python -c'
    assert rest[:1] == ['-m'], f'python without -m or -c: {argv}'
    module, args = rest[1], rest[2:]
    if module in ('pytest', 'mkdocs'):  # mkdocs: run as written by .ci/run itself
      return module
    if module in HYPOTHESIS_FREE_HYDRA:
      check_hydra_app(page, module, args)
      return module
    check_tool(page, module, args)
    return 'python -m (other tools)'
  if prog == 'pip':
    check_pip(argv)
    return 'pip'
  if prog in ('ruff', 'mkdocs'):
    return prog
  assert prog in ALLOWED_PROGRAMS, f'a command this test cannot check: {argv}'
  return prog


HYPOTHESIS_FREE_HYDRA = tuple(HYDRA_APPS)


def run_page(page_path: Path) -> Page:
  page = Page(page_path.name)
  for lang, src in blocks(page_path):
    if lang == 'bash':
      for argv in command_lines(src):
        page.note(check_command(page, argv))
    elif lang == 'yaml':
      yaml.safe_load(src)
      page.note('yaml')
    elif lang in ('text', 'python'):
      page.note(lang)  # checked by their own tests below
    else:
      raise AssertionError(f'{page.name}: a block fenced {lang!r} (use bash, python, yaml or text)')
  return page


# -------------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize('page_path', PAGES, ids=[p.name for p in PAGES])
def test_every_command_block_dry_runs(page_path):
  page = run_page(page_path)
  print(page.name, page.counts)  # the counts of the must-show list (pytest -s)


# conf/protocol/ is left out: a protocol file's comment names its one confirmation run, refused once scored (and an
# edit would change the file the ledger hashed).
CONF_COMMENTS = sorted(p for p in CONF.glob('**/*.yaml') if 'protocol' not in p.relative_to(CONF).parts)


def test_commands_in_config_comments_dry_run():
  """The usage lines in conf/ comments (``#   python -m experiments.evaluate experiment=cfsr_table``) compose too."""
  page, n = Page('conf comments'), 0
  for path in CONF_COMMENTS:
    for line in path.read_text().splitlines():
      m = re.match(r'#\s+(python -m experiments\.(evaluate|fit) .*)$', line)
      ray = 'hydra/launcher=ray' in line and importlib.util.find_spec('hydra_plugins.hydra_ray_launcher') is None
      if m and not ray and '...' not in m.group(1) and not re.search(r'=[A-Z]+\b', m.group(1)):
        for argv in command_lines(m.group(1)):
          try:
            check_command(page, argv)
          except Exception as e:
            raise AssertionError(f'{path.relative_to(ROOT)}: {m.group(1)!r}: {e}') from e
          n += 1
  assert n >= 3, n


def test_planted_wrong_option_fails(tmp_path):
  """The dry run is not a no-op: a wrong option, a missing `+`, a refused protocol, a missing path each fail."""
  bad = [
    'python -m experiments.evaluate pipeline=[cosine] eval.nonexistent_option=3',
    'python -m experiments.evaluate embedder.encoder.device=cuda',
    'python -m experiments.fit +protocol=locomo_full',
    'python -m experiments.fit +protocol=locomo_full protocol_force=true',
    'python -m experiments.evaluate experiment=no_such_table',
    'python -m experiments.evaluate +experiment=cfsr_table',
    '... ++pipeline.rrf_cos_bm25_cfsr.legs.cfsr.lam=0.001,0.002',
    "python -m experiments.evaluate 'pipeline=[rrf_cos_bm25_cfsr]' fitted=outputs/nowhere/fitted.json",
    'python -m experiments.evaluate dataset=longmemeval_s reader=smollm2',
    'python -m experiments.search_compare --compare',
    'python -m experiments.bench --no-such-flag',
    "pip install -e '.[no_such_extra]'",
  ]
  for line in bad:
    (argv,) = command_lines(line)
    with pytest.raises(Exception):
      check_command(Page('planted'), argv)
  good = 'python -m experiments.evaluate +embedder.encoder.device=cuda'
  check_command(Page('planted'), command_lines(good)[0])


def test_readme_commands_and_length():
  text = (ROOT / 'README.md').read_text()
  assert len(text.splitlines()) <= 200
  first = [src.strip() for lang, src in blocks(ROOT / 'README.md') if lang == 'bash'][:2]
  assert first[0] == (
    "python3 -m venv .venv && .venv/bin/pip install -c requirements/lock.txt -e '.[embed,experiments,openvino]' "
    '&& .venv/bin/python -m experiments.evaluate'
  )
  ci = (ROOT / '.ci' / 'run').read_text()
  ci_cmd = ' '.join(ci[ci.index('python3 -m venv') :].replace('\\\n', ' ').split())
  assert first[1] == ci_cmd, "the README test command must be .ci/run's, copied exactly"
  assert 'python -m mkdocs build --strict' in ci_cmd


def test_readme_python_runs():
  (src,) = [src for lang, src in blocks(ROOT / 'README.md') if lang == 'python']
  exec(compile(src, 'README.md [python]', 'exec'), {'__name__': 'readme'})


def test_printed_tables_are_the_committed_runs():
  """A ``text`` block that shows a results table carries the committed run's numbers (docs/runs)."""
  summaries = docs_site.load_summaries()
  shown = 0
  for page in PAGES:
    for lang, src in blocks(page):
      if lang != 'text' or '| pipeline |' not in src:
        continue
      m = re.search(r'### (\w+): (\d+) questions', src)
      (name,) = [n for n, s in summaries.items() if m.group(1) in s['datasets'] and not s.get('command', '').count('=')]
      block = summaries[name]['datasets'][m.group(1)]
      assert int(m.group(2)) == block['n_questions']
      for pipe, row in block['rows'].items():
        cells = ' | '.join(f'{v[0]:.4f} [{v[1]:.4f}, {v[2]:.4f}]' for v in row.values())
        assert f'| {pipe} | {cells} |' in src, f'{page.name}: the printed row {pipe} differs from docs/runs/{name}.json'
      shown += 1
  assert shown >= 1


def test_generated_pages_are_current():
  """docs/api, docs/results.md, docs/reproduce.md and the README's headline are what the generator writes."""
  for fname, text in docs_site.api_pages().items():
    assert (ROOT / 'docs' / 'api' / fname).read_text() == text, (
      f'docs/api/{fname} is stale: run python -m experiments.docs_site api'
    )
  summaries, ledger = docs_site.load_summaries(), docs_site.load_ledger()
  stale = 'is stale: run python -m experiments.docs_site results'
  assert (ROOT / 'docs' / 'results.md').read_text() == docs_site.results_page(summaries, ledger), f'results.md {stale}'
  assert (ROOT / 'docs' / 'reproduce.md').read_text() == docs_site.reproduce_page(summaries, ledger), (
    f'reproduce.md {stale}'
  )
  readme = (ROOT / 'README.md').read_text()
  assert docs_site.with_headline(readme, docs_site.headline(summaries, ledger)) == readme, (
    f'the README headline {stale}'
  )


def test_ledger_notes_are_shown_beside_their_rows():
  """A note of conf/protocol/notes.jsonl is printed under its row in results.md and marked in reproduce.md; the
  row's numbers are printed as the ledger holds them."""
  ledger = docs_site.load_ledger()
  noted = [e for e in ledger if e['notes']]
  assert noted, 'conf/protocol/notes.jsonl annotates no row'
  results = docs_site.results_page(docs_site.load_summaries(), ledger)
  for e in noted:
    table = '\n'.join(docs_site.ledger_table(e))
    for n in e['notes']:
      assert f'(note of {n["date"]}): {n["note"]}' in table and table in results
  reproduce = docs_site.reproduce_page(docs_site.load_summaries(), ledger)
  flagged = [e['protocol'] for e in noted if {n['kind'] for n in e['notes']} & {'not_reproduced', 'not_exact'}]
  for name in flagged:
    line = next(l for l in reproduce.splitlines() if l.startswith(f'| `{name}` |'))
    assert 'not reproduced' in line


def test_api_reference_covers_every_public_name():
  """optax's coverage check: a public name of any package's ``__all__`` missing from docs/api fails."""
  pages = {p.name: p.read_text() for p in (ROOT / 'docs' / 'api').glob('*.md')}
  text = '\n'.join(pages.values())
  nav = (ROOT / 'mkdocs.yml').read_text()
  missing = []
  for package in docs_site.PACKAGES:
    module = importlib.import_module(package)
    page = 'index.md' if package == 'engram_jax' else package.rsplit('.', 1)[-1] + '.md'
    assert f'api/{page}' in nav, f'mkdocs.yml does not list docs/api/{page}'
    for name in module.__all__:
      documented = f'{{ #{package}.{name} }}' in pages[page] and f'::: {docs_site.defining_path(package, name)}' in text
      linked = package == 'engram_jax' and f'`engram_jax.{name}`' in pages[page]
      if not (documented or linked):
        missing.append(f'{package}.{name}')
  assert not missing, f'public names missing from the API reference: {missing}'


def test_coverage_check_fails_on_a_missing_name(monkeypatch):
  """Break the reference once: drop one entry from a generated page and the check must name it."""
  real = Path.read_text

  def without_cfsr(self, *a, **k):
    text = real(self, *a, **k)
    return text.replace('{ #engram_jax.ops.cfsr_scores }', '') if self.name == 'ops.md' else text

  monkeypatch.setattr(Path, 'read_text', without_cfsr)
  with pytest.raises(AssertionError, match='engram_jax.ops.cfsr_scores'):
    test_api_reference_covers_every_public_name()


def test_every_page_is_in_the_site():
  nav = (ROOT / 'mkdocs.yml').read_text()
  for page in (ROOT / 'docs').glob('*.md'):
    assert f' {page.name}' in nav, f'docs/{page.name} is not in mkdocs.yml nav'


def test_index_names_every_operator_and_folder():
  """The docs home lists every registered operator and every top-level folder and library subpackage."""
  from engram_jax.ops import registry

  text = (ROOT / 'docs' / 'index.md').read_text()
  missing = [op for op in registry.OPERATORS if f'`{op}`' not in text]
  assert not missing, f'docs/index.md does not name the operators {missing}'
  tracked = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  folders = {p.split('/')[0] for p in tracked if '/' in p and not p.startswith('.')}
  subpackages = {p.split('/')[1] for p in tracked if p.startswith('engram_jax/') and p.count('/') >= 2}
  layout = text[text.index('## Layout') :]
  assert not [f for f in folders if f'{f}/' not in layout], folders
  assert not [s for s in subpackages if f'{s}/' not in layout], subpackages


@pytest.mark.slow
def test_short_commands_run(tmp_path):
  """The README's smoke command runs for real (hashing embedder, one conversation) and writes its table."""
  lines = [
    argv
    for lang, src in blocks(ROOT / 'README.md')
    if lang == 'bash'
    for argv in command_lines(src)
    if 'embedder=hashing' in argv
  ]
  assert lines
  for argv in lines:
    out = tmp_path / 'run'
    argv = [sys.executable] + argv[1:] + [f'hydra.run.dir={out}', 'eval.progress=false']
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert json.loads((out / 'results.json').read_text())['n_questions'] > 0


def test_check_finds_a_changed_number():
  """``docs_site check`` is not a no-op: one changed digit of a committed summary is reported."""
  expected = docs_site.load_summaries()['default']
  fresh = json.loads(json.dumps(expected))
  assert docs_site.compare(expected, fresh) == []
  fresh['datasets']['locomo']['rows']['bm25']['ndcg@10'][0] += 1e-12
  (diff,) = docs_site.compare(expected, fresh)
  assert 'bm25 ndcg@10' in diff


def test_doctests_render_as_examples():
  """The docs build's griffe extension: ``Example:`` and a trailing unheaded doctest become an examples section."""
  pytest.importorskip('griffe')  # the docs extra (installed by .ci/run)
  from experiments.lib.griffe_examples import examples_heading

  assert examples_heading('Sum.\n\nExample:\n  >>> 1 + 1\n  2') == 'Sum.\n\nExamples:\n  >>> 1 + 1\n  2'
  assert examples_heading('Sum.\n\n>>> 1 + 1\n2') == 'Sum.\n\nExamples:\n    >>> 1 + 1\n    2'
  kept = 'Sum.\n\n>>> 1 + 1\n2\n\nMore text.'
  assert examples_heading(kept) == kept
  assert examples_heading('No example.') == 'No example.'
