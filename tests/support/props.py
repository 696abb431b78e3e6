"""Property-test sizes: `make test` searches each property at full size; `make test-fast` runs
under the `fast` Hypothesis profile (`--hypothesis-profile=fast`), where the slowest properties
search a smaller space. A smaller search still checks every step of every example it draws."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("fast", deadline=None)


def examples(full: int) -> int:
    """`full` examples; a quarter of them (at least 10) under the `fast` profile."""
    if settings.get_current_profile_name() == "fast":
        return max(10, full // 4)
    return full
