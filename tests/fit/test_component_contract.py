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
      r"^check_component: identity at initialisation: component 'not_identity', episode e0: its initial parameters "
      r'change the hard scores by [0-9.e-]+$',
    ),
  ],
  ids=['conditioned', 'adapter', 'hard_differs', 'not_identity'],
)
def test_the_contract(component, message):
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
  for path in ('engram_jax/fit/artifact.py', 'engram_jax/fit/retrieve.py', 'engram_jax/fit/components.py'):
    tree = ast.parse((ROOT / path).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, DOCUMENTED) and ast.get_docstring(n)}
    names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs]
    assert not {'adapter', 'conditioned'} & set(names), path


DOCUMENTED = (ast.Module, ast.FunctionDef, ast.ClassDef)
