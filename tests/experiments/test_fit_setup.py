"""One builder of fits from the config (experiments.lib.fit_setup): every fit.* setting is read by it or by
experiments.fit, each one it reads changes what it builds, its defaults are the library's, and no entry point or
research script builds a fit by hand (so none can drop a setting)."""

import ast
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from engram_jax import fit
from engram_jax.fit.config import FitConfig
from experiments.lib import common, fit_setup

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / 'conf')
PIPE = 'rrf_cos_bm25_cfsr'


def _plan(*overrides):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='fit', overrides=[f'pipeline=[{PIPE}]', *overrides])
  return fit_setup.build(cfg, common.hand_set_pipeline(PIPE, cfg.pipeline[PIPE]), PIPE)


def _fingerprint(plan):
  """What a plan decides, comparable: the problem, the loop's settings, the components, one optimizer update."""
  params = {'x': jnp.ones(3)}
  updates, _ = plan.optimizer.update({'x': jnp.full(3, 0.5)}, plan.optimizer.init(params), params)
  return (
    plan.problem,
    plan.steps,
    plan.batch_size,
    plan.seed,
    plan.anneal,
    plan.check_twins,
    plan.check_twins_questions,
    tuple(plan.components.items()),
    tuple((k, tuple(sorted(v.items()))) for k, v in plan.nodes.items()),
    tuple(plan.declared.items()),
    tuple((label, p.settings, c) for label, (p, c) in plan.variants().items()),
    plan.check_components,
    tuple(np.asarray(updates['x']).tolist()),
  )


# fit.* keys experiments.fit reads from the typed settings itself (which questions are scored and against what, the
# components' modules and reports); every other key changes the plan (CHANGES below)
ELSEWHERE = ('split', 'train', 'folds', 'n_test', 'gap_checks', 'baselines', 'final', 'component_modules', 'reports')


def test_every_fit_setting_is_read_somewhere():
  """The typed settings hold every key of conf/fit/default.yaml and no other (their components' nodes aside), and
  each key either changes the plan or is one experiments.fit reads itself."""
  keys = set(OmegaConf.load(ROOT / 'conf' / 'fit' / 'default.yaml'))
  typed = set(FitConfig.keys())
  assert keys - set(fit_setup.component_keys()) == typed
  assert set(CHANGES) | set(ELSEWHERE) == typed and not set(CHANGES) & set(ELSEWHERE)


CHANGES = {
  'params': 'fit.params=[legs.cos.weight,k0]',
  'params_by_pipeline': f'fit.params_by_pipeline.{PIPE}=[k0]',
  'seed': 'fit.seed=1',
  'steps': 'fit.steps=7',
  'batch_size': 'fit.batch_size=3',
  'optimizer': 'fit.optimizer.learning_rate.init_value=0.3',
  'temperatures': 'fit.temperatures.rank=0.3',
  'anneal': 'fit.anneal=[1.0,0.5]',
  'check_twins': 'fit.check_twins=false',
  'check_twins_questions': 'fit.check_twins_questions=7',
  'greedy_pool': 'fit.greedy_pool=50',
  'candidates': 'fit.candidates=3',
  'solve_batch': 'fit.solve_batch=2',
  'cfsr_grad': 'fit.cfsr_grad=implicit',
  'variants': '+fit.variants.both=[adapter,conditioned]',
  'check_components': 'fit.check_components=false',
}
# each built-in component's config node (fit.<name>), set
COMPONENT_CHANGES = {
  'conditioned': 'fit.conditioned={knobs: [k0], features: [cues], hidden: 0, rank: 2, net_lr_scale: 0.1}',
  'adapter': 'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit}',
}
# settings that act only beside others: the base they are changed from
BASE = {'variants': [COMPONENT_CHANGES['adapter'], COMPONENT_CHANGES['conditioned']]}


@pytest.mark.parametrize('key', sorted(CHANGES))
def test_each_setting_read_changes_the_plan(key):
  extra = ['fit.params=null'] if key == 'params_by_pipeline' else []  # params_by_pipeline is read without params
  extra += BASE.get(key, [])
  base = _fingerprint(_plan(*extra))
  changed = _fingerprint(_plan(*extra, CHANGES[key]))
  assert changed != base, key


@pytest.mark.parametrize('name', sorted(COMPONENT_CHANGES))
def test_each_component_node_changes_the_plan(name):
  assert set(COMPONENT_CHANGES) == set(fit_setup.component_keys())  # every registered built-in component
  assert _fingerprint(_plan(COMPONENT_CHANGES[name])) != _fingerprint(_plan())


def test_defaults_are_the_library_defaults():
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='fit')
  config = fit_setup.read(cfg).config
  assert config.temperatures == fit.Temperatures()
  assert config.settings == fit.Settings()


def _calls(path: Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Call):
      f = node.func
      if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        names.add(f'{f.value.id}.{f.attr}')
  return names


def test_no_script_builds_a_fit_by_hand():
  """Every fit goes through fit_setup.build (the problem) and fit_setup.crossfit / fit_rows (the loop)."""
  by_hand = {'fit.make_problem', 'fit.fit', 'fit.crossfit', 'fit.Settings', 'fit.Temperatures'}
  users = []
  for path in sorted((ROOT / 'experiments').rglob('*.py')):
    if path.name == 'fit_setup.py' or path.relative_to(ROOT).as_posix() == 'experiments/bench/device.py':
      continue  # device.py times one jitted step of a fixed problem at the default Settings (it fits nothing)
    calls = _calls(path)
    assert not calls & by_hand, (path, calls & by_hand)
    if calls & {'fit_setup.fit_rows', 'fit_setup.crossfit'}:
      assert 'fit_setup.build' in calls or 'fit_setup.rows' in calls or path.name == 'fit.py', path
      users.append(path.name)
  assert {'search_compare.py', 'search_budget.py'} <= set(users)


def test_unknown_fit_and_adapter_keys_are_refused():
  from experiments.lib import checks

  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='fit', overrides=['+fit.variant={x: [adapter]}'])
  with pytest.raises(ValueError, match=r'unknown option fit.variant \(did you mean fit.variants\?\)'):
    checks.check_fit(cfg)
  with pytest.raises(ValueError, match=r"fit.adapter: unknown keys \['soft_querylegs'\]"):
    _plan('fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit, soft_querylegs: true}')


def test_bad_component_values_are_refused_naming_their_key():
  """A typo in a component's own setting names that component's key (not ``fit.cfsr_grad``); a string for a bool,
  a fraction for an int and a string for a list are refused, not coerced."""
  from engram_jax.core.errors import EngramError

  adapter = '+fit.variants.adapter=[adapter]'
  with pytest.raises(EngramError, match=r"^fit.adapter: cfsr_grad must be one of \['forward', 'reverse', 'implicit'\]"):
    _plan('fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implict}', adapter)
  with pytest.raises(EngramError, match=r"^fit.adapter.train_gap: expected true or false, got 'no'$"):
    _plan("fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit, train_gap: 'no'}", adapter)
  with pytest.raises(EngramError, match=r'^fit.adapter.rank: expected an integer, got 2.5$'):
    _plan('fit.adapter={rank: 2.5, lr_scale: 0.1, cfsr_grad: implicit}', adapter)
  cond = 'fit.conditioned={knobs: k0, features: [cues], hidden: 0, rank: 2, net_lr_scale: 0.1}'
  with pytest.raises(EngramError, match=r"^fit.conditioned.knobs: expected a list, got 'k0'$"):
    _plan(cond, '+fit.variants.conditioned=[conditioned]')


@pytest.mark.parametrize('label', ['my-variant', '2nd'])
def test_variant_labels_that_are_not_plain_names_are_refused(label):
  from engram_jax.core.errors import EngramError

  with pytest.raises(EngramError, match=rf'^fit.variants.{label}: a variant label is a plain name'):
    with initialize_config_dir(config_dir=CONF, version_base='1.3'):
      cfg = compose(
        config_name='fit', overrides=[f'pipeline=[{PIPE}]', 'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit}']
      )
    cfg.fit.variants = {label: ['adapter']}  # (Hydra's override grammar cannot spell '2nd' as a key)
    fit_setup.build(cfg, common.hand_set_pipeline(PIPE, cfg.pipeline[PIPE]), PIPE)


def test_variants_sit_under_their_own_key_in_results_json():
  """Issue 50 item 6: results.json keeps the variants' sections under ``variants`` (before, at its top level beside
  its own keys, so that a label such as ``summary`` had to be refused to keep it from overwriting them)."""
  tree = ast.parse((ROOT / 'experiments' / 'fit.py').read_text())
  make = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == 'make_results')
  out = next(n.value for n in ast.walk(make) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict))
  assert None not in out.keys and 'variants' in {k.value for k in out.keys if isinstance(k, ast.Constant)}
  assert fit_setup.variants_of  # a label is only a plain name now: 'summary' is a variant like any other


def test_a_module_registering_a_taken_name_is_one_line(tmp_path, monkeypatch):
  from engram_jax.core.errors import EngramError

  (tmp_path / 'mypkg_taken44.py').write_text(
    'from engram_jax.fit import register_component\n'
    'from engram_jax.fit.adapter import Adapter\n\n\n'
    '@register_component\nclass MyAdapter(Adapter):\n  pass\n'
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='fit', overrides=['fit.component_modules=[mypkg_taken44]'])
  with pytest.raises(EngramError, match=r"^fit.component_modules: 'mypkg_taken44': component 'adapter' is already"):
    fit_setup.import_component_modules(cfg.fit.component_modules)


def test_an_earlier_fits_loss_curves_are_cleared(tmp_path):
  """A rerun into a used folder removes every loss curve there, also of variants it does not declare."""
  from engram_jax.core import runfolder
  from experiments import fit as fit_exp

  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    cfg = compose(config_name='fit', overrides=[f'pipeline=[{PIPE}]'])
  for name in ('loss_curve_combined.json', 'loss_curve_fitted.json', 'notes.txt'):
    (tmp_path / name).write_text('{}')
  runfolder.begin(tmp_path, fit_exp.outputs(fit_setup.read(cfg)) + fit_exp.stale_outputs(tmp_path))
  assert sorted(p.name for p in tmp_path.iterdir()) == ['notes.txt']
