"""Tooling for a pool of boxes behind Envoy, outside the runtime (`talariad` never imports it):
the gateway config operators render (`python -m talaria_pool.envoy render|validate`, its template
shipped as package data), Envoy's launcher, and a whole pool on loopback (`devpool`: `make
run-pool`, the end-to-end tests, the pool benchmarks)."""
