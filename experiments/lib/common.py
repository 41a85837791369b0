"""Public helpers of the entry points: config -> plain library values (operators' modules, pipelines, datasets,
the embedder) and a run's files. Every entry point (evaluate, fit, bench, research scripts) uses these instead of
another entry point's internals.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from engram_jax.core import modules
from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, LoadReport
from engram_jax.data import embed, vectors
from engram_jax.eval import compile_cache, legcache, pipeline
from engram_jax.eval.config import EvalConfig

log = logging.getLogger(__name__)
CONF = Path(__file__).resolve().parents[2] / 'conf'
PIPELINE_EXTRAS = ('tune', 'replicate', 'skip_datasets')
# conf/embedder/vectors.yaml's label, ${vectors_model_id:${.path}}: the file's own model_id, resolved from the file
OmegaConf.register_new_resolver('vectors_model_id', vectors.file_model_id, replace=True)


FULL_ERROR_ENV = 'ENGRAM_FULL_ERROR'


def one_line(message: str) -> str:
  """``message`` on one line (its line breaks as ``; ``)."""
  return '; '.join(line.strip() for line in str(message).splitlines() if line.strip())


def hydra_own_files(out_dir: Path | str) -> dict[str, str]:
  """Hydra's files of this job that this process knows by content: ``.hydra/overrides.yaml`` as Hydra wrote it from
  this job's overrides, for :func:`engram_jax.core.runfolder.begin` to refuse a folder whose copy another run
  (started into it at the same time) rewrote. Empty outside a Hydra job whose output folder is ``out_dir``."""
  from hydra.core.hydra_config import HydraConfig

  try:
    hc = HydraConfig.get()
    if hc.output_subdir is None or Path(hc.runtime.output_dir).resolve() != Path(out_dir).resolve():
      return {}
    return {f'{hc.output_subdir}/overrides.yaml': OmegaConf.to_yaml(hc.overrides.task)}
  except Exception:  # no Hydra job in this process (a test's compose, a library call): nothing known
    return {}


def plain_errors(fn):
  """Wrap an entry point's main function: the project's own errors (:class:`EngramError`) print one line on
  stderr and exit with status 1; ``ENGRAM_FULL_ERROR=1`` raises them with their traceback (as Hydra's
  ``HYDRA_FULL_ERROR``). Other exceptions (bugs) keep their traceback. Put it under ``@hydra.main``."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except EngramError as e:
      if os.environ.get(FULL_ERROR_ENV, '') not in ('', '0'):
        raise
      print(f'Error: {one_line(str(e))} ({FULL_ERROR_ENV}=1 for the traceback)', file=sys.stderr)
      sys.exit(1)

  return wrapped


@functools.cache
def _staged_compile_cache(folder: str) -> str:
  """This process's staging folder of the shared compilation cache ``folder`` (one per process and folder: the
  jobs of an in-process multirun share it), published into ``folder`` at exit (engram_jax.eval.compile_cache)."""
  private = compile_cache.stage(folder)
  atexit.register(compile_cache.publish, private, folder)
  return str(private)


def enable_compile_cache(cfg: DictConfig) -> str | None:
  """Turn on JAX's persistent compilation cache in ``cfg.paths.compile_cache_dir`` (null: off), so that a warm
  rerun of the same configuration compiles nothing; returns the folder used. Concurrent jobs share it safely: each
  process works in a staging copy and publishes whole entries at exit (:mod:`engram_jax.eval.compile_cache`)."""
  folder = cfg.paths.get('compile_cache_dir')
  if not folder:
    return None
  import jax

  # XLA's own GPU caches would live under the (per-process) staging folder and put its path into every cache key,
  # so no process would ever hit another's entries: keep them off (on CPU they do nothing anyway)
  jax.config.update('jax_persistent_cache_enable_xla_caches', 'none')
  jax.config.update('jax_compilation_cache_dir', _staged_compile_cache(str(folder)))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  return str(folder)


@functools.cache
def _process_leg_cache(max_bytes: int) -> legcache.LegCache:
  return legcache.LegCache(max_bytes=max_bytes)


def eval_settings(cfg: DictConfig) -> EvalConfig:
  """The run's ``eval`` node as typed settings (:meth:`engram_jax.eval.config.EvalConfig.from_mapping`: an unknown key
  or a bad value is one line): the one place the node crosses into the library. A key whose interpolation cannot
  resolve (``eval.metrics: ${dataset.metrics}`` in a run of several datasets) is left out."""
  node = {}
  for key in cfg.eval:
    try:
      value = cfg.eval[key]
    except InterpolationResolutionError:
      continue
    node[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
  return EvalConfig.from_mapping(node)


def leg_cache(settings: EvalConfig) -> legcache.LegCache | None:
  """This process's cache of legs' hard outputs, padded arrays and programs (:mod:`engram_jax.eval.legcache`), shared by
  the jobs of an in-process multirun (Hydra's basic launcher); ``eval.leg_cache_mb`` bounds it (0: off)."""
  mb = settings.leg_cache_mb
  return _process_leg_cache(mb << 20) if mb else None


@functools.cache
def _process_memo() -> dict:
  return {}


def memo(settings: EvalConfig, kind: str, node: Any, make):
  """``make()`` once per process for the config ``node`` that determines it (resolved, as YAML: e.g. a dataset's
  loader and data root, an embedder and its cache): the jobs of an in-process multirun load and embed once.
  Off with ``eval.leg_cache_mb=0``."""
  if not settings.leg_cache_mb:
    return make()

  def plain(v):  # resolved in its own config's context (a sub-node keeps its interpolations to the root)
    if isinstance(v, (DictConfig, ListConfig)):
      return OmegaConf.to_container(v, resolve=True)
    return {k: plain(x) for k, x in v.items()} if isinstance(v, Mapping) else v

  key = (kind, json.dumps(plain(node), sort_keys=True, default=str))
  store = _process_memo()
  if key not in store:
    store[key] = make()
  return store[key]


def publish_compile_cache(cfg: DictConfig) -> list[str]:
  """Publish this process's new compilation-cache entries now (after a job), not only at exit: a worker that
  never runs exit handlers (Ray) has shared its programs by then. Returns the entries published."""
  folder = cfg.paths.get('compile_cache_dir')
  if not folder:
    return []
  return compile_cache.publish(_staged_compile_cache(str(folder)), folder, remove=False)


def eval_devices(settings: EvalConfig) -> int | None:
  """``eval.devices`` as the library takes it: ``None`` (all available devices; also when the key is absent) or an
  int >= 1 (:func:`engram_jax.eval.evaluation.evaluate` ``devices``; checked by
  :meth:`engram_jax.eval.config.EvalConfig.from_mapping`)."""
  return settings.devices


MAX_CPU_DEVICES = 8


def cpu_devices_wanted(value: Any, cores: int | None) -> int:
  """``eval.cpu_devices`` as a count: ``'cores'`` is this machine's cores (``os.cpu_count()``, at most
  :data:`MAX_CPU_DEVICES`), an int >= 1 itself."""
  if value == 'cores':
    return max(1, min(int(cores or 1), MAX_CPU_DEVICES))
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise EngramError(f"eval.cpu_devices must be 'cores' or an integer >= 1, got {value!r}")
  return value


def use_cpu_cores(settings: EvalConfig, *, multirun: bool = False) -> int | None:
  """Give this process ``eval.cpu_devices`` CPU devices (``jax_num_cpu_devices``), so that evaluation shards each
  stacked group's episodes over the machine's cores (``eval.devices: null`` = every device; the results equal one
  device's bit for bit: tests/eval/test_sharding.py). JAX takes the setting only before its first computation: a later
  call (the next job of an in-process multirun, a test) keeps the process's devices and returns None; else the count
  set. A GPU or TPU backend is unaffected (the setting is the CPU platform's).

  A ``multirun`` keeps one device (returns None): its launcher puts the cores to work (joblib, submitit, ...)."""

  if multirun:
    return None
  return set_cpu_devices(cpu_devices_wanted(settings.cpu_devices, os.cpu_count()))


def set_cpu_devices(n: int) -> int | None:
  """``jax_num_cpu_devices = n`` if JAX has not computed yet in this process (returns ``n``); else the process keeps
  its devices (returns None)."""
  import jax

  try:
    jax.config.update('jax_num_cpu_devices', n)
  except RuntimeError:  # JAX's backends are already initialised in this process
    log.debug('%s CPU devices asked: kept the devices of this process (JAX already initialised)', n)
    return None
  return n


def md_mean_row(label: str, v: Mapping[str, Any], metrics: list[str]) -> str:
  """A Markdown table row ``| label | mean [lo, hi] | ... |`` of ``v[metric]`` = ``{'mean', 'lo', 'hi'}``."""
  return (
    f'| {label} | ' + ' | '.join(f'{v[m]["mean"]:.4f} [{v[m]["lo"]:.4f}, {v[m]["hi"]:.4f}]' for m in metrics) + ' |'
  )


def md_paired_row(label: str, v: Mapping[str, Any], metrics: list[str]) -> str:
  """A Markdown table row ``| label | delta [lo, hi], p | ... |`` of paired results ``v[metric]``."""
  cells = [f'{v[m]["delta"]:+.4f} [{v[m]["lo"]:+.4f}, {v[m]["hi"]:+.4f}], {v[m]["p"]:.3g}' for m in metrics]
  return f'| {label} | ' + ' | '.join(cells) + ' |'


def fold_devices(settings: EvalConfig) -> list[Any]:
  """The devices a cross-fit runs its folds on concurrently (:func:`engram_jax.fit.crossfit` ``devices``): those
  evaluation shards over (``eval.devices``: null = every device; on CPU, ``eval.cpu_devices`` of them)."""
  import jax

  n = eval_devices(settings)
  return list(jax.devices()[: n or jax.device_count()])


def import_ops_modules(cfg: DictConfig) -> list[str]:
  """Import the modules named in ``cfg.ops_modules`` (each registers its operators); returns their names."""
  return modules.import_modules(list(cfg.get('ops_modules') or []), 'ops_modules')


def pipeline_from_node(name: str, node: Mapping[str, Any] | DictConfig) -> pipeline.Pipeline:
  """The hand-set pipeline of one YAML node ``{fusion, k0, legs: {name: {op, depth, weight, knobs}}}``, ignoring
  ``tune`` / ``replicate`` / ``skip_datasets``."""
  node = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
  for key in PIPELINE_EXTRAS:
    node.pop(key, None)
  return pipeline.make_pipeline(name=name, **node)


def hand_set_pipeline(name: str, node: Mapping[str, Any] | DictConfig | None = None) -> pipeline.Pipeline:
  """The hand-set pipeline ``name``: from ``node``, else from ``conf/pipeline/NAME.yaml``."""
  if node is None:
    path = CONF / 'pipeline' / f'{name}.yaml'
    if not path.is_file():
      known = sorted(p.stem for p in (CONF / 'pipeline').glob('*.yaml'))
      raise EngramError(f'unknown pipeline {name!r}; known: {known}')
    node = OmegaConf.load(path)[name]
  return pipeline_from_node(name, node)


def variant_name(name: str, param: str, value: Any) -> str:
  return f'{name}[{param.rsplit(".", 1)[-1]}={value}]'


def build_pipelines(
  cfg: DictConfig, settings: EvalConfig | None = None
) -> tuple[dict[str, pipeline.Pipeline], dict[str, tuple[str, list[str], Any]]]:
  """Every selected pipeline config as a library Pipeline (``settings``: the run's, default read from ``cfg``: a
  ``tune`` node without a metric is tuned on ``eval.metrics[0]``).

  A pipeline node may expand into variants, one per value of one knob (named ``name[knob=value]``), merged after
  evaluation: ``tune: {param, grid, metric}`` is cross-fitted by episode (``evaluation.merge_tuned``);
  ``replicate: {param, values}`` (seeds of a stochastic leg) is averaged (``evaluation.merge_replicates``);
  ``cfg.fitted`` (a fitted.json of ``experiments.fit``) gives one variant per episode. Knob paths are
  ``legs.<leg>.<knob>`` / ``k0`` (:func:`engram_jax.eval.pipeline.split_path`).

  Returns:
    ``(pipelines, expanded)`` with ``expanded[name] = (kind, variant names, tuning metric or variant_of)``.
  """
  import_ops_modules(cfg)
  pipes: dict[str, pipeline.Pipeline] = {}
  expanded: dict[str, tuple[str, list[str], Any]] = {}
  fitted = None
  if cfg.get('fitted') and not Path(cfg.fitted).is_dir():  # a fitted.json (an artifact: experiments.evaluate)
    fitted = json.loads(Path(cfg.fitted).read_text())
  if fitted is not None and fitted['pipeline'] not in cfg.pipeline:
    raise EngramError(f'fitted parameters are for pipeline {fitted["pipeline"]!r}, which is not selected')
  for name, node in cfg.pipeline.items():
    base = pipeline_from_node(name, node)
    if fitted is not None and name == fitted['pipeline']:
      variant_of = {}
      for episode, params in fitted['folds'].items():
        vname = f'{name}[fold={episode}]'
        try:
          pipes[vname] = pipeline.with_values(base, params, name=vname)
        except ValueError as e:
          raise EngramError(
            f'fitted parameters of episode {episode}: {e} (does not exist in pipeline {name})'
          ) from None
        variant_of[episode] = vname
      expanded[name] = ('fitted', list(variant_of.values()), variant_of)
      continue
    tune, rep = node.get('tune'), node.get('replicate')
    if tune is None and rep is None:
      pipes[name] = base
      continue
    if tune is not None and rep is not None:
      raise EngramError(f'pipeline {name}: tune and replicate cannot be combined')
    kind, spec = ('tune', tune) if tune is not None else ('replicate', rep)
    values = spec['grid'] if kind == 'tune' else spec['values']
    variants = []
    for value in values:
      vname = variant_name(name, spec['param'], value)
      pipes[vname] = pipeline.with_values(base, {spec['param']: value}, name=vname)
      variants.append(vname)
    if 'metric' not in spec and settings is None:
      settings = eval_settings(cfg)
    expanded[name] = (kind, variants, spec['metric'] if 'metric' in spec else settings.metrics[0])
  return pipes, expanded


def make_embedder(cfg: DictConfig, *, progress: bool = True):
  """``texts -> [T, D]`` through the embedding cache, keyed by the instantiated encoder's spec (read from files:
  a warm cache never loads the model); ``progress``: a progress bar while encoding (``eval.progress``). ``embed_fn.cache_reports`` collects each call's ``CacheReport.as_dict()``
  (texts cached / embedded, bad shards rebuilt) for the run's files."""
  e = cfg.embedder
  encoder = instantiate(e.encoder)
  if hasattr(encoder, 'folder'):
    encoder.folder  # a model that is not there: one line, before any work
  reports: list[dict[str, Any]] = []
  if hasattr(encoder, 'lookup'):  # vectors read from a file by id (engram_jax.data.vectors): nothing is embedded
    return _vectors_embedder(cfg, encoder, reports)

  def encode_with(enc):
    def embed_fn(texts):
      vecs, report = embed.embed_with_report(
        texts, cache_dir=cfg.paths.cache_dir, model_id=e.model_id, encoder=enc, progress=progress
      )
      reports.append(report.as_dict())
      return vecs

    return embed_fn

  if hasattr(encoder, 'for_role'):  # query / document prompts (bge, e5, the model's own prompts config)
    documents, queries = encoder.for_role('document'), encoder.for_role('query')
  else:
    documents = queries = encoder
  embed_fn = encode_with(documents)
  if queries is not documents:  # questions embedded apart, with their own prompt and cache key
    embed_fn.queries = encode_with(queries)
  embed_fn.cache_reports = reports
  return embed_fn


def no_embedder():
  """The embedder of a run whose legs read no vector: one constant unit vector per text; no model is looked for,
  nothing is encoded or cached."""

  def embed_fn(texts):
    return np.ones((len(texts), 1), np.float32)

  embed_fn.cache_reports = []
  return embed_fn


def _vectors_embedder(cfg: DictConfig, encoder: Any, reports: list[dict[str, Any]]):
  """``make_embedder`` of a vectors file: read and checked now (one line before any work), matched by id
  (``embed_fn.by_id``, used by :func:`engram_jax.eval.evaluation.embed_episodes`; ``embed_fn.check`` refuses missing
  ids right after loading)."""
  encoder.file

  def embed_fn(texts):
    return encoder(texts)  # refused in one line: a vectors file holds vectors by id, not by text

  def by_id(episodes):
    embeddings, report = encoder.lookup(episodes)
    reports.append(report)
    return embeddings

  embed_fn.by_id = by_id
  embed_fn.check = encoder.lookup
  embed_fn.content_key = encoder.file.sha256  # what determines the vectors: the file's content, not its path
  embed_fn.cache_reports = reports
  return embed_fn


def check_embeddable(embed_fn, episodes) -> None:
  """Refuse, in one line, episodes the embedder cannot embed (a vectors file that lacks their ids); other
  embedders embed any text."""
  check = getattr(embed_fn, 'check', None)
  if check is not None:
    check(episodes)


def dataset_metrics(ds: Mapping[str, Any] | DictConfig) -> dict[str, Any]:
  """The dataset-owned metrics of dataset config ``ds``: the ``METRICS`` of its ``metrics_module`` (empty when it
  names none)."""
  name = ds.get('metrics_module')
  if not name:
    return {}
  module = modules.import_module(str(name), f'dataset {ds.get("name")}: metrics_module')
  if not hasattr(module, 'METRICS'):
    raise EngramError(f'metrics_module {name} declares no METRICS')
  return dict(module.METRICS)


def load_dataset(
  cfg: DictConfig, ds: Mapping[str, Any] | DictConfig, purpose: str | None = None
) -> tuple[list[Episode], LoadReport]:
  """Load one dataset config node (``ds.loader``) under the run's data root; logs the load report. ``purpose``:
  why this set is read, said when its file is missing (e.g. a training set the user never named)."""
  from hydra.errors import InstantiationException

  from engram_jax.core.errors import DataNotFoundError

  try:
    try:
      episodes, load_report = instantiate(ds['loader'], root=cfg.paths.data_root)
    except InstantiationException as e:  # Hydra wraps the loader's error in a multi-line repr: keep ours as is
      if isinstance(e.__cause__, EngramError):
        raise e.__cause__ from None
      raise
  except DataNotFoundError as e:
    if purpose is None:
      raise
    raise DataNotFoundError(f'{purpose}, and its data is missing: {one_line(str(e))}') from e
  log.info('%s', load_report.summary())
  return episodes, load_report
