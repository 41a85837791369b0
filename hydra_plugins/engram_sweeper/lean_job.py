"""One job of the shape launcher: what ``hydra.core.utils.run_job`` does, with fewer copies of the configuration.

Per job, Hydra's ``run_job`` (1.3) sets the ``HydraConfig`` singleton twice (each a masked deep copy of the
``hydra`` node), deep-copies the whole configuration for the task and the ``hydra`` node for the job's return, and
writes ``.hydra/{config,hydra,overrides}.yaml`` through PyYAML's pure-Python emitter: ~80 ms of a LoCoMo fusion
sweep job whose own work is ~160 ms. :func:`run_job` here takes the same steps in the same order, with the same
callbacks, logging, working directory, environment and return, and differs in three places only:

* ``HydraConfig`` is set once, before the output directory is read (as Hydra's first call), and the output
  directory is then written into both the job's configuration and the singleton's copy (Hydra sets the singleton
  again from the configuration, which gives an equal copy);
* the task's configuration is a pickle round trip of the job's (equal to ``copy.deepcopy``, flags and node types
  included, in a third of the time), then its ``hydra`` node deleted, as Hydra does;
* the three files are written by :func:`experiments.lib.yamlfmt.to_yaml`: ``OmegaConf.to_yaml``'s text, emitted by
  libyaml (``tests/experiments/test_yamlfmt.py``; ``tests/experiments/test_collect.py`` compares the files of whole sweeps with the stock
  launcher's).

``tests/experiments/test_sweeper.py`` runs jobs through both this and Hydra's ``run_job`` and compares the returns (task
configuration, ``hydra`` configuration, overrides, working directory, status, value), the ``HydraConfig`` the task
sees, the files and the restored state.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

from hydra import version
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobRuntime, JobStatus, configure_log, env_override
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from experiments.lib.yamlfmt import to_yaml


def freeze(cfg: DictConfig) -> bytes:
  """``cfg`` as bytes whose ``pickle.loads`` is a deep copy (flags, node types and interpolations included, in a
  third of ``copy.deepcopy``'s time): the shape launcher's templates and the task's copy of each job."""
  return pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL)


def _flush_loggers() -> None:
  """Flush every handler of every logger (as Hydra does after a job)."""
  for logger in [
    logging.getLogger(),
    *[l for l in logging.Logger.manager.loggerDict.values() if isinstance(l, logging.Logger)],
  ]:
    for handler in logger.handlers:
      try:
        handler.flush()
      except Exception:  # (a handler that cannot flush must not fail the job)
        pass


def _save(cfg: Any, filename: str, folder: Path) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  with open(folder / filename, 'w', encoding='utf-8') as f:
    f.write(to_yaml(cfg))


def run_job(
  task_function: TaskFunction,
  config: DictConfig,
  job_dir_key: str,
  job_subdir_key: str | None,
  hydra_context: HydraContext,
  configure_logging: bool = True,
) -> JobReturn:
  """``hydra.core.utils.run_job`` with fewer copies (module docstring); same arguments, same return."""
  callbacks = hydra_context.callbacks
  old_cwd = os.getcwd()
  singleton = HydraConfig.instance()
  orig_hydra_cfg = singleton.cfg
  singleton.set_config(config)
  output_dir = str(OmegaConf.select(config, job_dir_key))
  if job_subdir_key is not None:
    output_dir = os.path.join(output_dir, str(OmegaConf.select(config, job_subdir_key)))
  for node in (config.hydra.runtime, singleton.cfg.hydra.runtime):
    with read_write(node), open_dict(node):
      node.output_dir = os.path.abspath(output_dir)
  chdir = None
  try:
    ret = JobReturn()
    task_cfg = pickle.loads(freeze(config))
    with read_write(task_cfg), open_dict(task_cfg):
      del task_cfg['hydra']
    ret.cfg = task_cfg
    hydra_cfg = copy.deepcopy(singleton.cfg)
    ret.hydra_cfg = hydra_cfg
    overrides = OmegaConf.to_container(config.hydra.overrides.task)
    assert isinstance(overrides, list)
    ret.overrides = overrides
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    chdir = hydra_cfg.hydra.job.chdir
    if chdir is None:  # Hydra's default: the job's own folder before version_base 1.2, else stay
      chdir = not version.base_at_least('1.2')
      if chdir:
        warnings.warn(
          'hydra.job.chdir is not set: under version_base < 1.2 the job runs in its output folder '
          '(set hydra.job.chdir, or version_base >= 1.2)',
          UserWarning,
          stacklevel=2,
        )
    if chdir:
      os.chdir(output_dir)
      ret.working_dir = output_dir
    else:
      ret.working_dir = os.getcwd()
    if configure_logging:
      configure_log(config.hydra.job_logging, config.hydra.verbose)
    if config.hydra.output_subdir is not None:
      folder = Path(config.hydra.runtime.output_dir) / Path(config.hydra.output_subdir)
      _save(task_cfg, 'config.yaml', folder)
      _save(hydra_cfg, 'hydra.yaml', folder)
      _save(config.hydra.overrides.task, 'overrides.yaml', folder)
    with env_override(hydra_cfg.hydra.job.env_set):
      callbacks.on_job_start(config=config, task_function=task_function)
      try:
        ret.return_value = task_function(task_cfg)
        ret.status = JobStatus.COMPLETED
      except Exception as e:  # (as Hydra: the job's failure is in its return)
        ret.return_value = e
        ret.status = JobStatus.FAILED
    ret.task_name = JobRuntime.instance().get('name')
    _flush_loggers()
    callbacks.on_job_end(config=config, job_return=ret)
    return ret
  finally:
    singleton.cfg = orig_hydra_cfg
    if chdir:
      os.chdir(old_cwd)
