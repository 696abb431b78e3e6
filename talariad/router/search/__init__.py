"""The machinery that makes the reference (`talariad.router.cost`) fast, and nothing else:

- `bounds`: per model, the instances in ascending order of a lower bound of Eq. (1);
- `logged`: dicts whose past states a lazy explanation keeps for a small tuple each.

Nothing here changes a decision: `tests/router/test_router_ranking.py` holds the fast ranking
equal to the reference's `rank_all`, explanations included.
"""
