"""Analyzers and sparse term statistics: what BM25 reads, built once per episode on the host.

An analyzer turns a text into the terms BM25 counts (:class:`Analyzer`: the token pattern, lower-casing, Lucene's
English possessive filter, a stop list, a stemmer). The registered ones (:data:`ANALYZERS`, also named
:data:`TOKENIZERS`) are what a BM25 leg's ``tokenizer`` knob names:

* ``'words'`` (:func:`tokenize`, the default and every number published before the Lucene-grade leg): lower-case
  ``\\w+`` runs; no stop list, no stemming;
* ``'flat'`` (:func:`flat_tokenize`): LongMemEval's official ``flat-bm25`` tokens (``text.split(' ')``, case kept,
  punctuation kept, ``''`` tokens kept, an empty text is ``['']``);
* ``'english'``: Lucene's English analyzer as Anserini runs it (``DefaultEnglishAnalyzer``): Unicode word
  segmentation (UAX #29, Lucene's ``StandardTokenizer``), a trailing ``'s`` dropped, lower case, Lucene's 33
  English stop words, the Porter stemmer (checked against Lucene's own tokens: ``experiments.lucene``);
* ``'english_snowball'``: the same with the Snowball (Porter2) English stemmer; ``'english_nostem'`` without a
  stemmer; ``'english_stop179'``: the same with the 179-word English stop list (NLTK's, as bm25s ships it);
  ``'words_porter'``: today's ``\\w+`` tokens, Porter-stemmed.

The stemmers are NLTK's (``PorterStemmer`` in its ``MARTIN_EXTENSIONS`` mode, the reference implementation Lucene's
``PorterStemFilter`` follows; ``SnowballStemmer('english')``), the stop lists bm25s's (``STOPWORDS_EN``: Lucene's 33;
``STOPWORDS_EN_PLUS``: 179). A :class:`Lexicon` holds one analyzer's term statistics of an episode: each item's
distinct terms (vocabulary columns, ascending) and their counts ``[N, L]``, each question's distinct in-vocabulary
terms and counts ``[Q, T]``, and the vocabulary mask ``[V]``; nothing ``[N, V]`` is built.
:func:`engram_jax.core.batch.episode_arrays` builds one per analyzer asked for, keyed by its name;
:mod:`engram_jax.ops.bm25` scores from it. This module imports no operator, so the episode arrays and the operators
import in one direction (``lexicon <- batch <- ops``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
from jax import Array

from engram_jax.core import pytree
from engram_jax.core.padding import bucket

_TOKEN = re.compile(r'\w+')

PATTERNS = ('words', 'uax29', 'space')
STOP_LISTS = ('none', 'lucene', 'stop179')
STEMMERS = ('none', 'porter', 'snowball')


def tokenize(text: str) -> list[str]:
  """Lower-case word tokens (``\\w+``): the ``'words'`` analyzer."""
  return _TOKEN.findall(text.lower())


def flat_tokenize(text: str) -> list[str]:
  """LongMemEval ``flat-bm25`` tokens: ``text.split(' ')`` (case-sensitive; ``''`` tokens kept)."""
  return text.split(' ')


@functools.cache
def _uax29():
  """(segmenter, keep) regexes: Unicode default word boundaries (the ``regex`` module's WORD flag implements UAX #29,
  as Lucene's StandardTokenizer does) and the segments kept as tokens: those holding a character of the word-break
  classes StandardTokenizer emits (letters, numerals, Katakana, Hebrew letters, ideographs, Hiragana, Hangul,
  South-East Asian scripts, emoji); segments of underscores, combining marks or other number signs (``'¾'``) alone
  are dropped, as there."""
  import regex  # a dependency of transformers and nltk; imported on first use

  return (
    regex.compile(r'\b', flags=regex.WORD | regex.V1),
    regex.compile(
      r'[\p{WB=ALetter}\p{WB=Hebrew_Letter}\p{WB=Numeric}\p{WB=Katakana}\p{Ideographic}\p{Script=Hiragana}'
      r'\p{Script=Hangul}\p{Line_Break=Complex_Context}\p{Extended_Pictographic}]'
    ),
  )


MAX_TOKEN_LENGTH = 255  # Lucene's StandardTokenizer splits a longer token into pieces of this many characters


def uax29_tokenize(text: str) -> list[str]:
  """Unicode word segments (UAX #29) that hold a letter, digit or emoji: Lucene's ``StandardTokenizer`` tokens,
  case kept (``"Caroline's"``, ``"3.5"``, ``"don't"`` stay one token; hyphens split; a token over 255 characters is
  split every 255, as there)."""
  split, keep = _uax29()
  out = []
  for s in split.split(text):
    if s and keep.search(s):
      out += [s[i : i + MAX_TOKEN_LENGTH] for i in range(0, len(s), MAX_TOKEN_LENGTH)]
  return out


def lucene_lower(token: str) -> str:
  """Lower case character by character, as Java's ``Character.toLowerCase`` (Lucene's LowerCaseFilter): no context
  (a final ``'Σ'`` becomes ``'σ'``, not ``'ς'``), and ``'İ'`` becomes ``'i'`` (the one character whose full lower
  case in Python is two characters)."""
  return ''.join('i' if c == '\u0130' else c.lower() for c in token)


_POSSESSIVE = re.compile("['\u2019\uff07][sS]$")


@functools.cache
def stop_words(name: str) -> frozenset[str]:
  """The stop list ``name`` (:data:`STOP_LISTS`): ``'none'``, ``'lucene'`` (Lucene's 33 English stop words) or
  ``'stop179'`` (NLTK's 179), as bm25s ships them."""
  if name == 'none':
    return frozenset()
  from bm25s import stopwords  # imported on first use

  lists = {'lucene': stopwords.STOPWORDS_EN, 'stop179': stopwords.STOPWORDS_EN_PLUS}
  if name not in lists:
    raise ValueError(f'Unknown stop list {name!r}; known: {list(STOP_LISTS)}')
  return frozenset(lists[name])


@functools.cache
def stemmer(name: str) -> Callable[[str], str]:
  """The stemmer ``name`` (:data:`STEMMERS`), memoised per word: NLTK's Porter (``MARTIN_EXTENSIONS``, Lucene's
  ``PorterStemFilter``) or Snowball English; ``'none'`` is the identity."""
  if name == 'none':
    return lambda word: word
  from nltk.stem import PorterStemmer, SnowballStemmer  # imported on first use

  if name == 'porter':
    stem = PorterStemmer(PorterStemmer.MARTIN_EXTENSIONS).stem
  elif name == 'snowball':
    stem = SnowballStemmer('english').stem
  else:
    raise ValueError(f'Unknown stemmer {name!r}; known: {list(STEMMERS)}')
  return functools.lru_cache(maxsize=1 << 18)(stem)


@dataclasses.dataclass(frozen=True)
class Analyzer:
  """Text -> the terms BM25 counts, in order: split by ``pattern``; drop a trailing ``'s`` (``possessive``, Lucene's
  EnglishPossessiveFilter, before lower-casing as there); lower-case; drop the stop list's words; stem.

  Attributes:
    pattern: ``'words'`` (``\\w+`` runs), ``'uax29'`` (Unicode word segments, Lucene's StandardTokenizer) or
      ``'space'`` (``text.split(' ')``).
    lowercase: lower-case each token.
    possessive: drop a trailing ``'s`` / ``\u2019s``.
    stopwords: a stop list of :data:`STOP_LISTS`.
    stem: a stemmer of :data:`STEMMERS`.

  Example:
    >>> from engram_jax.core.lexicon import ANALYZERS
    >>> ANALYZERS['english']("Caroline's dogs were running in the park")
    ['carolin', 'dog', 'were', 'run', 'park']
    >>> ANALYZERS['words']("Caroline's dogs were running in the park")
    ['caroline', 's', 'dogs', 'were', 'running', 'in', 'the', 'park']
  """

  pattern: str = 'words'
  lowercase: bool = True
  possessive: bool = False
  stopwords: str = 'none'
  stem: str = 'none'

  def __post_init__(self) -> None:
    for name, value, allowed in (
      ('pattern', self.pattern, PATTERNS),
      ('stopwords', self.stopwords, STOP_LISTS),
      ('stem', self.stem, STEMMERS),
    ):
      if value not in allowed:
        raise ValueError(f'Analyzer: {name} must be one of {list(allowed)}, got {value!r}')

  def __call__(self, text: str) -> list[str]:
    if self.pattern == 'words' and self.lowercase:
      tokens = tokenize(text)
    elif self.pattern == 'space':
      tokens = flat_tokenize(text)
    elif self.pattern == 'words':
      tokens = _TOKEN.findall(text)
    else:
      tokens = uax29_tokenize(text)
    if self.possessive:
      tokens = [_POSSESSIVE.sub('', t) for t in tokens]
    if self.lowercase and self.pattern == 'uax29':
      tokens = [lucene_lower(t) for t in tokens]
    elif self.lowercase and self.pattern != 'words':
      tokens = [t.lower() for t in tokens]
    stop = stop_words(self.stopwords)
    stem = stemmer(self.stem)
    return [stem(t) for t in tokens if t not in stop]


_ENGLISH = {'pattern': 'uax29', 'possessive': True, 'stopwords': 'lucene'}
ANALYZERS: dict[str, Analyzer] = {
  'words': Analyzer(),
  'flat': Analyzer(pattern='space', lowercase=False),
  'words_porter': Analyzer(stem='porter'),
  'english': Analyzer(**_ENGLISH, stem='porter'),
  'english_snowball': Analyzer(**_ENGLISH, stem='snowball'),
  'english_nostem': Analyzer(**_ENGLISH),
  'english_stop179': Analyzer(**{**_ENGLISH, 'stopwords': 'stop179'}, stem='porter'),
}
# The analyzers under the name the BM25 knob and episode_arrays use (``tokenizer``; kept: saved fits name it).
TOKENIZERS: dict[str, Callable[[str], list[str]]] = ANALYZERS


def get_tokenizer(name: str) -> Callable[[str], list[str]]:
  """The analyzer named ``name`` (a key of :data:`ANALYZERS`); ValueError on unknown names."""
  if name not in ANALYZERS:
    raise ValueError(f'Unknown tokenizer (analyzer) {name!r}; known: {sorted(ANALYZERS)}')
  return ANALYZERS[name]


def build_vocab(docs_tokens: Sequence[Sequence[str]]) -> dict[str, int]:
  """Token -> column, in first-seen order over the corpus."""
  vocab: dict[str, int] = {}
  for toks in docs_tokens:
    for t in toks:
      if t not in vocab:
        vocab[t] = len(vocab)
  return vocab


def term_counts(
  tokens: Sequence[Sequence[str]], vocab: dict[str, int], *, n_rows: int | None = None, n_cols: int | None = None
) -> np.ndarray:
  """Term-count matrix ``[R, V]`` (float32); out-of-vocabulary tokens are ignored, rows/cols zero-padded.

  Args:
    tokens: R token lists.
    vocab: token -> column.
    n_rows, n_cols: padded sizes (>= R and >= len(vocab)).
  """
  n_rows = len(tokens) if n_rows is None else n_rows
  n_cols = len(vocab) if n_cols is None else n_cols
  if n_rows < len(tokens) or n_cols < len(vocab):
    raise ValueError(f'Shape mismatch: padding ({n_rows}, {n_cols}) smaller than ({len(tokens)}, {len(vocab)})')
  out = np.zeros((n_rows, n_cols), np.float32)
  for r, toks in enumerate(tokens):
    for t in toks:
      c = vocab.get(t)
      if c is not None:
        out[r, c] += 1.0
  return out


@pytree.dataclass
class Lexicon:
  """One tokenizer's sparse term statistics of an episode (padded; ``L``, ``T``, ``V`` bucketed).

  Padding entries have column 0 and count 0 (they add exactly 0 to every sum).
  """

  doc_terms: Array  # [N, L] int32 vocabulary column of each distinct term of each item, ascending
  doc_counts: Array  # [N, L] float32 its count in the item
  query_terms: Array  # [Q, T] int32 distinct in-vocabulary query terms, ascending
  query_counts: Array  # [Q, T] float32 their counts in the question (repetition kept)
  vocab_where: Array  # [V] True for real vocabulary columns (the static vocabulary size)

  def dense(self) -> tuple[np.ndarray, np.ndarray]:
    """``(query_tf [Q, V], doc_tf [N, V])`` dense term counts (NumPy; for tests and small references)."""
    v = self.vocab_where.shape[-1]
    out = []
    for terms, counts in ((self.query_terms, self.query_counts), (self.doc_terms, self.doc_counts)):
      terms, counts = np.asarray(terms), np.asarray(counts)
      m = np.zeros((terms.shape[0], v), np.float32)
      np.add.at(m, (np.arange(terms.shape[0])[:, None], terms), counts)
      out.append(m)
    return out[0], out[1]


def _sparse_rows(rows: Sequence[Sequence[int]], n_rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Distinct ids (ascending) and their counts of each row, padded to ``[n_rows, width]`` (id 0, count 0)."""
  terms = np.zeros((n_rows, width), np.int32)
  counts = np.zeros((n_rows, width), np.float32)
  for r, ids in enumerate(rows):
    if ids:
      c = Counter(ids)
      cols = sorted(c)
      terms[r, : len(cols)] = cols
      counts[r, : len(cols)] = [c[x] for x in cols]
  return terms, counts


def build_lexicon(
  doc_tokens: Sequence[Sequence[str]],
  query_tokens: Sequence[Sequence[str]],
  *,
  n_rows: int,
  q_rows: int,
  l_multiple: int = 16,
  t_multiple: int = 8,
  v_multiple: int = 1024,
  vocab: dict[str, int] | None = None,
) -> Lexicon:
  """The :class:`Lexicon` of tokenised items and questions; the vocabulary is the items' (first-seen order) unless
  ``vocab`` is given, and query tokens outside it are dropped (they add 0 in rank_bm25 too).

  Args:
    doc_tokens: N token lists; query_tokens: Q token lists.
    n_rows, q_rows: padded N and Q (>= the real counts).
    l_multiple, t_multiple, v_multiple: bucket multiples of L, T and V (few distinct shapes, few compilations).
  """
  if n_rows < len(doc_tokens) or q_rows < len(query_tokens):
    raise ValueError(
      f'Shape mismatch: padding ({n_rows}, {q_rows}) smaller than ({len(doc_tokens)}, {len(query_tokens)})'
    )
  vocab = build_vocab(doc_tokens) if vocab is None else vocab
  d_ids = [[vocab[t] for t in toks] for toks in doc_tokens]
  q_ids = [[vocab[t] for t in toks if t in vocab] for toks in query_tokens]
  width = lambda rows, m: bucket(max((len(set(r)) for r in rows), default=1), m)
  doc_terms, doc_counts = _sparse_rows(d_ids, n_rows, width(d_ids, l_multiple))
  query_terms, query_counts = _sparse_rows(q_ids, q_rows, width(q_ids, t_multiple))
  v = bucket(max(len(vocab), 1), v_multiple)
  return Lexicon(
    doc_terms=doc_terms,
    doc_counts=doc_counts,
    query_terms=query_terms,
    query_counts=query_counts,
    vocab_where=np.arange(v) < len(vocab),
  )
