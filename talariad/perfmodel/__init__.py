"""The latency and memory model of a large-model instance: latency profiles (each value cited),
the cost of an action (`costs.py`), the bytes of HBM and the host arena (`memory.py`), the one
model that prices a `sim` instance (`model.py`) and the workload distributions (`dists.py`).
The simulator and the real-time `sim` executor both use it; the prefill and switch formulas exist
once, here."""
