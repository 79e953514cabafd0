"""The parent rule (search/parents.py): exploit the best, explore the others, deterministic, incumbent always in."""

from __future__ import annotations

from collections import Counter

from optagent.search.parents import EXPLORE_BONUS, Node, choose_parents, ranked, weight


def nodes(children: dict[int, int] | None = None) -> list[Node]:
    """Five passing kernels: step 4 the fastest (the incumbent), then 2, 7, 0, 5."""
    times = {0: 100.0, 2: 60.0, 4: 40.0, 5: 120.0, 7: 80.0}
    return [Node(s, t, (children or {}).get(s, 0)) for s, t in times.items()]


def test_the_incumbent_is_slot_zero_of_every_round_and_width_one_is_only_the_incumbent():
    for r in range(50):
        got = choose_parents(nodes(), 4, 3, "run", r, cpu=False)
        assert got[0] == 4 and len(got) == 3 and len(set(got)) == 3  # no repeat while nodes are left
        assert choose_parents(nodes(), 4, 1, "run", r, cpu=False) == [4]
    # the incumbent stays in even when its recorded time is not the fastest (it was re-timed slower)
    slow_best = [Node(4, 500.0)] + [n for n in nodes() if n.step != 4]
    assert ranked(slow_best, 4, cpu=False)[0].step == 4
    assert choose_parents(slow_best, 4, 2, "run", 0, cpu=False)[0] == 4


def test_the_same_run_and_round_draw_the_same_parents():
    a = [choose_parents(nodes(), 4, 4, "run-a", r, cpu=False) for r in range(20)]
    assert a == [choose_parents(nodes(), 4, 4, "run-a", r, cpu=False) for r in range(20)]
    assert a != [choose_parents(nodes(), 4, 4, "run-b", r, cpu=False) for r in range(20)]


def test_rank_favours_the_best_and_few_children_earn_a_bonus():
    assert [n.step for n in ranked(nodes(), 4, cpu=False)] == [4, 2, 7, 0, 5]
    assert weight(1, 0) > weight(2, 0) > weight(3, 0)
    assert weight(2, 0) - weight(2, 4) == EXPLORE_BONUS * (1 - 1 / 5)
    # exploit: without children, the second slot goes to the second best most often
    drawn = Counter(choose_parents(nodes(), 4, 2, "run", r, cpu=False)[1] for r in range(2000))
    assert drawn.most_common(1)[0][0] == 2 and drawn[2] > drawn[7] > drawn[5]
    # explore: once step 2 has many children and step 7 none, step 7 is drawn more often than step 2
    crowded = nodes({2: 12})
    drawn = Counter(choose_parents(crowded, 4, 2, "run", r, cpu=False)[1] for r in range(2000))
    assert drawn[7] > drawn[2]


def test_more_slots_than_nodes_repeat_parents_by_weight():
    got = choose_parents([Node(0, 100.0), Node(3, 50.0)], 3, 5, "run", 0, cpu=False)
    assert got[:2] == [3, 0] and len(got) == 5 and set(got) <= {0, 3}
    assert choose_parents([Node(0, 100.0)], 0, 3, "run", 1, cpu=False) == [0, 0, 0]


def test_on_the_cpu_times_rank_nothing():
    fast_new = [Node(0, 100.0), Node(3, 1.0), Node(5, 500.0)]
    assert [n.step for n in ranked(fast_new, 0, cpu=True)] == [5, 3, 0]  # newest first, whatever the times
    assert [n.step for n in ranked(fast_new, 0, cpu=False)] == [0, 3, 5]
    # a line of work goes on from its newest correct kernel, while the best stays the first that passed
    assert choose_parents(fast_new, 0, 1, "run", 3, cpu=True) == [5]
    assert choose_parents(fast_new, 0, 1, "run", 3, cpu=False) == [0]
    assert choose_parents([], 0, 1, "run", 0, cpu=True) == [0]  # nothing passed yet: the starter
