"""A time bound for a test body, so a hang fails the case instead of stopping the suite."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def within(seconds: float):
    """Fail (instead of hanging the suite) when the body runs longer than `seconds`."""

    def expire(*_):
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
