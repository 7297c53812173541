"""index/fusion.py on hand-computed cases: the expected numbers are written out, not recomputed."""

import pytest

from index.fusion import reciprocal_rank_fusion, weighted_score_fusion


def test_rrf_sums_reciprocal_ranks_from_one() -> None:
    # 7: 1/61 + 1/62 = 0.0325224748...; 3: 1/62 = 0.0161290322...; 9: 1/61 = 0.0163934426...
    fused = reciprocal_rank_fusion([[7, 3], [9, 7]])
    assert [i for i, _ in fused] == [7, 9, 3]
    assert [s for _, s in fused] == pytest.approx(
        [0.03252247488101534, 0.01639344262295082, 0.016129032258064516]
    )


def test_rrf_constant_and_weights() -> None:
    # k = 1: 5 at ranks 1, 2 -> 2.0 * 1/2 + 0.5 * 1/3 = 1.1666...; 6 at rank 2 -> 2.0/3; 8 at 1 -> 0.5/2
    fused = reciprocal_rank_fusion([[5, 6], [8, 5]], k=1, weights=[2.0, 0.5])
    assert [i for i, _ in fused] == [5, 6, 8]
    assert [s for _, s in fused] == pytest.approx([1.1666666666666667, 0.6666666666666666, 0.25])


def test_rrf_ties_go_to_the_lower_id_and_repeats_count_once() -> None:
    # 4 and 2 each first in one list: 1/61 both; 4 repeated in its list still counts at rank 1
    assert reciprocal_rank_fusion([[4, 4], [2]]) == [(2, 1 / 61), (4, 1 / 61)]
    assert reciprocal_rank_fusion([[], []]) == []
    with pytest.raises(ValueError, match="1 weights for 2"):
        reciprocal_rank_fusion([[1], [2]], weights=[1.0])


def test_weighted_fusion_min_max_normalises_each_list() -> None:
    # dense 0.9, 0.7, 0.5 -> 1.0, 0.5, 0.0; lexical 12, 4 -> 1.0, 0.0
    dense = [(1, 0.9), (2, 0.7), (3, 0.5)]
    lexical = [(3, 12.0), (4, 4.0)]
    # 1: 0.7*1.0 = 0.7; 2: 0.7*0.5 = 0.35; 3: 0.7*0 + 0.3*1.0 = 0.3; 4: 0.3*0 = 0.0
    fused = weighted_score_fusion([dense, lexical], [0.7, 0.3])
    assert [i for i, _ in fused] == [1, 2, 3, 4]
    assert [s for _, s in fused] == pytest.approx([0.7, 0.35, 0.3, 0.0])


def test_weighted_fusion_one_distinct_score_is_one_and_ties_by_id() -> None:
    # every score of the first list equal: each normalises to 1.0; the empty list adds nothing
    fused = weighted_score_fusion([[(9, 3.5), (2, 3.5)], []], [1.0, 1.0])
    assert fused == [(2, 1.0), (9, 1.0)]
    assert weighted_score_fusion([[(5, -2.0)], [(5, 8.0)]], [0.25, 0.5]) == [(5, 0.75)]
