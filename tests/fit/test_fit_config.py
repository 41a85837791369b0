"""The fit's typed settings (engram_jax.fit.config.FitConfig): the plain ``fit`` node of conf/fit/default.yaml reads
into them with the library's defaults, each bad value is one line naming ``fit.<key>``, and the typed settings are
what the plan is built from (issue 50 item 6)."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from engram_jax.core.errors import EngramError
from engram_jax.fit import Settings, Temperatures
from engram_jax.fit.config import FitConfig

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ['adapter', 'conditioned']  # the built-in components (their nodes: fit.<name>)


def _default_node() -> dict:
  node = OmegaConf.load(ROOT / 'conf' / 'fit' / 'default.yaml')
  node.seed = 7  # `${seed}` outside the composed config
  node.optimizer.learning_rate.decay_steps = 60
  return OmegaConf.to_container(node, resolve=True)


def test_the_default_node_reads_into_the_library_defaults():
  fc = FitConfig.from_mapping(_default_node(), COMPONENTS)
  assert fc.temperatures == Temperatures() and fc.settings == Settings()
  assert (fc.split, fc.folds, fc.n_test, fc.seed, fc.steps, fc.batch_size) == ('crossfit', 10, 3, 7, 60, 128)
  assert fc.anneal == (1.0, 1.0) and fc.check_twins and fc.check_components and not fc.final
  assert fc.nodes == {} and dict(fc.variants) == {'conditioned': ['conditioned'], 'adapter': ['adapter']}
  assert fc.params_of('rrf_cos_bm25') == ('legs.cos.weight', 'legs.bm25.weight', 'k0')
  assert fc.baselines == ('rrf_cos_bm25',) and fc.monitor_steps() == [0, 15, 30, 45, 60]
  with pytest.raises(EngramError, match=r'^nothing to fit: set fit.params or fit.params_by_pipeline.cosine'):
    fc.params_of('cosine')


BAD = [
  ({'split': 'kfold'}, r"^fit.split must be one of \['crossfit', 'holdout', 'parts'\], got 'kfold'"),
  ({'folds': 1}, r'^fit.folds must be an integer >= 2 for cross-fitting, got 1'),
  ({'split': 'holdout', 'n_test': 0}, r'^fit.n_test must be an integer >= 1'),
  ({'split': 'parts'}, r'^fit.split=parts fits on fit.train'),
  ({'steps': 2.5}, r'^fit.steps must be an integer >= 1, got 2.5'),
  ({'batch_size': True}, r'^fit.batch_size must be an integer >= 1, got True'),
  ({'solve_batch': 0}, r'^fit.solve_batch must be an integer >= 1 \(or null: every pool at once\)'),
  ({'greedy_pool': 0}, r'^fit.greedy_pool must be an integer >= 1'),
  ({'cfsr_grad': 'backward'}, r"^fit.cfsr_grad must be one of \['forward'"),
  ({'temperatures': {'rank': -1.0}}, r'fit.temperatures'),
  ({'temperatures': {'rnk': 0.5}}, r'^unknown option fit.temperatures.rnk \(did you mean fit.temperatures.rank\?\)'),
  ({'anneal': [1.0]}, r'^fit.anneal must be \[start, end\]'),
  ({'gap_checks': -1}, r'^fit.gap_checks must be an integer >= 0'),
  ({'params': ['k0', 'k0']}, r'^fit.params lists k0 twice'),
  ({'params_by_pipeline': {'p': ['k0', 'k0']}}, r'^fit.params_by_pipeline.p lists k0 twice'),
  ({'check_twins': 'yes'}, r"^fit.check_twins must be true or false, got 'yes'"),
  ({'component_modules': 'mymod'}, r"^fit.component_modules must be a list of names, got 'mymod'"),
  ({'stps': 3}, r'^unknown option fit.stps \(did you mean fit.steps\?\)'),
  ({'adaptor': {'rank': 2}}, r'^unknown option fit.adaptor \(did you mean fit.adapter\?\)'),
]


@pytest.mark.parametrize('change, message', BAD, ids=[str(sorted(c)) for c, _ in BAD])
def test_each_bad_value_is_one_line_naming_its_key(change, message):
  with pytest.raises(EngramError, match=message) as e:
    FitConfig.from_mapping({**_default_node(), **change}, COMPONENTS)
  assert '\n' not in str(e.value)


def test_the_typed_settings_are_frozen_and_hold_no_config_tree():
  fc = FitConfig.from_mapping({**_default_node(), 'adapter': {'rank': 2}}, COMPONENTS)
  with pytest.raises(AttributeError):
    fc.steps = 3
  with pytest.raises(TypeError):
    fc.nodes['adapter']['rank'] = 3  # read-only views: a plan cannot change what the run declared
  leaves = [fc.optimizer, fc.variants, fc.nodes['adapter'], fc.params_by_pipeline]
  assert not any(type(x).__module__.startswith('omegaconf') for x in leaves)
