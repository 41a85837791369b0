"""experiments.lib.yamlfmt.to_yaml is OmegaConf.to_yaml byte for byte (libyaml's emitter with OmegaConf's
representers): random trees, awkward strings, interpolations resolved or not, and the project's own composed
configurations with their ``hydra`` node (what a sweep job writes to ``.hydra/`` and ``config_resolved.yaml``)."""

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from experiments.lib import yamlfmt

AWKWARD = [
  'true',
  'False',
  'yes',
  'off',
  'null',
  '~',
  '1',
  '-2',
  '1e3',
  '0x1f',
  '.inf',
  '-.nan',
  '1_000',
  '',
  ' ',
  ' lead',
  'trail ',
  'a: b',
  '- x',
  '#c',
  'a #b',
  "it's",
  '"q"',
  'caf\u00e9 \u2713',
  'line\nbreak',
  'tab\there',
  'x' * 200,
  ' '.join(['word'] * 40),
  '\u00a0nbsp',
  '?',
  '!tag',
  '&a',
  '*a',
  '%',
  '@',
  '`',
  '{a: 1}',
  '[1]',
  '2026-12-01',
  '12:30',
  '0o17',
  '+1',
  'NaN',
  '\\',
  '\U00010000',
  'x\x85y',
  'a\u2028b',
  '\ufeff',
  '\x00',
  '\x7f',
  'k' * 100,
  'k' * 101,
  'k' * 122,
  'k' * 123,
  'k' * 128,
  '\u00e9' * 50,
  '\u00e9' * 51,
  '\u00e9' * 64,
]
TEXT = st.text(alphabet=st.characters(blacklist_characters='$', blacklist_categories=('Cs',)), max_size=30)
SCALARS = (
  st.none()
  | st.booleans()
  | st.integers(-(10**12), 10**12)
  | st.floats(allow_nan=True)
  | TEXT
  | st.sampled_from(AWKWARD)
)
KEYS = TEXT | st.sampled_from(AWKWARD)
TREES = st.dictionaries(
  KEYS,
  st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=25
  ),
  max_size=6,
)


@pytest.fixture(autouse=True)
def _libyaml():
  if yamlfmt.c_dumper() is None:
    pytest.skip('PyYAML without libyaml: to_yaml is OmegaConf.to_yaml itself')


@given(TREES)
def test_random_trees_equal_omegaconf(tree):
  cfg = OmegaConf.create(tree)
  assert yamlfmt.to_yaml(cfg) == OmegaConf.to_yaml(cfg)


def test_awkward_strings_interpolations_and_lists():
  cfg = OmegaConf.create(
    {
      's': AWKWARD,
      'keys': {k: k for k in AWKWARD},
      'f': [float('inf'), float('-inf'), 1e-7, 0.1],
      'empty': {'d': {}, 'l': []},
      'a': 3,
      'b': '${a}',
      'c': 'x${a}y',
      'd': '${oc.env:HOME,none}',
    }
  )
  for resolve in (False, True):
    assert yamlfmt.to_yaml(cfg, resolve=resolve) == OmegaConf.to_yaml(cfg, resolve=resolve)
  listcfg = OmegaConf.create([1, 'two', {'three': [3]}])
  assert yamlfmt.to_yaml(listcfg) == OmegaConf.to_yaml(listcfg)


@pytest.mark.parametrize(
  'overrides',
  [['pipeline=[rrf_cos_bm25_cfsr]'], ['experiment=cfsr_table'], ['dataset=longmemeval_s', 'pipeline=[tide_dense]']],
)
def test_the_projects_configurations_equal_omegaconf(overrides):
  """The composed configuration with its hydra node (help templates, logging dicts, enums), the node alone, the
  task part and the task part resolved, as a run writes them."""
  from hydra import compose, initialize_config_dir
  from hydra.core.hydra_config import HydraConfig

  with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / 'conf'), version_base='1.3'):
    cfg = compose('config', overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != 'hydra'])
    for node in (cfg, cfg.hydra, cfg.hydra.overrides.task, task):
      assert yamlfmt.to_yaml(node) == OmegaConf.to_yaml(node)
    assert yamlfmt.to_yaml(task, resolve=True) == OmegaConf.to_yaml(task, resolve=True)
  assert yaml.safe_load(yamlfmt.to_yaml(task)) == OmegaConf.to_container(task)
