"""What an evaluation scored, in the IR field's formats: a TREC run per pipeline and the qrels of a dataset, so that
trec_eval, ir_measures, ranx or pyserini can re-check the numbers or extend them (``experiments.evaluate`` writes
them into its run folder: ``runs/<dataset>/<pipeline>.trec`` and ``qrels/<dataset>.qrels``; ``docs/formats.md``).

* run: one line per retrieved item, ``qid Q0 docid rank score tag``: each question's top-k exactly as scored (rank 1
  first, ties already broken by the project's rule, later item first: :func:`engram_jax.core.ranking.top_k`);
  ``score`` is ``k + 1 - rank`` (k the list's length), strictly decreasing, so that a tool which sorts by score (all
  of them do; trec_eval breaks score ties by docid) reads the ranking as scored. The pipelines' own fused scores are
  not written: evaluation keeps the top-k ids, not their scores. ``tag`` is the pipeline's name.
* qrels: ``qid 0 docid 1`` for every gold item of every scored question (binary relevance, as every label metric
  here).
* ``qid``: the question id (every bundled loader, the episodes file and BEIR keep question ids unique across a
  dataset); where ids repeat across episodes (episodes built by hand), every qid is ``<episode id>/<question id>``.
  Ids are written with ``%`` and whitespace percent-encoded (``%25``, ``%20``, ...), which the formats cannot hold.

Example:
  >>> from engram_jax.eval.trec import trec_qids, trec_qrels, trec_run
  >>> qids = trec_qids(['e1', 'e1'], ['q1', 'q2'])
  >>> print(trec_run(qids, [['d3', 'd1'], ['d2', 'd3']], tag='bm25'), end='')
  q1 Q0 d3 1 2 bm25
  q1 Q0 d1 2 1 bm25
  q2 Q0 d2 1 2 bm25
  q2 Q0 d3 2 1 bm25
  >>> print(trec_qrels(qids, [('d1',), ('d2', 'd3')]), end='')
  q1 0 d1 1
  q2 0 d2 1
  q2 0 d3 1
"""

from __future__ import annotations

from collections.abc import Sequence

from engram_jax.core.trecid import trec_id


def trec_qids(episode_ids: Sequence[str], question_ids: Sequence[str]) -> list[str]:
  """The run's query id of each question: its id when question ids are unique, else ``<episode>/<question>`` for
  every question; percent-encoded (:func:`trec_id`).

  Example:
    >>> from engram_jax.eval import trec_qids
    >>> trec_qids(['conv-26', 'conv-26'], ['conv-26/q0', 'conv-26/q1'])
    ['conv-26/q0', 'conv-26/q1']
    >>> trec_qids(['e1', 'e2'], ['q 1', 'q 1'])  # repeated across episodes: prefixed; a space percent-encoded
    ['e1/q%201', 'e2/q%201']
  """
  if len(set(question_ids)) == len(question_ids):
    return [trec_id(q) for q in question_ids]
  pairs = [f'{e}/{q}' for e, q in zip(episode_ids, question_ids)]
  if len(set(pairs)) != len(pairs):
    raise ValueError('a question id repeats within one episode: the run file could not tell the questions apart')
  return [trec_id(p) for p in pairs]


def trec_run(qids: Sequence[str], retrieved: Sequence[Sequence[str]], *, tag: str) -> str:
  """A TREC run (``qid Q0 docid rank score tag`` lines) of each question's retrieved item ids in rank order; a
  question with no retrieved ids (not run) has no line.

  Example:
    >>> from engram_jax.eval import trec_run
    >>> print(trec_run(['q1'], [['D1:3', 'D10:5']], tag='bm25'), end='')
    q1 Q0 D1:3 1 2 bm25
    q1 Q0 D10:5 2 1 bm25
  """
  tag = trec_id(tag)
  lines = []
  for qid, ids in zip(qids, retrieved, strict=True):
    k = len(ids)
    lines.extend(f'{qid} Q0 {trec_id(d)} {r} {k + 1 - r} {tag}' for r, d in enumerate(ids, start=1))
  return ''.join(line + '\n' for line in lines)


def trec_qrels(qids: Sequence[str], gold: Sequence[Sequence[str]]) -> str:
  """TREC qrels (``qid 0 docid 1`` lines) of each question's gold item ids.

  Example:
    >>> from engram_jax.eval import trec_qrels
    >>> print(trec_qrels(['q1'], [('D1:3', 'D9:17')]), end='')
    q1 0 D1:3 1
    q1 0 D9:17 1
  """
  return ''.join(f'{qid} 0 {trec_id(d)} 1\n' for qid, ids in zip(qids, gold, strict=True) for d in ids)


__all__ = ['trec_id', 'trec_qids', 'trec_qrels', 'trec_run']
