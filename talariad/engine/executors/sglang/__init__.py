"""The `sglang` executor: stock SGLang servers driven from outside through their control surface.

Verified against the contract in docs/sglang.md (SGLang 0.5.23) and a faithful fake server
(tests/fakes/sglang_server.py), not against a live SGLang. Nothing here imports torch or sglang.
"""
