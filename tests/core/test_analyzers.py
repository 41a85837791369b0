"""The registered analyzers (engram_jax.core.lexicon.ANALYZERS) on fixed strings; ``'english'``'s tokens are the ones
Lucene's own analyzer gave for the same strings (Anserini 2.3.0's DefaultEnglishAnalyzer, run by
experiments/lucene/LuceneBm25.java and recorded here); ``'words'`` is the old lower-case ``\\w+`` tokenizer on any
text; unknown names and bad fields are refused in one line."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_jax.core import lexicon
from engram_jax.core.lexicon import ANALYZERS, Analyzer, get_tokenizer, lucene_lower, uax29_tokenize
from engram_jax.eval import pipeline

LONG = 'a' * 300 + ' b'

# Lucene's tokens (DefaultEnglishAnalyzer: StandardTokenizer, EnglishPossessiveFilter, LowerCaseFilter, StopFilter
# with its 33 English stop words, PorterStemFilter), as the Anserini jar printed them for these strings.
LUCENE_ENGLISH = {
  "Caroline's dogs were running in the park": ['carolin', 'dog', 'were', 'run', 'park'],
  "The U.S. economy grew 3.5% in 2023, didn't it?": ['u.', 'economi', 'grew', '3.5', '2023', "didn't"],
  "don't stop-believing well_known foo_bar __ ¾ x¾": ["don't", 'stop', 'believ', 'well_known', 'foo_bar', 'x'],
  'İstanbul İSTANBUL': ['istanbul', 'istanbul'],
  LONG: ['a' * 255, 'a' * 45, 'b'],
  "The cat’s toys aren't the dogs' toys": ['cat', 'toi', "aren't", 'dog', 'toi'],
  'connection connected connecting generously happily': ['connect', 'connect', 'connect', 'gener', 'happili'],
  'e-mail me at john.doe@example.com or visit www.example.com': [
    'e',
    'mail',
    'me',
    'john.do',
    'example.com',
    'visit',
    'www.example.com',
  ],
  '3,000 people; 1.2.3 v2 2nd': ['3,000', 'peopl', '1.2.3', 'v2', '2nd'],
  '日本語のテキスト 한국어 😀 done': ['日', '本', '語', 'の', 'テキスト', '한국어', '😀', 'done'],
  "CAROLINE'S Dog's JAMES'S it's ＇S x＇s": ['carolin', 'dog', 'jame', 's', 'x'],
  'the and a an are as at be but by for if in into is it no not of on or such that their then there these they '
  'this to was will with': [],
  'well-known self_made 42nd 1e10 0.5 .5 5. a.b.c. a..b': [
    'well',
    'known',
    'self_mad',
    '42nd',
    '1e10',
    '0.5',
    '5',
    '5',
    'a.b.c',
    'b',
  ],
  'hello_ _world_ ___': ['hello_', '_world_'],
  '': [],
}


@pytest.mark.parametrize('text', list(LUCENE_ENGLISH), ids=range(len(LUCENE_ENGLISH)))
def test_english_equals_lucenes_tokens(text):
  assert ANALYZERS['english'](text) == LUCENE_ENGLISH[text]


def test_final_sigma_lowercases_per_character_as_lucene():
  """Java's Character.toLowerCase (Lucene) maps each character alone: a final 'Σ' -> 'σ' (Lucene gave 'σίσυφοσ'),
  where Python's str.lower on the whole word gives 'ς'."""
  assert ANALYZERS['english']('ΣΊΣΥΦΟΣ') == ['σίσυφοσ']


def test_uax29_segments():
  assert uax29_tokenize("The U.S. economy grew 3.5% in 2023, didn't it?") == [
    'The',
    'U.S',
    'economy',
    'grew',
    '3.5',
    'in',
    '2023',
    "didn't",
    'it',
  ]
  assert uax29_tokenize("Caroline's stop-believing") == ["Caroline's", 'stop', 'believing']  # case kept
  # segments of underscores, combining marks or other number signs alone are dropped; a word's underscores stay
  assert uax29_tokenize('__ ¾ \u0301 x¾ foo_bar') == ['x', 'foo_bar']
  assert uax29_tokenize(LONG) == ['a' * 255, 'a' * 45, 'b']
  assert uax29_tokenize('b' * 510) == ['b' * 255, 'b' * 255]
  assert uax29_tokenize('') == [] and uax29_tokenize(' ,;- ') == []


def test_lucene_lower():
  assert lucene_lower('İSTANBUL') == 'istanbul' and len(lucene_lower('İ')) == 1
  assert 'İ'.lower() != 'i'  # what lucene_lower avoids: Python adds a combining dot
  assert lucene_lower('ÄÖÜ Straße') == 'äöü straße'


# the other analyzers on a few strings (stemmers: NLTK's Porter and Snowball; stop lists: Lucene's 33, NLTK's 179)
EXPECTED = {
  "Caroline's dogs were running in the park": {
    'words': ['caroline', 's', 'dogs', 'were', 'running', 'in', 'the', 'park'],
    'flat': ["Caroline's", 'dogs', 'were', 'running', 'in', 'the', 'park'],
    'words_porter': ['carolin', 's', 'dog', 'were', 'run', 'in', 'the', 'park'],
    'english_snowball': ['carolin', 'dog', 'were', 'run', 'park'],
    'english_nostem': ['caroline', 'dogs', 'were', 'running', 'park'],
    'english_stop179': ['carolin', 'dog', 'run', 'park'],  # 'were' is on the 179-word list only
  },
  "The cat’s toys aren't the dogs' toys, generously": {
    'words': ['the', 'cat', 's', 'toys', 'aren', 't', 'the', 'dogs', 'toys', 'generously'],
    'flat': ['The', 'cat’s', 'toys', "aren't", 'the', "dogs'", 'toys,', 'generously'],
    'words_porter': ['the', 'cat', 's', 'toi', 'aren', 't', 'the', 'dog', 'toi', 'gener'],
    'english': ['cat', 'toi', "aren't", 'dog', 'toi', 'gener'],
    'english_snowball': ['cat', 'toy', "aren't", 'dog', 'toy', 'generous'],  # Porter2 differs from Porter here
    'english_nostem': ['cat', 'toys', "aren't", 'dogs', 'toys', 'generously'],
    'english_stop179': ['cat', 'toi', 'dog', 'toi', 'gener'],  # "aren't" is on the 179-word list
  },
  "U.S. don't  3.5": {
    'words': ['u', 's', 'don', 't', '3', '5'],
    'flat': ['U.S.', "don't", '', '3.5'],  # LongMemEval's split(' '): '' tokens kept
    'words_porter': ['u', 's', 'don', 't', '3', '5'],
    'english': ['u.', "don't", '3.5'],
    'english_nostem': ['u.s', "don't", '3.5'],
    'english_stop179': ['u.', '3.5'],
  },
  '': {'words': [], 'flat': [''], 'english': [], 'english_stop179': []},
}


@pytest.mark.parametrize('text', list(EXPECTED), ids=range(len(EXPECTED)))
def test_registered_analyzers_on_fixed_strings(text):
  for name, expected in EXPECTED[text].items():
    assert ANALYZERS[name](text) == expected, name
    assert get_tokenizer(name)(text) == expected, name


def test_registry():
  assert set(ANALYZERS) == {
    'words',
    'flat',
    'words_porter',
    'english',
    'english_snowball',
    'english_nostem',
    'english_stop179',
  }
  assert lexicon.TOKENIZERS is ANALYZERS
  assert ANALYZERS['english'] == Analyzer(pattern='uax29', possessive=True, stopwords='lucene', stem='porter')
  assert ANALYZERS['words'] == Analyzer()
  assert len(lexicon.stop_words('lucene')) == 33 and len(lexicon.stop_words('stop179')) == 179
  assert lexicon.stop_words('lucene') < lexicon.stop_words('stop179')
  assert lexicon.stop_words('none') == frozenset()
  assert lexicon.stemmer('none')('running') == 'running' and lexicon.stemmer('porter')('running') == 'run'


def test_analyzer_fields_compose():
  text = "JAMES'S Dogs-Running"
  assert Analyzer(pattern='uax29', lowercase=False)(text) == ["JAMES'S", 'Dogs', 'Running']
  assert Analyzer(pattern='uax29', lowercase=False, possessive=True)(text) == ['JAMES', 'Dogs', 'Running']
  assert Analyzer(pattern='uax29', possessive=True, stem='porter')(text) == ['jame', 'dog', 'run']
  assert Analyzer(pattern='words', lowercase=False)(text) == ['JAMES', 'S', 'Dogs', 'Running']
  assert Analyzer(pattern='space')(text) == ["james's", 'dogs-running']
  assert Analyzer(pattern='space', lowercase=False, stopwords='lucene')('The the') == [
    'The'
  ]  # stop lists are lower case


_OLD_TOKEN = re.compile(r'\w+')


@given(st.text())
def test_words_is_the_old_lowercase_word_tokenizer(text):
  old = _OLD_TOKEN.findall(text.lower())
  assert ANALYZERS['words'](text) == old
  assert lexicon.tokenize(text) == old


@pytest.mark.parametrize(
  ('call', 'match'),
  [
    (lambda: get_tokenizer('nope'), r"Unknown tokenizer \(analyzer\) 'nope'; known: \['english', "),
    (lambda: lexicon.stop_words('nltk'), r"Unknown stop list 'nltk'; known: \['none', 'lucene', 'stop179'\]"),
    (lambda: lexicon.stemmer('lancaster'), r"Unknown stemmer 'lancaster'; known: \['none', 'porter', 'snowball'\]"),
    (lambda: Analyzer(pattern='regex'), r"Analyzer: pattern must be one of \['words', 'uax29', 'space'\], got 'regex'"),
    (lambda: Analyzer(stopwords='english'), r"Analyzer: stopwords must be one of \['none', 'lucene', 'stop179'\]"),
    (lambda: Analyzer(stem='lancaster'), r"Analyzer: stem must be one of \['none', 'porter', 'snowball'\]"),
    (
      lambda: pipeline.make_pipeline(legs={'b': {'op': 'bm25', 'tokenizer': 'lucene'}}, name='p'),
      r"pipeline p, leg b: tokenizer must be one of \['words', .*, got 'lucene'",
    ),
  ],
  ids=['tokenizer', 'stop list', 'stemmer', 'pattern', 'stopwords', 'stem', 'bm25 knob'],
)
def test_unknown_names_are_refused_in_one_line(call, match):
  with pytest.raises(ValueError, match=match) as e:
    call()
  assert '\n' not in str(e.value)
