"""This process's wall clock, read in one place so that tests can shift it.

``COMMITPUB_CLOCK_SKEW_S`` (seconds, may be negative) is added to ``time.time()``: the tests
start processes with it to act as hosts whose clocks are off (tests/test_lock_clocks.py).
libfaketime would be the outside tool for that, but the one Debian ships (0.9.10) makes
Python 3.11's ``time.sleep`` fail with EINVAL once the monotonic clock is left unfaked, and
hang otherwise. Only wall-clock readings of the job lock go through here; the monotonic
clock, which decides, never does.
"""

from __future__ import annotations

import os
import time

from store.errors import ConfigurationError

ENV_VAR = "COMMITPUB_CLOCK_SKEW_S"


def wall() -> float:
    """Seconds since the epoch by this process's wall clock, shifted by ``ENV_VAR`` if set.

    Raises:
        ConfigurationError: if ``ENV_VAR`` is set to something other than a number.
    """
    skew = os.environ.get(ENV_VAR)
    if not skew:
        return time.time()
    try:
        return time.time() + float(skew)
    except ValueError:
        raise ConfigurationError(f"{ENV_VAR} must be a number of seconds, got {skew!r}") from None
