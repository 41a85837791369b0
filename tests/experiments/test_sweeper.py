"""hydra_plugins.engram_sweeper (hydra/sweeper=shapes): jobs that differ only in config values share one composition shape; a group choice,
an added or removed key makes another shape. (The end-to-end check that the shapes sweeper gives every job the
configuration and results of the stock sweeper is in test_collect.py, slow tier.)"""

import pytest

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
  from pathlib import Path

  import yaml

  conf = yaml.safe_load((Path(__file__).resolve().parents[2] / 'conf/hydra/sweeper/shapes.yaml').read_text())
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
  batch = [['pipeline=[rrf,cosine]', f'++pipeline.rrf.k0={k}'] for k in (20, 40, 60)] + [
    ['pipeline=[bm25]', '++pipeline.rrf.k0=20']
  ]
  sw.validate_batch_is_legal(batch)
  assert calls == [batch[0], batch[3]]
  assert len({shape(b) for b in batch}) == 2


def _loader_and_master(overrides):
  """Hydra's config loader on conf/ and a multirun master config (as ``-m`` composes it)."""
  from pathlib import Path

  from hydra import initialize_config_dir
  from hydra.core.global_hydra import GlobalHydra
  from hydra.types import RunMode

  ctx = initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / 'conf'), version_base='1.3')
  ctx.__enter__()
  loader = GlobalHydra.instance().config_loader()
  master = loader.load_configuration('config', overrides, RunMode.MULTIRUN)
  return ctx, loader, master


def test_the_launcher_reuses_a_shape_and_its_configs_equal_hydras():
  """Per job, the shape launcher's configuration equals ``load_sweep_config``'s: the whole tree unresolved (values,
  interpolations, the hydra node with its overrides and override_dirname) and the flags; jobs with a dict value or a
  deletion are composed from the files; the resolver cache (``${now:...}``) is the master's."""
  from hydra.types import HydraContext
  from omegaconf import OmegaConf

  from hydra_plugins.engram_sweeper import shapes_launcher

  ctx, loader, master = _loader_and_master(['hydra/launcher=shapes', 'hydra.sweep.dir=/tmp/x'])
  try:
    jobs = [
      ['pipeline=[rrf_cos_bm25]', f'++pipeline.rrf_cos_bm25.k0={k}', f'eval.k={n}', '+extra=1']
      for k, n in ((20, 5), (40.5, 10))
    ]
    jobs += [
      ['pipeline=[cosine]', 'eval.k=5', '+extra=2'],
      [
        'pipeline=[rrf_cos_bm25]',
        'eval.metrics=[ndcg@3,recall@3]',
        'eval.k=3',
        '++pipeline.rrf_cos_bm25.k0=8',
        '+extra=4',
      ],
      ['pipeline=[rrf_cos_bm25]', '++pipeline.rrf_cos_bm25.k0=9', 'eval.k=3', '+extra={a: 1}'],
      ['pipeline=[rrf_cos_bm25]', '++pipeline.rrf_cos_bm25.k0=9', 'eval.k=3', '+extra={b: 2}'],
      ['pipeline=[rrf_cos_bm25]', '++pipeline.rrf_cos_bm25.k0=9', 'eval.k=3', '~eval.metrics'],
    ]
    launcher = shapes_launcher.ShapeComposingLauncher()
    launcher.hydra_context = HydraContext(config_loader=loader, callbacks=None)
    launcher.config = master
    composed = []
    real = loader.load_sweep_config

    def counting(master_config, sweep_overrides):
      composed.append(sweep_overrides)
      return real(master_config, sweep_overrides)

    loader.load_sweep_config = counting
    got = list(launcher.sweep_configs(jobs))
    loader.load_sweep_config = real
    # shapes: 2 rrf jobs (the second reused), cosine, a metrics list (another key set), 2 dict values, 1 deletion
    assert composed == [jobs[0], jobs[2], jobs[3], jobs[4], jobs[5], jobs[6]]
    for job, cfg in zip(jobs, got):
      want = real(master, job)
      assert OmegaConf.to_yaml(cfg) == OmegaConf.to_yaml(want), job
      assert OmegaConf.is_struct(cfg) == OmegaConf.is_struct(want) and not OmegaConf.is_readonly(cfg.hydra)
      assert OmegaConf.to_container(cfg.pipeline, resolve=True) == OmegaConf.to_container(want.pipeline, resolve=True)
    assert got[0].pipeline.rrf_cos_bm25.k0 == 20 and got[1].pipeline.rrf_cos_bm25.k0 == 40.5 and got[1].eval.k == 10
    assert list(got[1].hydra.overrides.task) == jobs[1] and got[0].hydra.overrides.task != got[1].hydra.overrides.task
  finally:
    ctx.__exit__(None, None, None)


def test_the_launcher_freezes_the_heap_while_its_jobs_run_and_then_unfreezes(tmp_path):
  """``gc.freeze`` holds during the jobs (after each job, the objects it left behind too), and the launcher leaves
  the collector as it found it: nothing frozen after the sweep, and no freezing when the collector is off."""
  import gc

  from hydra._internal.callbacks import Callbacks
  from hydra.core.utils import JobStatus
  from hydra.types import HydraContext

  from hydra_plugins.engram_sweeper import shapes_launcher

  ctx, loader, master = _loader_and_master(['hydra/launcher=shapes', f'hydra.sweep.dir={tmp_path}'])
  try:
    kept, seen = [], []

    def task(cfg):
      kept.append(object())  # something the job leaves behind
      seen.append(gc.get_freeze_count())
      return cfg.pipeline.rrf_cos_bm25.k0

    launcher = shapes_launcher.ShapeComposingLauncher()
    launcher.setup(
      hydra_context=HydraContext(config_loader=loader, callbacks=Callbacks()), task_function=task, config=master
    )
    jobs = [['pipeline=[rrf_cos_bm25]', f'++pipeline.rrf_cos_bm25.k0={k}'] for k in (20, 40, 60)]
    assert gc.get_freeze_count() == 0
    runs = launcher.launch(jobs, initial_job_idx=0)
    assert [r.status for r in runs] == [JobStatus.COMPLETED] * 3 and [r.return_value for r in runs] == [20, 40, 60]
    assert seen[0] > 0 and seen[1] > seen[0] and seen[2] > seen[1]
    assert gc.get_freeze_count() == 0
    gc.disable()
    try:
      seen.clear()
      launcher.launch(jobs[:2], initial_job_idx=3)
      assert seen == [0, 0]
    finally:
      gc.enable()
  finally:
    ctx.__exit__(None, None, None)


def test_a_jobs_configuration_is_collected_before_the_heap_is_frozen(tmp_path):
  """What the launcher freezes after a job is what outlives it (its return, the caches it filled), not the job's
  composed configuration: that is cyclic garbage (children point to their parent) which, once frozen, could never be
  collected until the sweep ends. Each job sees the previous job's configuration gone."""
  import weakref

  from hydra._internal.callbacks import Callbacks
  from hydra.core.hydra_config import HydraConfig
  from hydra.types import HydraContext

  from hydra_plugins.engram_sweeper import shapes_launcher

  ctx, loader, master = _loader_and_master(['hydra/launcher=shapes', f'hydra.sweep.dir={tmp_path}'])
  try:
    configs, alive = [], []

    def task(cfg):
      alive.append([ref() is not None for ref in configs])
      configs.append(weakref.ref(HydraConfig.instance().cfg.hydra._get_parent()))
      assert configs[-1]().pipeline.rrf_cos_bm25.k0 == cfg.pipeline.rrf_cos_bm25.k0  # the job's composed config
      return cfg.pipeline.rrf_cos_bm25.k0

    launcher = shapes_launcher.ShapeComposingLauncher()
    launcher.setup(
      hydra_context=HydraContext(config_loader=loader, callbacks=Callbacks()), task_function=task, config=master
    )
    jobs = [['pipeline=[rrf_cos_bm25]', f'++pipeline.rrf_cos_bm25.k0={k}'] for k in (20, 40, 60, 80)]
    runs = launcher.launch(jobs, initial_job_idx=0)
    assert [r.return_value for r in runs] == [20, 40, 60, 80]
    assert alive == [[], [False], [False, False], [False, False, False]]
  finally:
    ctx.__exit__(None, None, None)


class _Recorder:
  """Callbacks stand-in: records what each hook saw."""

  def __init__(self):
    self.calls = []

  def on_job_start(self, config, task_function):
    self.calls.append(('start', config.hydra.job.num, task_function.__name__))

  def on_job_end(self, config, job_return):
    self.calls.append(('end', config.hydra.job.num, job_return.status.name))


@pytest.mark.parametrize('chdir', [False, True])
def test_the_lean_job_runner_equals_hydras_run_job(tmp_path, chdir):
  """lean_job.run_job and hydra.core.utils.run_job on the same job: equal returns (task and hydra configurations as
  YAML, overrides, working directory, status, value, task name), equal ``.hydra`` files, the same HydraConfig seen by
  the task (output_dir set), the environment of ``hydra.job.env_set``, the callbacks in order, and the same state
  after (HydraConfig and working directory restored); a failing task's exception is its return in both."""
  import os

  from hydra.core.hydra_config import HydraConfig
  from hydra.core.utils import JobStatus
  from hydra.core.utils import run_job as hydra_run_job
  from hydra.types import HydraContext
  from omegaconf import OmegaConf, open_dict

  from hydra_plugins.engram_sweeper import lean_job

  overrides = ['hydra/launcher=shapes', f'hydra.job.chdir={str(chdir).lower()}', '+hydra.job.env_set.ENGRAM_T=on']
  results = {}
  for name, runner in (('hydra', hydra_run_job), ('lean', lean_job.run_job)):
    ctx, loader, master = _loader_and_master(overrides + [f'hydra.sweep.dir={tmp_path / name}'])
    try:
      cwd = os.getcwd()
      before = HydraConfig.instance().cfg
      seen = []

      def task(cfg):
        seen.append((OmegaConf.to_yaml(HydraConfig.get()), os.getcwd(), os.environ.get('ENGRAM_T')))
        if cfg.pipeline.rrf_cos_bm25.k0 == 40:
          raise ValueError('a failing job')
        return cfg.pipeline.rrf_cos_bm25.k0

      rec = _Recorder()
      rets = []
      for num, k0 in enumerate((20, 40)):
        cfg = loader.load_sweep_config(master, ['pipeline=[rrf_cos_bm25]', f'++pipeline.rrf_cos_bm25.k0={k0}'])
        with open_dict(cfg):
          cfg.hydra.job.id = cfg.hydra.job.num = num
        rets.append(
          runner(
            task_function=task,
            config=cfg,
            job_dir_key='hydra.sweep.dir',
            job_subdir_key='hydra.sweep.subdir',
            hydra_context=HydraContext(config_loader=loader, callbacks=rec),
          )
        )
      assert os.getcwd() == cwd and HydraConfig.instance().cfg is before
      assert 'ENGRAM_T' not in os.environ
      files = {p.relative_to(tmp_path / name).as_posix(): p.read_text() for p in (tmp_path / name).rglob('*.yaml')}
      summary = [
        (
          OmegaConf.to_yaml(r.cfg),
          OmegaConf.is_struct(r.cfg),
          OmegaConf.to_yaml(r.hydra_cfg),
          r.overrides,
          r.working_dir,
          r.status,
          r.task_name,
        )
        for r in rets
      ]
      results[name] = (summary, seen, rec.calls, files, rets)
    finally:
      ctx.__exit__(None, None, None)
  norm = lambda x: str(x).replace(str(tmp_path / 'hydra'), 'DIR').replace(str(tmp_path / 'lean'), 'DIR')  # noqa: E731
  h, l = results['hydra'], results['lean']
  assert norm(h[0]) == norm(l[0]) and norm(h[1]) == norm(l[1]) and h[2] == l[2]
  assert {k: norm(v) for k, v in h[3].items()} == {k: norm(v) for k, v in l[3].items()} and len(h[3]) == 6
  assert [r.status for r in l[4]] == [JobStatus.COMPLETED, JobStatus.FAILED] and l[4][0].return_value == 20
  assert isinstance(l[4][1]._return_value, ValueError)
  assert h[1][0][2] == 'on' and (h[1][0][1].endswith('/0') if chdir else True)
