"""The component registry and contract: the built-in components pass :func:`check_component`; two planted bugs (a
hard half that differs from the soft one, a component that is not the identity at initialisation) are refused in one
line naming the part, the component and the knob; two components on one knob are refused in one line; the artifact's
scoring and the retrieval iterate the registry (no branch on a component's name outside its own module)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import ClassVar

import jax
import pytest

from engram_jax.core.errors import EngramError
from engram_jax.fit import adapter as A
from engram_jax.fit import components as registry
from engram_jax.fit import conditioned as C
from engram_jax.testing.components import check_component
from engram_jax.testing.synthetic import toy_fit_data

ROOT = Path(__file__).resolve().parents[2]
COND = C.Conditioning(knobs=('legs.bm25.weight',), features=('cues', 'pool'), hidden=0, rank=2, net_lr_scale=1.0)
PARAMS = ['legs.bm25.weight', 'k0']


@dataclasses.dataclass(frozen=True)
class HardDiffers(C.Conditioning):
  """Planted bug: its hard half reads no features (the same as the soft half at initialisation only)."""

  name: ClassVar[str] = 'hard_differs'

  def hard_inputs(self, base, n_questions):
    feats, query = super().hard_inputs(base, n_questions)
    return feats * 0.0, query


@dataclasses.dataclass(frozen=True)
class NotIdentity(C.Conditioning):
  """Planted bug: its initial parameters already move the knob."""

  name: ClassVar[str] = 'not_identity'

  def init(self, inputs, seed):
    return jax.tree_util.tree_map(lambda x: x + 0.7, super().init(inputs, seed))


@dataclasses.dataclass(frozen=True)
class StoppedRow(C.Conditioning):
  """Planted bug: its soft half stops the gradient on one row of its kernel (a pool feature every question has)."""

  name: ClassVar[str] = 'stopped_row'

  def apply(self, problem, params, raw, vals, rows, inputs):
    k = params['params']['out']['kernel']
    k = k.at[5].set(jax.lax.stop_gradient(k[5]))
    params = {'params': {'out': {**params['params']['out'], 'kernel': k}}}
    return super().apply(problem, params, raw, vals, rows, inputs)


@dataclasses.dataclass(frozen=True)
class JaxOnly(C.Conditioning):
  """Planted bug: its hard half needs JAX arrays (``.at``), while a loaded artifact hands it NumPy arrays."""

  name: ClassVar[str] = 'jax_only'

  def hard_values(self, problem, params, raw, vals, inputs):
    k = params['params']['out']['kernel']
    params = {'params': {'out': {**params['params']['out'], 'kernel': k.at[0].add(0.0)}}}
    return super().hard_values(problem, params, raw, vals, inputs)


def _spec(cls):
  return cls(**{f.name: getattr(COND, f.name) for f in dataclasses.fields(COND)})


@pytest.mark.parametrize(
  ('component', 'message'),
  [
    (None, None),
    (A.Adapter(rank=2, lr_scale=1.0, soft_query_legs=True), None),
    (
      HardDiffers,
      r"^check_component: soft = hard: component 'hard_differs', knob legs\.bm25\.weight: its soft and hard values "
      r'differ by [0-9.e-]+ at random parameters$',
    ),
    (
      NotIdentity,
      r"^check_component: identity at initialisation: component 'not_identity', knob legs\.bm25\.weight \(episode "
      r'e0\): its initial parameters change the hard scores by [0-9.e-]+$',
    ),
  ],
  ids=['conditioned', 'adapter', 'hard_differs', 'not_identity'],
)
def test_the_contract(component, message):
  _check(component, message)


@pytest.mark.parametrize(
  ('component', 'message'),
  [
    (
      StoppedRow,
      r"^check_component: gradients: component 'stopped_row', parameter \['params'\]\['out'\]\['kernel'\]\[5, 0\]: no "
      r'gradient reaches this entry, yet the soft loss moves with it \([-0-9.e]+ per unit, by finite differences\): a '
      r'stopped gradient$',
    ),
    (
      JaxOnly,
      r"^check_component: hard half: component 'jax_only', as the scorer runs it \(compiled, its parameters NumPy "
      r"arrays as an artifact loads them\): AttributeError: 'numpy.ndarray' object has no attribute 'at'$",
    ),
  ],
  ids=['stopped_row', 'jax_only'],
)
def test_the_contracts_two_closed_holes(component, message):
  """Issue 50 item 4. Before: a gradient stopped on one row of a parameter passed (the whole array's gradient was
  checked), and a hard half that needs JAX arrays passed the contract (which handed it JAX arrays) and crashed a fit
  after six minutes with a 30-line traceback."""
  _check(component, message)


def _check(component, message):
  episodes, _, arrays, pipe = toy_fit_data()
  c = COND if component is None else component if not isinstance(component, type) else _spec(component)
  if message is None:
    check_component(c, pipe, PARAMS, episodes, arrays)
    return
  with registry.registered_component(type(c)), pytest.raises(EngramError) as e:
    check_component(c, pipe, PARAMS, episodes, arrays)
  assert re.match(message, str(e.value)), str(e.value)


def test_two_components_on_one_knob_are_refused_in_one_line():
  with pytest.raises(EngramError, match=r"^components 'conditioned' and 'hard_differs' both condition knob "):
    registry.check_composition([COND, _spec(HardDiffers)])
  registry.check_composition([A.Adapter(rank=2, lr_scale=0.1), COND])  # disjoint: fine


def test_unknown_and_duplicate_registrations():
  with pytest.raises(EngramError, match=r"^unknown component 'nope'; registered: \['adapter', 'conditioned'\]$"):
    registry.get_component('nope')
  with pytest.raises(ValueError, match="component 'adapter' is already registered"):
    registry.register_component(dataclasses.make_dataclass('Other', [], namespace={'name': 'adapter'}))
  with registry.registered_component(HardDiffers):
    assert registry.component_of({'name': 'hard_differs', **dataclasses.asdict(COND)}).name == 'hard_differs'
  assert 'hard_differs' not in registry.COMPONENTS


def test_scoring_iterates_the_registry():
  """The hard scorers (artifact.score, retrieve, components) name no component in code; only its own module does."""
  for path in (
    'engram_jax/fit/artifact.py',
    'engram_jax/fit/apply.py',
    'engram_jax/fit/retrieve.py',
    'engram_jax/fit/components.py',
  ):
    tree = ast.parse((ROOT / path).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, DOCUMENTED) and ast.get_docstring(n)}
    names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs]
    assert not {'adapter', 'conditioned'} & set(names), path


DOCUMENTED = (ast.Module, ast.FunctionDef, ast.ClassDef)


# Where a component's name may appear in code: its own modules (its declaration; the entry point's report of it).
# Config files (conf/) name components too. experiments/research/ is left out: its scripts read the rows of
# particular runs' results by the variant labels those runs declared.
OWN = {
  'adapter': ('engram_jax/fit/adapter.py', 'experiments/lib/fit_adapter.py'),
  'conditioned': ('engram_jax/fit/conditioned.py', 'experiments/lib/fit_conditioned.py'),
}
# The functions that iterate the registry (or a fit's components) instead of naming a component; each is exercised
# by test_config_iterates_the_registry below or by the end-to-end fits (tests/fit/test_components.py,
# tests/experiments/test_component_oot.py).
ITERATE = {
  'engram_jax.fit.components': (
    'config_keys',
    'from_config',
    'variant_settings',
    'check_problem',
    'fixed_dimension',
    'check_composition',
    'hard_queries',
    'hard_scores',
    'hard_inputs',
    'score_episodes',
  ),
  'engram_jax.testing.components': ('check_component',),
  'experiments.lib.fit_setup': ('component_keys', 'components_of', 'variants_of', 'check_contract', 'Plan'),
  'experiments.lib.checks': ('check_fit',),
  'experiments.lib.fit_artifact': ('write',),
  'engram_jax.fit.apply': ('check_vectors', 'fused', 'apply', 'rank'),
  'experiments.fit': ('outputs', 'reports', 'fit_variant', 'make_results', 'variant_section', 'write_outputs'),
  'experiments.compare': ('variant_labels',),
}


def _names_in_code(path: Path) -> list[tuple[int, str]]:
  """Every string constant of ``path`` that is not a docstring, with its line."""
  tree = ast.parse(path.read_text())
  docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, DOCUMENTED) and ast.get_docstring(n)}
  return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs]


def test_no_component_name_in_code_outside_its_own_modules():
  """(b) No branch on (no string constant equal to) a registered component's name in the library, the entry points
  or their lib outside that component's own modules: `grep` over the AST (comments and docstrings may name it)."""
  assert set(OWN) == set(registry.COMPONENTS)  # every built-in component has its own modules listed
  files = sorted((ROOT / 'engram_jax').rglob('*.py')) + sorted((ROOT / 'experiments').rglob('*.py'))
  hits = []
  for path in files:
    rel = path.relative_to(ROOT).as_posix()
    if rel.startswith('experiments/research/'):
      continue
    for line, value in _names_in_code(path):
      if value in OWN and rel not in OWN[value]:
        hits.append(f'{rel}:{line}: {value!r}')
  assert hits == []


def test_the_listed_functions_exist():
  import importlib

  for module, names in ITERATE.items():
    m = importlib.import_module(module)
    for name in names:
      assert callable(getattr(m, name)), f'{module}.{name}'


@dataclasses.dataclass(frozen=True)
class Toy(C.Conditioning):
  """A component registered by a test (as an out-of-tree module would): the conditioned knobs under another name."""

  name: ClassVar[str] = 'toy'


def test_config_iterates_the_registry(tmp_path):
  """A component the entry point never heard of: its config node fit.toy is accepted by the config check, built from
  its declaration (defaults, unknown keys refused), fit in the variant the config declares (components in order,
  on the settings the adapter asks for), and gets its own loss curve; each refusal is one line."""
  from test_fit import small_fit_cfg

  from experiments import fit as fit_exp
  from experiments.lib import checks, common, fit_setup

  toy = '+fit.toy={knobs: [legs.bm25.weight], features: [cues], hidden: 0, rank: 1, net_lr_scale: 0.5}'
  adapter = 'fit.adapter={rank: 2, lr_scale: 0.1, cfsr_grad: implicit, soft_query_legs: true}'
  with registry.registered_component(Toy):
    cfg = small_fit_cfg(tmp_path, toy, adapter, '+fit.variants.mix=[adapter,toy]', 'fit.params=[legs.bm25.weight,k0]')
    run = checks.check_fit(cfg)
    pipe = common.hand_set_pipeline('rrf_cos_bm25', cfg.pipeline.rrf_cos_bm25)
    plan = fit_setup.build(cfg, pipe)
    assert set(fit_setup.component_keys()) == {'adapter', 'conditioned', 'toy'}
    assert plan.components['toy'] == Toy(('legs.bm25.weight',), ('cues',), 0, 1, 0.5)
    variants = plan.variants()
    assert list(variants) == ['fitted', 'adapter', 'mix']
    assert [c.name for c in variants['mix'][1]] == ['adapter', 'toy']
    assert variants['mix'][0].settings.cfsr_grad == 'implicit' and plan.problem.settings.cfsr_grad == 'forward'
    assert 'loss_curve_mix.json' in fit_exp.outputs(run)
    bad = small_fit_cfg(tmp_path, toy[:-1] + ', rnak: 2}', '+fit.variants.toy=[toy]')
    with pytest.raises(EngramError, match=r"^fit.toy: unknown keys \['rnak'\]; allowed \['knobs', "):
      fit_setup.build(bad, pipe)
    unused = small_fit_cfg(tmp_path, toy)
    with pytest.raises(EngramError, match=r"^fit.toy is set but no fit.variants entry lists 'toy'"):
      fit_setup.build(unused, pipe)
  unknown = small_fit_cfg(tmp_path, '+fit.variants.mix=[adapter,nope]')
  with pytest.raises(EngramError, match=r"^unknown component 'nope'; registered: \['adapter', 'conditioned'\]$"):
    fit_setup.build(unknown, pipe)


def test_the_gate_form_declares_why_it_is_not_the_identity():
  """The conditioned gate form starts each knob at half its scalar value by design: it says so in its declaration,
  and the contract checks the rest (soft = hard, gradients)."""
  episodes, _, arrays, pipe = toy_fit_data()
  gate = dataclasses.replace(COND, form='gate', bias=False)
  assert registry.identity_exempt(COND) is None and 'sigmoid(0) = 1/2' in registry.identity_exempt(gate)
  check_component(gate, pipe, PARAMS, episodes, arrays)


def test_the_fit_runs_the_contract_before_step_0():
  """experiments.fit's check before step 0 (fit_setup.check_contract): the contract's refusal in one line, saying
  how to skip it; fit.check_components=false skips it."""
  from engram_jax import fit
  from experiments.lib import fit_setup

  episodes, _, arrays, pipe = toy_fit_data()
  problem, knobs, every = fit.make_problem(pipe, PARAMS)
  plan = fit_setup.Plan('toy', problem, knobs, every, None, 1, 1, 0, (1.0, 1.0), pipe=pipe)
  bad = _spec(HardDiffers)
  with registry.registered_component(HardDiffers):
    with pytest.raises(EngramError) as e:
      fit_setup.check_contract(plan, problem, (COND, bad), episodes, arrays, seed=0)
    assert re.match(
      r"^refusing to fit: check_component: soft = hard: component 'hard_differs', knob legs\.bm25\.weight: .* "
      r'\(fit\.check_components=false skips the contract\)$',
      str(e.value),
    ), str(e.value)
    fit_setup.check_contract(
      dataclasses.replace(plan, check_components=False), problem, (bad,), episodes, arrays, seed=0
    )
