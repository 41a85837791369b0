"""experiments.lucene.reference: the project's Lucene-form BM25 leg equals Lucene itself per question on LoCoMo's
conv-26 (runs where Java 21+ is found; the Anserini jar is fetched once into .cache/lucene when missing), and
``compare`` counts what differs."""

from __future__ import annotations

import numpy as np
import pytest

from engram_jax.core.lexicon import ANALYZERS
from engram_jax.core.types import Episode, Item, Question
from engram_jax.data import io
from experiments.lucene import reference

HAVE_LOCOMO = (io.resolve_data_root() / 'locomo' / 'locomo10.json').is_file()


def _requirements() -> str | None:
  """Why the parity test cannot run here (None when it can). The jar is fetched from PyPI when missing (pyserini
  2.4.0's source archive, sha256 pinned; CI has the package index), so a clean clone runs the test too."""
  if reference.find_java() is None:
    return f'no Java {reference.JAVA_MIN}+ (JAVA_HOME, PATH, /usr/lib/jvm)'
  if not HAVE_LOCOMO:
    return 'LoCoMo not found under the data root'
  if reference.jar_path() is None:
    try:
      reference.fetch_jar()
    except (RuntimeError, OSError) as e:
      return f'no Anserini jar under {reference.CACHE} and fetching it failed: {e}'
  return None


@pytest.mark.slow  # a JVM start and a LoCoMo conversation (about 20 s)
def test_lucene_form_equals_lucene_on_conv_26(tmp_path):
  missing = _requirements()
  if missing:
    pytest.skip(missing)
  episodes = reference.load_episodes(['dataset=locomo', 'dataset.loader.conversations=[conv-26]'])
  assert [ep.id for ep in episodes] == ['conv-26']
  lucene = reference.lucene_run(
    episodes, tmp_path, java=reference.find_java(), jar=reference.jar_path(), k1=reference.K1, b=reference.B
  )
  report = reference.compare(episodes, lucene, reference.project_scores(episodes), k=10)
  c = report['counts']
  n_questions = sum(len(ep.questions) for ep in episodes)
  n_texts = sum(ep.n_items + len(ep.questions) for ep in episodes)
  assert c['questions'] == n_questions > 100 and c['texts'] == n_texts
  assert c.get('texts_tokens_differ', 0) == 0, report['token_diffs']
  no_hits = c.get('lucene_no_hits', 0)
  assert c.get('ours_all_zero_where_lucene_no_hits', 0) == no_hits
  assert c['top_k_equal'] == n_questions - no_hits and c.get('top_k_differ', 0) == 0, report['top_k_differ']
  assert report['max_abs_score_diff'] < 1e-4 and c.get('score_diff_gt_1e-4', 0) == 0
  assert (tmp_path / 'lucene.trec').is_file() and (tmp_path / 'lucene_tokens.tsv').is_file()
  # Lucene scored with the pipeline's k1 and b: another b moves its scores away from the project's at 0.4
  other = reference.compare(episodes, lucene, reference.project_scores(episodes, b=0.75), k=10)
  assert other['max_abs_score_diff'] > 1e-2


def _episode():
  texts = ['Caroline went running in the park', 'The dogs were running', 'A cat sat', 'Paris trip']
  items = tuple(Item(id=f'e:{i}', text=t, parent=f'e:s{i}', position=i) for i, t in enumerate(texts))
  questions = tuple(
    Question(id=f'e/q{j}', text=t, gold=('e:0',), gold_parents=('e:s0',), category=0)
    for j, t in enumerate(['running park', 'dogs cat', 'zebra'])
  )
  return Episode(id='e', items=items, questions=questions)


def test_compare_counts_a_differing_top_k_and_a_token_difference():
  ep = _episode()
  tokens = {('D', 'e', it.id): ANALYZERS['english'](it.text) for it in ep.items}
  tokens |= {('Q', 'e', q.id): ANALYZERS['english'](q.text) for q in ep.questions}
  tokens[('D', 'e', 'e:2')] = ['a', 'cat', 'sat']  # Lucene keeps the stop word 'a' here: a token difference
  run = {
    'e/q0': [('e:0', 2.0), ('e:1', 0.5)],  # our top 2 below is the same
    'e/q1': [('e:2', 1.0), ('e:1', 0.9)],  # ours: e:1 first
  }  # q2: Lucene returns nothing (and ours are all 0)
  lucene = reference.LuceneRun(run, tokens)
  scores = np.array(
    [
      [2.0, 0.5 + 3e-5, 0.0, 0.0],
      [0.0, 1.2, 1.0, 0.0],
      [0.0, 0.0, 0.0, 0.0],
    ]
  )
  report = reference.compare([ep], lucene, [scores], k=2)
  c = report['counts']
  assert c['questions'] == 3 and c['texts'] == 7
  assert c['top_k_equal'] == 1 and c['top_k_differ'] == 1 and c['lucene_no_hits'] == 1
  assert c['ours_all_zero_where_lucene_no_hits'] == 1
  assert report['top_k_differ'] == [{'question': 'e/q1', 'ours': ['e:1', 'e:2'], 'lucene': ['e:2', 'e:1']}]
  assert c['texts_tokens_differ'] == 1
  assert report['token_diffs'] == [{'id': 'e:2', 'ours': ['cat', 'sat'], 'lucene': ['a', 'cat', 'sat']}]
  assert report['max_abs_score_diff'] == pytest.approx(0.3)  # e/q1's e:1: 1.2 against 0.9
  assert c['score_diff_gt_1e-4'] == 1
  assert "top-2 equal to Lucene's 1, differ 1" in reference.summary(report)


def test_compare_tie_rules():
  """Tied scores: compared under Lucene's rule (the lower item first); the project's rule (the later first) is
  counted apart, not as a difference."""
  ep = _episode()
  tokens = {('D', 'e', it.id): ANALYZERS['english'](it.text) for it in ep.items}
  tokens |= {('Q', 'e', q.id): ANALYZERS['english'](q.text) for q in ep.questions}
  run = {'e/q0': [('e:0', 1.0), ('e:1', 1.0)], 'e/q1': [('e:1', 2.0)]}
  scores = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0] * 4])
  report = reference.compare([ep], reference.LuceneRun(run, tokens), [scores], k=2)
  c = report['counts']
  assert c['top_k_equal'] == 2 and c.get('top_k_differ', 0) == 0 and c.get('texts_tokens_differ', 0) == 0
  assert c['project_tie_rule_reorders'] == 1 and c['project_tie_rule_reorders_same_set'] == 1
  assert c['fewer_than_k_hits'] == 1 and report['max_abs_score_diff'] == 0.0
