"""hydra_plugins.engram_sweeper (hydra/sweeper=shapes): jobs that differ only in config values share one composition shape; a group choice,
an added or removed key makes another shape. (The end-to-end check that the shapes sweeper gives every job the
configuration and results of the stock sweeper is in test_collect.py, slow tier.)"""

from hydra_plugins.engram_sweeper import shapes_sweeper as sweeper

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


def test_the_sweeper_composes_one_job_per_shape():
  """validate_batch_is_legal composes once per shape (here 2 of 4 jobs); the shapes are hashable (list values)."""
  calls = []

  class Repo:
    def group_exists(self, key):
      return key in GROUPS

  class Loader:
    repository = Repo()

    def load_sweep_config(self, master_config, sweep_overrides):
      calls.append(sweep_overrides)

  sw = sweeper.ShapeValidatingSweeper(max_batch_size=None)
  sw.hydra_context, sw.config = type('Ctx', (), {'config_loader': Loader()})(), None
  batch = [['pipeline=[rrf,cosine]', f'++pipeline.rrf.k0={k}'] for k in (20, 40, 60)] + [['pipeline=[bm25]', '++pipeline.rrf.k0=20']]
  sw.validate_batch_is_legal(batch)
  assert calls == [batch[0], batch[3]]
  assert len({shape(b) for b in batch}) == 2
