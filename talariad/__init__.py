"""Talaria: session-aware multi-model serving for tool-using agents."""

__version__ = "0.1.0"
