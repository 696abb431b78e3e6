"""Tests of the built-in torch engine."""
