"""The run's typed evaluation settings (engram_jax.eval.config.EvalConfig): conf/eval/default.yaml reads into them
with every key known and the defaults they declare, and each bad value is one line naming ``eval.<key>`` (issue 50
item 6)."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from engram_jax.core.errors import EngramError
from engram_jax.eval.config import EvalConfig

ROOT = Path(__file__).resolve().parents[2]


def _default_node() -> dict:
  node = OmegaConf.load(ROOT / 'conf' / 'eval' / 'default.yaml')
  node.k, node.metrics = 10, ['ndcg@10', 'recall@10']  # interpolations into the dataset node, outside a composed run
  return OmegaConf.to_container(node, resolve=True)


def test_the_default_node_reads_with_every_key_known():
  node = _default_node()
  assert set(node) == set(EvalConfig.keys())
  ec = EvalConfig.from_mapping(node)
  assert ec == EvalConfig(metrics=('ndcg@10', 'recall@10'))  # the dataclass's defaults are the YAML's
  with pytest.raises(AttributeError):
    ec.k = 5


BAD = [
  ({'k': 0}, r'^eval.k must be an integer >= 1, got 0'),
  ({'k': '10'}, r"^eval.k must be an integer >= 1, got '10'"),
  ({'n_resamples': 10}, r'eval.n_resamples'),
  ({'metrics': 'ndcg@10'}, r"^eval.metrics must be a list of metric names, got the string 'ndcg@10'"),
  ({'baselines': 'cosine'}, r"^eval.baselines must be auto or a list of pipelines, got 'cosine'"),
  ({'progress': 'no'}, r"^eval.progress must be true or false, got 'no'"),
  ({'devices': 0}, r'^eval.devices must be null \(all devices\) or an integer >= 1, got 0'),
  ({'cpu_devices': 'all'}, r"^eval.cpu_devices must be 'cores' or an integer >= 1, got 'all'"),
  ({'leg_cache_mb': -1}, r'^eval.leg_cache_mb must be an integer >= 0 \(0: no cache\), got -1'),
  ({'grid_max_points': 0}, r'^eval.grid_max_points must be an integer >= 1, got 0'),
  ({'nresamples': 100}, r'^unknown option eval.nresamples \(did you mean eval.n_resamples\?\)'),
]


@pytest.mark.parametrize('change, message', BAD, ids=[str(sorted(c)) for c, _ in BAD])
def test_each_bad_value_is_one_line_naming_its_key(change, message):
  with pytest.raises(EngramError, match=message) as e:
    EvalConfig.from_mapping({**_default_node(), **change})
  assert '\n' not in str(e.value)
