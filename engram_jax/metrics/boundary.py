r"""Evidence boundaries: recall at the parent (session / record) and at the exact evidence (turn / fact), and a
bounded evidence policy that expands a retrieved item to its whole parent when the parent fits a token budget.

A retriever can find the right *parent* and still hand the reader the wrong passage of it: parent-level recall
then overstates what the reader sees. Both are reported side by side, with the policy that closes the gap at a
known cost (the Lore post "We retrieved the memory, then dropped the answer": return the whole record when it
fits the evidence budget, and score the exact evidence that was actually handed over).

Definitions, for one question with gold items :math:`G`, gold parents :math:`G_p` and top-k items :math:`R`:

.. math::
  \text{exact} = |G \cap R| / |G|, \qquad \text{parent} = |G_p \cap \mathrm{par}(R)| / |G_p|,
  \qquad \text{expanded} = |G \cap X| / |G|

where :math:`X \supseteq R` is the evidence packet of :func:`expand_to_parents`. Plain Python over
:class:`~engram_jax.core.types.Episode` and item ids (what ``results.json`` stores); no JAX.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from engram_jax.core.errors import EngramError
from engram_jax.core.types import Episode, Question

TokenCount = Callable[[str], int]
_WORD = re.compile(r'\S+')


def whitespace_tokens(text: str) -> int:
  """Whitespace-separated words: a tokenizer-free, reproducible token count."""
  return len(_WORD.findall(text))


def chars4_tokens(text: str) -> int:
  """``ceil(len / 4)``: the usual characters-per-token rule of thumb for English BPE tokenizers."""
  return math.ceil(len(text) / 4)


TOKENIZERS: dict[str, TokenCount] = {'whitespace': whitespace_tokens, 'chars4': chars4_tokens}


def gold_parents(episode: Episode, question: Question) -> set[str]:
  """The question's gold parents, or the parents of its gold items when it lists none."""
  if question.gold_parents:
    return set(question.gold_parents)
  parent = {it.id: it.parent for it in episode.items}
  return {parent[g] for g in question.gold}


def exact_recall(retrieved: Sequence[str], gold: Iterable[str], *, k: int | None = None) -> float:
  """Fraction of ``gold`` item ids among ``retrieved[:k]`` (all of ``retrieved`` when ``k`` is None)."""
  gold = set(gold)
  if not gold:
    raise ValueError('exact_recall: empty gold')
  got = set(retrieved if k is None else retrieved[:k])
  return len(gold & got) / len(gold)


def parent_recall(retrieved: Sequence[str], episode: Episode, question: Question, *, k: int | None = None) -> float:
  """Fraction of the question's gold parents that hold at least one of ``retrieved[:k]``."""
  parent = {it.id: it.parent for it in episode.items}
  gold = gold_parents(episode, question)
  found = {parent[i] for i in (retrieved if k is None else retrieved[:k])}
  return len(gold & found) / len(gold)


@dataclasses.dataclass(frozen=True)
class Expansion:
  """The evidence packet of one question.

  Attributes:
    ids: item ids handed to the reader: the retrieved items, then each expanded parent's other items
      (in write order), in rank order of the parent's first retrieved item.
    tokens: tokens of every item in ``ids`` (the budget actually spent).
    base_tokens: tokens of the retrieved items alone (what no expansion would spend).
    expanded: parents expanded whole.
    skipped: parents not expanded (too large for ``max_parent_tokens`` or the remaining ``budget``).
  """

  ids: tuple[str, ...]
  tokens: int
  base_tokens: int
  expanded: tuple[str, ...]
  skipped: tuple[str, ...]


class ParentIndex:
  """Per-episode lookups for expansion: item -> parent, parent -> items (write order), item token counts."""

  def __init__(self, episode: Episode, count_tokens: TokenCount = whitespace_tokens):
    self.parent = {it.id: it.parent for it in episode.items}
    self.tokens = {it.id: int(count_tokens(it.text)) for it in episode.items}
    self.children: dict[str, list[str]] = {}
    for it in episode.items:
      self.children.setdefault(it.parent, []).append(it.id)
    self.parent_tokens = {p: sum(self.tokens[i] for i in ids) for p, ids in self.children.items()}


def expand_to_parents(
  retrieved: Sequence[str], index: ParentIndex, *, max_parent_tokens: int | None, budget: int | None = None
) -> Expansion:
  """Bounded parent expansion: a retrieved item brings its whole parent when the parent fits.

  Policy: the retrieved items are always in the packet (their tokens are spent first). Then, in rank order of
  their first retrieved item, each parent is expanded whole (all its items join the packet) if its total size
  is at most ``max_parent_tokens`` and the items it adds still fit within ``budget`` tokens for the whole packet;
  otherwise it is skipped (the retrieved item stays alone) and later, smaller parents may still be expanded.
  ``max_parent_tokens=0`` (or ``None`` with ``budget=0``) is no expansion; ``None`` limits are unbounded.

  Args:
    retrieved: ranked item ids (e.g. a pipeline's top-k from ``results.json``).
    index: the episode's :class:`ParentIndex`.
    max_parent_tokens: the largest parent (in tokens) that may be expanded; None = any size.
    budget: token cap on the whole packet; None = no cap beyond ``max_parent_tokens``.

  Returns:
    the :class:`Expansion`; unknown ids raise ``KeyError`` naming the id.
  """
  for i in retrieved:
    if i not in index.parent:
      raise KeyError(f'expand_to_parents: unknown item id {i!r}')
  packet = list(dict.fromkeys(retrieved))
  have = set(packet)
  spent = base = sum(index.tokens[i] for i in packet)
  expanded, skipped = [], []
  for p in dict.fromkeys(index.parent[i] for i in packet):
    extra = [c for c in index.children[p] if c not in have]
    cost = sum(index.tokens[c] for c in extra)
    fits_parent = max_parent_tokens is None or index.parent_tokens[p] <= max_parent_tokens
    fits_budget = budget is None or spent + cost <= budget
    if fits_parent and fits_budget:
      packet.extend(extra)
      have.update(extra)
      spent += cost
      expanded.append(p)
    else:
      skipped.append(p)
  return Expansion(ids=tuple(packet), tokens=spent, base_tokens=base, expanded=tuple(expanded), skipped=tuple(skipped))


@dataclasses.dataclass(frozen=True)
class BoundaryScores:
  """Per-question values ``[Q]`` for one pipeline (lists of floats, row i = question i)."""

  exact: list[float]
  parent: list[float]
  expanded: list[float]
  tokens: list[float]
  base_tokens: list[float]
  expanded_parents: list[float]
  same_budget: list[float] | None = None  # exact recall of the longest ranked prefix within ``tokens``
  same_budget_short: list[float] | None = None  # 1 where the ranked list ran out before ``tokens`` was reached


def boundary_scores(
  records: Sequence[tuple[Episode, Question, Sequence[str]]],
  *,
  k: int,
  max_parent_tokens: int | None,
  budget: int | None = None,
  count_tokens: TokenCount = whitespace_tokens,
  indexes: Mapping[str, ParentIndex] | None = None,
) -> BoundaryScores:
  """Exact, parent and expanded-exact recall and tokens spent for ``(episode, question, ranked ids)`` rows.

  The top ``k`` of each ranking is the retrieved set. When every ranking is longer than ``k``, the same-budget
  control is filled too: the exact recall of the longest prefix of the ranking whose tokens fit within what the
  expanded packet spent (more retrieved items instead of whole parents, at the same token cost).

  ``indexes`` (episode id -> :class:`ParentIndex`) may be passed to reuse token counts across calls.
  """
  cache: dict[str, ParentIndex] = dict(indexes or {})
  control = all(len(ids) > k for _, _, ids in records)
  out = BoundaryScores([], [], [], [], [], [], [] if control else None, [] if control else None)
  for ep, q, ids in records:
    if ep.id not in cache:
      cache[ep.id] = ParentIndex(ep, count_tokens)
    top = list(ids)[:k]
    x = expand_to_parents(top, cache[ep.id], max_parent_tokens=max_parent_tokens, budget=budget)
    out.exact.append(exact_recall(top, q.gold))
    out.parent.append(parent_recall(top, ep, q))
    out.expanded.append(exact_recall(x.ids, q.gold))
    out.tokens.append(float(x.tokens))
    out.base_tokens.append(float(x.base_tokens))
    out.expanded_parents.append(float(len(x.expanded)))
    if control:
      prefix, spent = [], 0
      for i in ids:
        spent += cache[ep.id].tokens[i]
        if spent > x.tokens:
          break
        prefix.append(i)
      out.same_budget.append(exact_recall(prefix, q.gold))
      out.same_budget_short.append(float(spent <= x.tokens))
  return out


def parent_recall_at(ep: Episode, q: Question, ranked: list[int], k: int) -> float:
  """Fraction of the question's gold parents (session / record; the gold items' parents when none are given)
  that contain at least one of the top ``k`` items: recall at the parent boundary (``parent_recall@k``)."""
  gold = set(q.gold_parents) or {ep.items[i].parent for i in (ep.index_of()[g] for g in q.gold)}
  found = {ep.items[i].parent for i in ranked[:k] if i >= 0}
  return len(gold & found) / len(gold)


def parent_ranking(ep: Episode, ranked: Sequence[int]) -> list[str]:
  """The parents of the ranked items (indices into ``ep.items``; negative indices, padding, are skipped), each
  once, in the order of its first ranked item: a turn ranking collapsed to its sessions."""
  return list(dict.fromkeys(ep.items[i].parent for i in ranked if i >= 0))


def field_session_recall_any_at(ep: Episode, q: Question, ranked: list[int], k: int) -> float:
  """The field's headline session recall (``field_session_recall_any@k``): 1.0 when any of the question's gold
  parents (``Question.gold_parents``; the gold items' parents when none are given) is among the first ``k``
  distinct parents of the ranking (:func:`parent_ranking`), else 0.0. Not an official metric of either benchmark.

  The protocol of memory packages' published ``R@5`` (read in their benchmark scripts; see ``docs/peers.md``):

  * LongMemEval_S: the session is the unit, gold = the question's ``answer_session_ids``, every question of the
    file scored, the 30 abstention (``_abs``) questions and those without user-side evidence included (the
    official retrieval metric skips both and takes its gold from ids containing ``answer`` only). MemPalace
    ``benchmarks/longmemeval_bench.py`` (raw mode: one document per session), agentmemory
    ``benchmark/longmemeval-bench.ts`` and RecallOS ``backend/src/bench/longmemeval.ts`` (turns folded to
    sessions, first occurrence first). Run with ``dataset=longmemeval_s_field`` (all 498 questions of our copy,
    gold = ``answer_session_ids``); at session level the first ``k`` sessions are the first ``k`` items, a repeated
    session (13 filler copies in S) counting once.
  * LoCoMo: RecallOS ``backend/src/bench/locomo.ts`` "session-level R@5": the turn ranking folded to sessions in
    order of first occurrence, hit when a session holding an evidence turn is among the first ``k``
    (``dataset=locomo_field``).

  The ranking must reach ``k`` distinct parents: when it holds fewer and does not cover the whole episode, a
  one-line :class:`~engram_jax.core.errors.EngramError` asks for a larger ``eval.k`` (a short ranking would
  otherwise be scored as a miss).

  Example:
    >>> from engram_jax.core.types import Episode, Item, Question
    >>> items = tuple(Item(f't{j}', 'x', s, j) for j, s in enumerate(['S1', 'S1', 'S2', 'S3']))
    >>> ep = Episode('e', items, (Question('q', '?', ('t3',), ('S3',), 1),))
    >>> field_session_recall_any_at(ep, ep.questions[0], [0, 1, 3, 2], k=2)  # sessions S1, S3: a hit at 2
    1.0
  """
  gold = set(q.gold_parents) or {ep.items[i].parent for i in (ep.index_of()[g] for g in q.gold)}
  parents = parent_ranking(ep, ranked)
  if len(parents) < k and sum(i >= 0 for i in ranked) < ep.n_items:
    raise EngramError(
      f'{ep.id}: the top {len(ranked)} items cover {len(parents)} distinct parents, fewer than k={k} '
      f'(field_session_recall_any@{k}); raise eval.k'
    )
  return float(any(p in gold for p in parents[:k]))
