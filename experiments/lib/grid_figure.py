"""The grid's figure (``grid.png``) from plain arrays: NumPy and matplotlib only, no JAX.

:func:`plot` draws it in the caller's process. :class:`FigureWorker` draws the same figure in a helper process started
with the grid's job: matplotlib's import (~0.35 s) and the heatmaps then run on the core the job leaves idle in its
single-threaded phases, and only panel (a) (it needs the ranking) and the PNG's encoding follow the ranking. On the
docs' 100-point grid the figure cost the whole process ~0.8 s in line and costs ~0.2 s this way; the PNG's bytes are
the same (``tests/experiments/test_grid_cli.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

MAX_PAIRS = 6


@dataclasses.dataclass(frozen=True)
class GridView:
  """What the figure reads of a grid: ``points`` (path -> ``[P]`` values), ``means [P]`` of ``metric``."""

  pipeline: str
  paths: list[str]
  points: dict[str, np.ndarray]
  means: np.ndarray
  metric: str

  @property
  def n_points(self) -> int:
    return len(self.means)


def best_point(view: GridView) -> int:
  """The first of the highest means (as :func:`engram_jax.eval.grid.rank_points` orders them)."""
  return int(np.argsort(-view.means, kind='stable')[0])


def slices(view: GridView):
  """The figure of :func:`plot` without panel (a): ``(figure, axes)``, one heatmap of the metric per pair of swept knobs
  (several levels each) with every other knob at the best point's value (every pair when there are at most
  ``MAX_PAIRS``, else disjoint neighbours in grid order, each knob on one axis), ``axes[0]`` empty. A
  ``matplotlib.figure.Figure`` (no pyplot: no GUI backend, and half the import time)."""
  from matplotlib.figure import Figure

  means, points = view.means, view.points
  best = best_point(view)
  swept = [p for p in view.paths if len(set(points[p].tolist())) > 1]
  pairs = list(itertools.combinations(swept, 2))
  if len(pairs) > MAX_PAIRS:  # many knobs: disjoint neighbours, so that every knob gets an axis
    pairs = [(swept[i], swept[(i + 1) % len(swept)]) for i in range(0, len(swept), 2)][:MAX_PAIRS]
  fig = Figure(figsize=(5 + 3.6 * len(pairs), 3.8))
  axes = fig.subplots(1, 1 + len(pairs), squeeze=False)[0]
  for ax, (a, b) in zip(axes[1:], pairs):
    fixed = np.ones(view.n_points, bool)
    for p in view.paths:
      if p not in (a, b):
        fixed &= points[p] == points[p][best]
    la, lb = sorted(set(points[a].tolist())), sorted(set(points[b].tolist()))
    img = np.full((len(la), len(lb)), np.nan)
    for i in np.flatnonzero(fixed):
      img[la.index(points[a][i].item()), lb.index(points[b][i].item())] = means[i]
    im = ax.imshow(img, origin='lower', aspect='auto', cmap='viridis')
    ax.set_xticks(range(len(lb)), [f'{v:g}' for v in lb], fontsize=7)
    ax.set_yticks(range(len(la)), [f'{v:g}' for v in la], fontsize=7)
    ax.set_xlabel(b, fontsize=8)
    ax.set_ylabel(a, fontsize=8)
    ax.plot(lb.index(points[b][best].item()), la.index(points[a][best].item()), 'r*', ms=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
  if pairs:
    axes[1].set_title('slices through the best point (*)', fontsize=9)
  return fig, axes


def plateau_panel(fig, ax, view: GridView, ranked: list[dict[str, Any]]) -> None:
  """Panel (a) of :func:`plot` on ``ax``: the paired difference from the best by rank, the plateau in blue."""
  if ranked and int(ranked[0]['point']) != best_point(view):
    raise AssertionError('the slices and the ranking disagree on the best point')
  x = np.arange(1, len(ranked) + 1)
  delta = np.array([r['vs_best']['delta'] for r in ranked])
  lo = np.array([r['vs_best']['lo'] for r in ranked])
  hi = np.array([r['vs_best']['hi'] for r in ranked])
  on = np.array([r['on_plateau'] for r in ranked])
  ax.errorbar(x, delta, yerr=[delta - lo, hi - delta], fmt='none', ecolor='0.6', elinewidth=1)
  ax.scatter(x[on], delta[on], color='C0', s=12, zorder=3, label='plateau: paired CI contains 0')
  ax.scatter(x[~on], delta[~on], facecolor='white', edgecolor='C3', s=12, zorder=3, label='below the best')
  ax.axhline(0.0, color='C0', lw=0.8)
  ax.set_xlabel('point rank')
  ax.set_ylabel(f'{view.metric} minus best (paired)')
  ax.set_title(f'(a) {view.pipeline}: {on.sum()} points on the plateau', fontsize=9)
  ax.legend(fontsize=7, loc='lower left')


def finish(fig, path: Path | None):
  """Fixed margins (not tight_layout: its layout pass measured a third of the report's time on the 100-point grid),
  then the PNG at ``path`` when given; returns ``fig``."""
  w = fig.get_figwidth()
  fig.subplots_adjust(left=0.9 / w, right=1 - 0.55 / w, bottom=0.16, top=0.9, wspace=0.55)
  if path is not None:
    fig.savefig(path, dpi=100)
  return fig


def plot(view: GridView, ranked: list[dict[str, Any]], path: Path | None = None):
  """(a) the paired difference from the best of the tested points by rank (plateau in blue); then the heatmaps of
  :func:`slices`. Axes carry the knobs' full paths. Returns the figure (saved as PNG to ``path`` when given)."""
  fig, axes = slices(view)
  plateau_panel(fig, axes[0], view, ranked)
  return finish(fig, path)


def serve(stream: BinaryIO | None = None) -> None:
  """The helper process's loop (:class:`FigureWorker`): import matplotlib, then read two pickled messages from
  ``stream`` (default stdin), ``('slices', GridView)`` and ``('finish', ranked, path)``, and draw between them. Ends
  quietly at end of input (the job stopped before its figure)."""
  stream = sys.stdin.buffer if stream is None else stream
  inbox: queue.Queue = queue.Queue()

  def read() -> None:  # beside the import, so that the job never waits on a full pipe
    while True:
      try:
        inbox.put(pickle.load(stream))
      except EOFError:
        inbox.put(None)
        return

  threading.Thread(target=read, daemon=True).start()
  import matplotlib.backends.backend_agg  # noqa: F401  (savefig's canvas, imported before it is needed)
  import matplotlib.figure  # noqa: F401

  first = inbox.get()
  if first is None:
    return
  _, view = first
  fig, axes = slices(view)
  second = inbox.get()
  if second is None:
    return
  _, ranked, path = second
  plateau_panel(fig, axes[0], view, ranked)
  finish(fig, Path(path))


class FigureWorker:
  """``grid.png`` drawn by a helper process (:func:`serve`), started at once: :meth:`slices` when the grid's means are
  known, :meth:`finish` with the ranking, :meth:`wait` for the PNG (raises with the helper's error output if it
  failed). :meth:`close` (or leaving it as a context manager) stops it if it still runs."""

  def __init__(self) -> None:
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds the experiments package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get('PYTHONPATH')) if p))
    self.errors = tempfile.TemporaryFile()  # the helper's stderr (a file: no pipe to drain while the job runs)
    self.proc = subprocess.Popen(
      [sys.executable, '-c', 'from experiments.lib.grid_figure import serve; serve()'],
      stdin=subprocess.PIPE,
      stderr=self.errors,
      env=env,
    )

  def _send(self, message: tuple) -> None:
    try:
      pickle.dump(message, self.proc.stdin)
      self.proc.stdin.flush()
    except BrokenPipeError:
      self.wait()
      raise

  def slices(self, view: GridView) -> None:
    self._send(('slices', view))

  def finish(self, ranked: list[dict[str, Any]], path: Path) -> None:
    """Send the ranking: panel (a) and the PNG at ``path`` follow in the helper; :meth:`wait` for them."""
    self._send(('finish', ranked, str(path)))
    self.proc.stdin.close()

  def wait(self) -> None:
    """Wait for the PNG; raises with the helper's error output if it failed."""
    if self.proc.wait() != 0:
      self.errors.seek(0)
      tail = self.errors.read().decode(errors='replace').strip().splitlines()[-20:]
      raise RuntimeError(f'the grid figure process failed (exit {self.proc.returncode}):\n' + '\n'.join(tail))

  def __enter__(self) -> FigureWorker:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  def close(self) -> None:
    """Stop the helper if it still runs (the job ended before its figure), and let go of its files."""
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    if self.proc.stdin is not None and not self.proc.stdin.closed:
      try:
        self.proc.stdin.close()
      except BrokenPipeError:
        pass
    self.errors.close()
