"""A soft deadline inside the process doing the work: SIGALRM raises an exception where the code is,
so the error can say which line took too long. The linted code can switch it off (it is its process);
the hard deadline is isolation's, enforced from outside the child."""
from __future__ import annotations

import contextlib
from typing import Optional, Type


@contextlib.contextmanager
def alarm(seconds: Optional[float], raising: Type[BaseException]):
    """Raise `raising()` in the main thread after `seconds` (no deadline: None/0, another thread, or no
    SIGALRM on this platform)."""
    import signal
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def handler(signum, frame):
        raise raising()

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
