"""experiments.lib.sweeper: jobs that differ only in config values share one composition shape; a group choice,
an added or removed key makes another shape. (The end-to-end check that the shapes sweeper gives every job the
configuration and results of the stock sweeper is in test_collect.py, slow tier.)"""

from experiments.lib import sweeper

GROUPS = {'pipeline', 'dataset', 'hydra/launcher'}


def shape(overrides):
  return sweeper.composition_shape(overrides, lambda key: key in GROUPS)


def test_value_only_overrides_share_a_shape():
  a = shape(['pipeline=[rrf]', '++pipeline.rrf.k0=20', 'eval.k=5'])
  b = shape(['eval.k=10', 'pipeline=[rrf]', '++pipeline.rrf.k0=60'])  # order does not matter
  assert a == b


def test_group_choices_and_keys_make_other_shapes():
  base = shape(['pipeline=[rrf]', '++pipeline.rrf.k0=20'])
  assert shape(['pipeline=[cosine]', '++pipeline.rrf.k0=20']) != base  # another pipeline file
  assert shape(['pipeline=[rrf]', 'pipeline.rrf.k0=20']) != base  # '=' and '++' can fail differently
  assert shape(['pipeline=[rrf]', '++pipeline.rrf.k0=20', 'dataset=fc_sh_6k']) != base
  assert shape(['pipeline=[rrf]', '++pipeline.rrf.k0=20', 'hydra/launcher=parallel']) != base
  assert shape(['pipeline=[rrf]', '++pipeline.rrf.k0=20', '~eval.k']) != base


def test_the_sweeper_config_names_the_class():
  from pathlib import Path  # pylint: disable=import-outside-toplevel
  import yaml  # pylint: disable=import-outside-toplevel
  conf = yaml.safe_load((Path(__file__).resolve().parents[1] / 'conf/hydra/sweeper/shapes.yaml').read_text())
  module, name = conf['_target_'].rsplit('.', 1)
  assert module == sweeper.__name__ and issubclass(getattr(sweeper, name), sweeper.BasicSweeper)
