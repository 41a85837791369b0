"""Issue 50 item 2: an external run that matches nothing is refused before any embedding, in one line naming the file,
the first ids and the likely cause; a partial match over ``ext_run_max_unmatched`` stops the run; under it, the
counts are in results.md. Before: ids quoted with another percent-encoding or upper-cased question ids were scored
without a word (the fused pipeline equalled cosine exactly), and a run used alone with fewer than k items per question
ended in a 21-line traceback with a bare AssertionError."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from engram_jax.core.errors import EngramError
from engram_jax.data import io
from experiments import evaluate
from experiments.research.external_run import run_lines

CONF = str(Path(__file__).resolve().parents[2] / 'conf')
try:
  HAVE = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()
except FileNotFoundError:
  HAVE = False
pytestmark = pytest.mark.skipif(not HAVE, reason='LoCoMo not found under the data root')
CONV = "dataset.loader.conversations=['conv-26']"


def _cfg(tmp_path, run, *overrides):
  with initialize_config_dir(config_dir=CONF, version_base='1.3'):
    return compose(
      config_name='config',
      overrides=[
        'embedder=hashing', 'eval.n_resamples=100', 'eval.progress=false', f'paths.cache_dir={tmp_path}/cache', CONV,
        f'ext_run={run}', *overrides,
      ],
    )  # fmt: skip


def _lines(tmp_path, depth=20):
  from experiments.lib import common

  cfg = _cfg(tmp_path, 'none', 'pipeline=[cosine]')
  episodes, _ = common.load_dataset(cfg, cfg.dataset)
  return run_lines(episodes, depth=depth)


def _write(tmp_path, lines, name='ext.trec'):
  path = tmp_path / name
  path.write_text('\n'.join(lines) + '\n')
  return path


def _refused(tmp_path, run, pattern, *overrides, monkeypatch=None):
  cfg = _cfg(tmp_path, run, *overrides)
  with pytest.raises(EngramError, match=pattern) as e:
    evaluate.run(cfg, tmp_path / 'out')
  assert '\n' not in str(e.value)


def test_a_run_that_matches_nothing_is_refused_naming_the_cause(tmp_path, monkeypatch):
  from engram_jax.eval import evaluation

  monkeypatch.setattr(evaluation, 'embed_episodes', lambda *a, **k: pytest.fail('embedded before the refusal'))
  lines = _lines(tmp_path)
  upper = _write(tmp_path, [' '.join([ln.split()[0].upper(), *ln.split()[1:]]) for ln in lines], 'upper.trec')
  _refused(
    tmp_path, upper,
    rf'^{upper}: the run has no lines for 197 of 197 questions \(first: .*\); likely cause: the question ids differ in '
    r'case \(run: CONV-26.*, episode: conv-26.*\); over the threshold 0.5 \(ext_run_max_unmatched\)$',
    'pipeline=[rrf_cos_ext]',
  )  # fmt: skip
  quoted = [' '.join([a, b, c.replace(':', '%3A'), *rest]) for a, b, c, *rest in (ln.split() for ln in lines)]
  quoted = _write(tmp_path, quoted, 'quoted.trec')
  _refused(
    tmp_path, quoted,
    rf'^{quoted}: \d+ of the \d+ lines of matched questions name doc ids no episode has \(first: D1%3A1.*\); likely '
    r'cause: the doc ids differ in percent-encoding \(run: D\d+%3A\d+, episode: D\d+:\d+\)',
    'pipeline=[rrf_cos_ext]',
  )  # fmt: skip
  short = _write(tmp_path, _lines(tmp_path, depth=5), 'short.trec')
  _refused(
    tmp_path, short, rf'^{short}: used alone, the run must rank at least k=10 known items per question; one ranks 5',
    'pipeline=[ext]',
  )  # fmt: skip


def test_a_partial_match_over_the_threshold_stops_and_under_it_is_counted_in_results_md(tmp_path):
  lines = _lines(tmp_path)
  qids = list(dict.fromkeys(ln.split()[0] for ln in lines))
  gone = set(qids[:50])  # 50 of 197 questions lack lines (of 197)
  partial = _write(tmp_path, [ln for ln in lines if ln.split()[0] not in gone], 'partial.trec')
  _refused(
    tmp_path, partial, rf'^{partial}: the run has no lines for 50 of 197 questions .*over the threshold 0.2 ',
    'pipeline=[rrf_cos_ext]', 'ext_run_max_unmatched=0.2',
  )  # fmt: skip
  evaluate.run(_cfg(tmp_path, partial, 'pipeline=[rrf_cos_ext]'), tmp_path / 'ok')
  text = (tmp_path / 'ok' / 'results.md').read_text()
  assert f'- {partial}: 147 of 197 questions matched, 50 missing (first: ' in text, text
