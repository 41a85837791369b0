"""A fit's artifact: everything it learned, saved, loaded and applied to any dataset.

A folder (``experiments.fit`` writes ``<run>/artifact/<variant>/``, variant ``fitted``, ``conditioned`` or
``adapter``) holding ``manifest.json`` (the pipeline's config node and fitted knob paths, the components' specs,
the embedder's spec, every fit's knob values, scored and training episodes, training question ids and their
fingerprint, the protocol hash, the git commit and the package versions) and one safetensors file per fit
(``fold_00.safetensors`` ... and ``final.safetensors``: the scalar knobs' unconstrained values under ``knobs/<path>``,
each component's parameters under ``<component>/<key path>``, with their shapes, dtypes and each file's sha256). Every
file is written atomically (:func:`engram_jax.core.runfolder.write_file`), the manifest last; :func:`load` refuses in
one line (:class:`~engram_jax.core.errors.EngramError`, naming the file) an artifact whose run folder is incomplete or
mixed (:func:`engram_jax.core.runfolder.check`), a tensor file whose bytes, keys, shapes or dtypes differ from the
manifest, and an unreadable manifest or tensor file. The hard scorer
(:func:`score`) is the one ``experiments.fit`` scores its out-of-fold questions with, so applying a loaded fold to
that fold's episodes reproduces them exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

from engram_jax.core import modules as modules_lib
from engram_jax.core import runfolder
from engram_jax.core.errors import EngramError
from engram_jax.eval.pipeline import Pipeline, make_pipeline
from engram_jax.fit import adapter as _adapter  # noqa: F401 - registers the built-in components
from engram_jax.fit import apply
from engram_jax.fit import components as registry
from engram_jax.fit import conditioned as _conditioned  # noqa: F401
from engram_jax.fit.apply import score  # noqa: F401 - the road's scorer, named here too
from engram_jax.fit.components import component_of, component_spec
from engram_jax.fit.problem import Problem, effective_values, make_problem
from engram_jax.fit.train import KNOBS, FitResult, fitted_values

FORMAT = 'engram_jax.fitted/1'
PACKAGES = ('engram_jax', 'jax', 'jaxlib', 'flax', 'optax', 'numpy', 'safetensors')
COMPONENTS = registry.COMPONENTS  # name -> component class (engram_jax.fit.components)


def fingerprint(question_ids: Sequence[str]) -> str:
  """sha256 of the sorted question ids, one a line.

  >>> fingerprint(['b', 'a']) == fingerprint(['a', 'b'])
  True
  """
  return hashlib.sha256('\n'.join(sorted(question_ids)).encode()).hexdigest()


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
  """Installed versions (None when absent).

  >>> 'jax' in package_versions()
  True
  """
  out = {}
  for n in names:
    try:
      out[n] = importlib.metadata.version(n)
    except importlib.metadata.PackageNotFoundError:
      out[n] = None
  return out


def tensors(res: FitResult) -> dict[str, np.ndarray]:
  """A fit's parameters flat, ``knobs/<path>`` and ``<component>/<key>/<key>``."""
  flat = {f'{KNOBS}/{p}': np.asarray(v) for p, v in res.raw.items()}
  for name, params in res.learned.items():
    for key, v in traverse_util.flatten_dict(params, sep='/').items():
      flat[f'{name}/{key}'] = np.asarray(v)
  return flat


def from_tensors(flat: Mapping[str, np.ndarray], values: Mapping[str, float]) -> FitResult:
  """The :class:`FitResult` (values, raw knobs, learned parameters) that :func:`tensors` flattened."""
  raw = {k.split('/', 1)[1]: np.asarray(v) for k, v in flat.items() if k.startswith(f'{KNOBS}/')}
  learned: dict[str, dict] = {}
  for k, v in flat.items():
    name, _, rest = k.partition('/')
    if name != KNOBS:
      learned.setdefault(name, {})[rest] = np.asarray(v)
  learned = {n: traverse_util.unflatten_dict(p, sep='/') for n, p in learned.items()}
  return FitResult(values=dict(values), losses=[], train_rows=0, wall_s=0.0, raw=raw, learned=learned)


@dataclasses.dataclass
class Artifact:
  """A loaded artifact: the hand-set pipeline, the problem's knobs, the components and every fit (folds, final).

  Example:
    >>> import numpy as np, optax
    >>> from engram_jax.testing.synthetic import toy_fit_data
    >>> episodes, embeddings, arrays, pipe = toy_fit_data()  # 2 x 12 questions that repeat their gold item's text
    >>> import tempfile
    >>> from engram_jax.fit import Schedule, artifact, build_rows, fit, load_artifact, make_problem
    >>> problem, knobs, fixed = make_problem(pipe, ['legs.bm25.weight'])
    >>> rows = build_rows(problem, pipe, episodes, arrays, seed=0)
    >>> res = fit(problem, knobs, fixed, rows, np.arange(24), Schedule(optax.adam(0.1), steps=5, batch_size=8))
    >>> node = {'legs': {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}, 'fusion': 'rrf'}
    >>> ids = {'final': [q.id for ep in episodes for q in ep.questions]}
    >>> with tempfile.TemporaryDirectory() as d:
    ...   path = artifact.save(d, pipe_name='hybrid', pipe_node=node, params=['legs.bm25.weight'], k=10, components=(), fits={'final': res}, scored={'final': []}, train_questions=ids, train_episodes={'final': ['e0', 'e1']})
    ...   art = load_artifact(path)
    ...   scores = art.scorer('final')(list(episodes), list(embeddings), k=10, metrics=('ndcg@10',))
    >>> sorted(art.fits), scores['ndcg@10'].shape, art.fit_for('e0')[0]  # no fold scored e0: the final fit applies
    (['final'], (24,), 'final')
  """

  path: Path
  manifest: dict[str, Any]
  pipe: Pipeline
  problem: Problem
  every: dict[str, float]
  components: tuple[Any, ...]
  fits: dict[str, FitResult]  # label ('fold_00', ..., 'final') -> fit

  def fit_for(self, episode_id: str) -> tuple[str, FitResult]:
    """The fit to apply to episode ``episode_id``: the fold that scored it out of fold, else the final fit.

    Raises:
      EngramError: the episode is in no fold and the artifact has no final fit.
    """
    for entry in self.manifest['fits']:
      if episode_id in entry['scored_episodes']:
        return entry['label'], self.fits[entry['label']]
    if 'final' not in self.fits:
      raise EngramError(
        f'{self.path}: episode {episode_id!r} is in none of its folds and the artifact has no final fit (fit with '
        'fit.final=true to apply it to other episodes)'
      )
    return 'final', self.fits['final']

  def result(self, label: str = 'final') -> FitResult:
    """Fit ``label`` (``'final'``, ``'fold_00'``, ...); a one-line error naming the fits it has otherwise.

    Raises:
      EngramError: the artifact has no fit ``label`` (``'final'``: the fit ran without ``fit.final=true``).
    """
    if label not in self.fits:
      hint = ' (fit with fit.final=true for a final fit on every episode)' if label == 'final' else ''
      raise EngramError(f'{self.path}: the artifact has no fit {label!r}; it has {sorted(self.fits)}{hint}')
    return self.fits[label]

  def scorer(self, label: str = 'final') -> Callable[..., dict[str, np.ndarray]]:
    """A callable pipeline: ``(episodes, embeddings, *, k=10, metrics=('ndcg@10',), seed=0, embedder=None,
    force=False) -> {metric: [Q]}``, fit ``label`` applied to every episode (every learned part: knobs, adapter,
    conditioned knobs) through :func:`engram_jax.fit.apply.apply` and its guards: ``embedder`` (the encoder, or its
    config node, that made ``embeddings``) must be the fit's, else ``force=True``. Label-free questions:
    :func:`engram_jax.fit.retrieve.retrieve`."""
    self.result(label)

    def run(episodes, embeddings, *, k=10, metrics=('ndcg@10',), seed=0, embedder=None, force=False, **kw):
      dim = int(np.shape(embeddings[0][0])[-1]) if len(embeddings) else None
      got = apply.apply(
        self, list(episodes), list(embeddings), k=k, metrics=metrics, seed=seed, fit=label,
        vectors=apply.vectors_of(embedder, dim), force=force, **kw,
      )  # fmt: skip
      return got.scores

    return run


def in_memory(
  pipe: Pipeline,
  problem: Problem,
  every: Mapping[str, float],
  components: Sequence[Any],
  fits: Mapping[str, FitResult],
  scored: Mapping[str, Sequence[str]],
  where: str = '<fit in memory>',
) -> Artifact:
  """An :class:`Artifact` of fits not yet saved (a fit's folds as it scores them: ``scored``, label -> the
  episode ids each fit scores), to apply through the same road as a loaded one; its run files are pinned as they
  are now (the fit has just read them)."""
  entries = [{'label': label, 'scored_episodes': list(scored.get(label, ()))} for label in fits]
  return Artifact(
    path=Path(where), manifest={'fits': entries, 'runs': run_pins(pipe)}, pipe=pipe, problem=problem, every=dict(every),
    components=tuple(components), fits=dict(fits),
  )  # fmt: skip


def save(
  path: Path | str,
  *,
  pipe_name: str,
  pipe_node: Mapping[str, Any],
  params: Sequence[str],
  k: int,
  components: Sequence[Any],
  fits: Mapping[str, FitResult],
  scored: Mapping[str, Sequence[str]],
  train_questions: Mapping[str, Sequence[str]],
  train_episodes: Mapping[str, Sequence[str]],
  info: Mapping[str, Any] | None = None,
  modules: Sequence[str] = (),
) -> Path:
  """Write an artifact folder (``fits``: label -> fit; ``scored`` / ``train_*``: label -> ids; ``info``: embedder,
  dataset, protocol hash, git commit, ...). Returns ``path``. The manifest's ``modules`` lists what :func:`load`
  imports first: ``modules`` (a run's ``ops_modules``) and the modules defining the pipeline's operators and the
  components that are not the package's own (:func:`needed_modules`).

  >>> import tempfile; from engram_jax.fit.train import FitResult
  >>> res = FitResult(values={'k0': 60.0}, losses=[], train_rows=1, wall_s=0.0, raw={'k0': np.float32(np.log(60.0))})
  >>> node = {'fusion': 'rrf', 'legs': {'cos': {'op': 'cosine'}, 'bm25': {'op': 'bm25'}}}
  >>> d = save(tempfile.mkdtemp(), pipe_name='p', pipe_node=node, params=['k0'], k=10, components=[],
  ...          fits={'final': res}, scored={'final': []}, train_questions={'final': ['q1']},
  ...          train_episodes={'final': ['e1']})
  >>> load(d).fits['final'].values
  {'k0': 60.0}
  """
  path = Path(path)
  path.mkdir(parents=True, exist_ok=True)
  entries = []
  for label, res in fits.items():
    flat = tensors(res)
    data = safetensors.numpy.save({k: np.ascontiguousarray(v) for k, v in flat.items()})
    runfolder.write_file(path / f'{label}.safetensors', data)
    entries.append(
      {
        'label': label,
        'file': f'{label}.safetensors',
        'sha256': hashlib.sha256(data).hexdigest(),
        'values': res.values,
        'scored_episodes': list(scored[label]),
        'train_episodes': list(train_episodes[label]),
        'n_train_questions': len(train_questions[label]),
        'train_fingerprint': fingerprint(train_questions[label]),
        'train_question_ids': list(train_questions[label]),
        'tensors': {k: {'shape': list(np.shape(v)), 'dtype': str(np.asarray(v).dtype)} for k, v in flat.items()},
      }
    )
  manifest = {
    'format': FORMAT,
    'pipeline': {'name': pipe_name, 'node': dict(pipe_node), 'params': list(params), 'k': int(k)},
    'components': [component_spec(c) for c in components],
    'runs': run_pins(pipeline_from_node(pipe_name, pipe_node)),
    'modules': needed_modules(pipeline_from_node(pipe_name, pipe_node), components, modules),
    'fits': entries,
    'packages': package_versions(),
    **dict(info or {}),
  }
  runfolder.write_file(path / 'manifest.json', json.dumps(manifest, indent=1, default=str))  # last: it vouches
  return path


def run_pins(pipe: Pipeline) -> dict[str, str]:
  """``{absolute path: sha256}`` of the run files the pipeline's ``trec_run`` legs read (what a fit weighed)."""
  from engram_jax.ops.trec_run import file_sha256

  return {p: file_sha256(p) for p in apply.pipe_runs(pipe).values()}


def check_values(file: Path, problem: Problem, every: Mapping[str, float], entry: Mapping[str, Any], res: FitResult):
  """The manifest entry's ``values`` are those its tensors give (the constrained knobs of the raw values, every
  fixed knob at its hand-set value): an edited manifest, standalone or in its run folder, is refused."""
  fixed = {p: jnp.asarray(v, jnp.float32) for p, v in every.items()}
  raw = {p: jnp.asarray(v, jnp.float32).reshape(()) for p, v in res.raw.items()}  # scalars, stored as [1]
  want = fitted_values(problem, effective_values(problem, raw, fixed))
  got = dict(entry.get('values') or {})
  if set(got) != set(want):
    raise EngramError(
      f'{file}: fit {entry.get("label")!r} lists values for {sorted(got)}, its tensors give {sorted(want)} '
      '(edited, or from another fit)'
    )
  for p, v in want.items():
    x = got[p]
    if not isinstance(x, (int, float)) or not np.isclose(float(x), v, rtol=1e-5, atol=1e-6):
      raise EngramError(
        f'{file}: fit {entry.get("label")!r} says {p} = {x!r}, its tensors give {v:.6g} (the manifest was edited, '
        'or comes from another fit)'
      )


def needed_modules(pipe: Pipeline, components: Sequence[Any] = (), extra: Sequence[str] = ()) -> list[str]:
  """The modules to import before ``pipe`` and ``components`` can be rebuilt elsewhere: ``extra`` and the defining
  module of every operator and component that is not ``engram_jax``'s own (``__main__`` left out: not importable).

  >>> from engram_jax import make_pipeline
  >>> needed_modules(make_pipeline(legs={'bm25': {'op': 'bm25'}}), extra=['mypkg.recent'])
  ['mypkg.recent']
  """
  found = [leg.operator.leg.__module__ for leg in pipe.legs] + [type(c).__module__ for c in components]
  own = [m for m in found if m != '__main__' and m != 'engram_jax' and not m.startswith('engram_jax.')]
  return list(dict.fromkeys([*extra, *own]))


def import_modules(modules: Sequence[str], where: Path | str) -> None:
  """Import each module an artifact records (it registers operators or components); one line naming it if not."""
  modules_lib.import_modules(modules, str(where))


def _read_tensors(path: Path, entry: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """One fit's tensor file, checked against its manifest entry (sha256 when recorded, keys, shapes, dtypes)."""
  file = path / entry['file']
  try:
    data = file.read_bytes()
  except OSError as e:
    raise EngramError(f'{file}: the artifact tensor file cannot be read ({e.strerror or e})') from None
  digest = entry.get('sha256')  # artifacts written before the sha256 was recorded have none
  if digest is not None and hashlib.sha256(data).hexdigest() != digest:
    raise EngramError(f'{file}: its bytes do not match the sha256 in manifest.json (damaged, or from another fit)')
  try:
    flat = safetensors.numpy.load(data)
  except (safetensors.SafetensorError, ValueError) as e:
    raise EngramError(f'{file}: not a readable safetensors file ({type(e).__name__}: {e})') from None
  want = entry.get('tensors') or {}
  if set(flat) != set(want):
    raise EngramError(
      f'{file}: holds tensors {sorted(flat)}, manifest.json lists {sorted(want)} (damaged, or from another fit)'
    )
  for key, spec in want.items():
    got = (list(flat[key].shape), str(flat[key].dtype))
    shape = list(spec['shape']) or [1]  # a scalar is stored as [1] (np.ascontiguousarray), recorded as []
    if got != (shape, str(spec['dtype'])):
      raise EngramError(
        f'{file}: tensor {key} is {got[1]}{got[0]}, manifest.json says {spec["dtype"]}{list(spec["shape"])}'
      )
  return flat


def load(path: Path | str, variant: str | None = None) -> Artifact:
  """Load an artifact folder (or the declared / ``variant`` variant of a run folder's ``artifact/``), checked: a run
  folder must be whole (:func:`engram_jax.core.runfolder.check`: its marker vouches for every file read), every
  tensor file must match its manifest entry; a damaged or inconsistent file is one line naming it.

  >>> from engram_jax.fit import load_artifact
  >>> load_artifact('/nonexistent')
  Traceback (most recent call last):
  ...
  FileNotFoundError: no artifact manifest.json under /nonexistent
  """
  run = runfolder.run_folder_of(path)
  marker = runfolder.check(run) if run is not None else None  # before any file of the run is read
  path = resolve(path, variant)
  file = path / 'manifest.json'
  try:
    manifest = json.loads(file.read_text())
  except (OSError, ValueError) as e:
    raise EngramError(f'{file}: not a readable artifact manifest ({type(e).__name__}: {e})') from None
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    got = manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__
    raise EngramError(f'{file}: not an {FORMAT} artifact manifest (format {got!r})')
  try:
    if marker is not None:
      read = [file, *(path / e['file'] for e in manifest['fits'])]
      runfolder.check(run, [p.relative_to(run).as_posix() for p in read])
    import_modules(manifest.get('modules') or [], file)
    node = manifest['pipeline']
    try:
      pipe = pipeline_from_node(node['name'], node['node'])
    except EngramError as e:
      raise EngramError(f'{file}: {e} (modules the artifact imports: {manifest.get("modules") or []})') from None
    problem, _, every = make_problem(pipe, node['params'], k=int(node['k']))
    components = tuple(component_of(s) for s in manifest['components'])
    fits = {e['label']: from_tensors(_read_tensors(path, e), e['values']) for e in manifest['fits']}
    for e in manifest['fits']:
      check_values(file, problem, every, e, fits[e['label']])
  except (KeyError, TypeError, AttributeError) as e:
    raise EngramError(f'{file}: a damaged artifact manifest ({type(e).__name__}: {e} missing or malformed)') from None
  return Artifact(
    path=path, manifest=manifest, pipe=pipe, problem=problem, every=every, components=components, fits=fits
  )


def resolve(path: Path | str, variant: str | None = None) -> Path:
  """The artifact folder at ``path``: itself, or ``path/artifact/<variant>`` (default: the last variant written,
  the run's declared fit: ``adapter`` / ``conditioned`` when present, else ``fitted``)."""
  path = Path(path)
  if (path / 'manifest.json').is_file():
    return path
  root = path / 'artifact'
  if root.is_dir():
    order = []
    if (root / 'variants.json').is_file():
      try:
        order = json.loads((root / 'variants.json').read_text())
      except ValueError as e:
        raise EngramError(f'{root / "variants.json"}: not readable ({type(e).__name__}: {e})') from None
    name = variant or (order[-1] if order else 'fitted')
    if (root / name / 'manifest.json').is_file():
      return root / name
  raise FileNotFoundError(f'no artifact manifest.json under {path}')


def pipeline_from_node(name: str, node: Mapping[str, Any]) -> Pipeline:
  """A pipeline from its config node (``legs``, ``fusion``, ``k0``, ...; other keys ignored)."""
  node = {k: v for k, v in dict(node).items() if k in ('legs', 'fusion', 'k0')}
  return make_pipeline(name=name, **node)


load_artifact = load  # the name the package exports (``engram_jax.fit.load_artifact``)
