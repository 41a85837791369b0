"""A TREC run written by another system, for the ``trec_run`` leg (docs/formats.md, "A run from another system as a
leg"): rank_bm25 over each LoCoMo conversation's items, one ranked list per question, written line by line here
(not by the project's writer, :mod:`engram_jax.eval.trec`).

  python -m experiments.research.external_run --out outputs/ext/bm25plus.trec
  python -m experiments.evaluate 'pipeline=[cosine,ext,rrf_cos_ext]' ext_run=outputs/ext/bm25plus.trec

The default system is rank_bm25's ``BM25Plus`` (a lower-bounded term frequency: a long item that holds a query term
is never scored below one that does not) over lower-cased word tokens without English stop words: a lexical
retriever that differs from the project's BM25 leg (``BM25Okapi`` over every word). ``--variant okapi
--stopwords none`` is the project's BM25 leg computed by rank_bm25 itself.

Each question's ``--depth`` best items are written (all of them when fewer), score descending, ties by item order
(``numpy.argsort``, stable); ``qid`` is the question id and ``docid`` the item id, as ``experiments.evaluate``'s
own run files name them.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rank_bm25 import BM25L, BM25Okapi, BM25Plus

from engram_jax.core.types import Episode

VARIANTS = {'okapi': BM25Okapi, 'plus': BM25Plus, 'l': BM25L}
# English stop words (NLTK's list, abridged)
STOPWORDS = frozenset(
  'a about above after again against all am an and any are as at be because been before being below between both '
  'but by can did do does doing down during each few for from further had has have having he her here hers herself '
  'him himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only '
  'or other our ours ourselves out over own s same she should so some such t than that the their theirs them '
  'themselves then there these they this those through to too under until up very was we were what when where '
  'which while who whom why will with you your yours yourself yourselves'.split()
)
_WORD = re.compile(r'\w+')


def tokens(text: str, *, stopwords: bool) -> list[str]:
  out = _WORD.findall(text.lower())
  return [t for t in out if t not in STOPWORDS] if stopwords else out


def run_lines(
  episodes: Sequence[Episode], *, variant: str = 'plus', stopwords: bool = True, depth: int = 100, tag: str = ''
) -> list[str]:
  """``qid Q0 docid rank score tag`` lines: per question, rank_bm25's ``depth`` best items of its episode."""
  cls = VARIANTS[variant]
  tag = tag or f'rank_bm25-{variant}' + ('-stop' if stopwords else '')
  lines = []
  for ep in episodes:
    index = cls([tokens(it.text, stopwords=stopwords) or [''] for it in ep.items])
    ids = [it.id for it in ep.items]
    for q in ep.questions:
      scores = np.asarray(index.get_scores(tokens(q.text, stopwords=stopwords)), np.float64)
      order = np.argsort(-scores, kind='stable')[:depth]
      for r, j in enumerate(order, start=1):
        if re.search(r'\s', q.id + ids[j]):
          raise ValueError(f'an id holds whitespace, which a TREC line cannot: {q.id!r} / {ids[j]!r}')
        lines.append(f'{q.id} Q0 {ids[j]} {r} {scores[j]:.6f} {tag}')
  return lines


def write_run(episodes: Sequence[Episode], path: str | Path, **kwargs) -> Path:
  """Write :func:`run_lines` to ``path`` (folders created); returns it."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text('\n'.join(run_lines(episodes, **kwargs)) + '\n')
  return path


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--out', required=True, help='the run file to write')
  ap.add_argument('--root', default=None, help='data root (default: the project data root)')
  ap.add_argument('--variant', choices=sorted(VARIANTS), default='plus')
  ap.add_argument('--stopwords', choices=('english', 'none'), default='english')
  ap.add_argument('--depth', type=int, default=100)
  args = ap.parse_args(argv)
  from engram_jax.data.locomo import load_locomo

  episodes, _ = load_locomo(args.root, template='dated')
  path = write_run(episodes, args.out, variant=args.variant, stopwords=args.stopwords == 'english', depth=args.depth)
  n_q = sum(len(ep.questions) for ep in episodes)
  print(f'wrote {path}: {n_q} questions, {len(episodes)} conversations, depth {args.depth}')


if __name__ == '__main__':
  main()
