"""Fixtures shared from tests/support."""

from tests.support.gateway import hop_client  # noqa: F401
