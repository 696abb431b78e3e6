"""The machinery that makes the reference (`talariad.router.cost`) fast, and nothing else:

- `costmodel`: reads the router's books into the reference's named inputs and caches what the
  search reads (cost rows, keep costs, bound orders);
- `bounds`: per model, the instances in ascending order of a lower bound of Eq. (1);
- `placed`: the work the router placed, over sliding windows (retirement, spare capacity);
- `logged`: dicts whose past states a lazy explanation keeps for a small tuple each;
- `ranking`: the cost placement that scores only the instances that can still win;
- `lazy`: the explanations of the instances it skipped, rendered when read.

Nothing here changes a decision: `tests/router/test_router_ranking.py` holds `ranking.rank`
equal to the reference's `rank_all`, explanations included.
"""
