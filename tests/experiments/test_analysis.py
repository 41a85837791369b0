"""experiments.lib.pileup by hand: the shared tie rule in cosine order, the harmful pile-up rule, evidence clusters."""

import numpy as np

from experiments.lib import pileup as analysis


def test_cosine_order_breaks_ties_to_the_later_item():
  docs = np.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.6, 0.8]])
  assert analysis.cosine_order(np.asarray([1.0, 0.0]), docs).tolist() == [2, 0, 3, 1]


def test_harmful_pileup_needs_a_missed_gold_and_a_redundant_non_gold_pair():
  order = np.arange(60)
  gram = np.eye(60)
  gram[0, 1] = gram[1, 0] = 0.9  # two non-gold items in the top 10, near duplicates
  assert analysis.is_harmful_pileup(order, {20}, gram)  # gold at rank 21: missed, within 11-50
  assert not analysis.is_harmful_pileup(order, {55}, gram)  # gold below rank 50: not in the window
  assert not analysis.is_harmful_pileup(order, {5, 20}, gram.clip(max=0.5) + np.eye(60) * 0.5)  # no redundant pair
  assert not analysis.is_harmful_pileup(order, {0, 20}, gram)  # the pair's item 0 is gold: no non-gold pair


def test_gold_clusters_and_cluster_recall():
  gram = np.eye(5)
  gram[1, 3] = gram[3, 1] = 0.8  # 1 and 3 paraphrase one fact
  clusters = analysis.gold_clusters([1, 3, 4], gram)
  assert sorted(map(sorted, clusters)) == [[1, 3], [4]]
  assert analysis.cluster_recall([3, 0], clusters) == 0.5 and analysis.cluster_recall([1, 4], clusters) == 1.0
