"""The machinery that makes the reference (`talariad.router.cost`) fast, and nothing else:
`costmodel` (the router's books as the reference's inputs, cached), `bounds` (instances in a
lower bound order of Eq. (1)), `placed` (placed work over sliding windows), `logged` (dicts'
past states for a small tuple each), `ranking` (scores only the instances that can still win),
`lazy` (the skipped ones' explanations, rendered when read).

Nothing here changes a decision: `tests/router/test_router_ranking.py` holds `ranking.rank`
equal to `rank_all`, explanations included. Design: docs/internals.md.
"""
