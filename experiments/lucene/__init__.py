"""Lucene itself as the reference of the Lucene-form BM25 leg: the Anserini jar, a small Java program over its Lucene
searcher, and the per-question comparison (:mod:`experiments.lucene.reference`)."""
