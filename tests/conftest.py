"""Registers the `fast` Hypothesis profile before the plugin reads `--hypothesis-profile`."""

import tests.support.props  # noqa: F401
