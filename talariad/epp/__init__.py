"""The pool's endpoint picker (EPP): Envoy's ext_proc server that places each call on a box.

Envoy picks nothing; the EPP picks the box (the same `Router` as a box's, over box snapshots,
`router.boxes`); the box's daemon picks the instance. Design: docs/pool.md.
"""
