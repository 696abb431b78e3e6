"""Executors run tokens inside an instance: `sim` (calibrated model), `torch` (built-in engine)."""
