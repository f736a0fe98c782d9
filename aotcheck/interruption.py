"""How a run ends on a signal: SIGTERM (CI's cancel and timeout) and SIGHUP end it as Ctrl-C does, so the
session reports what it finished."""

from __future__ import annotations

import signal
import threading
from typing import Any


class Interruption:
    """SIGTERM (what CI runners send on cancel and timeout) and SIGHUP (a closed terminal or ssh
    session) end a run as Ctrl-C does: a KeyboardInterrupt in the session process, so the finished
    cases are kept, reported and summarised, and the compile workers are stopped. :attr:`signal`
    names what ended the run. A SIGHUP that was ignored when the run started (``nohup``) stays ignored.

    Example:
        >>> import os, signal
        >>> interruption = Interruption().install()
        >>> try:
        ...     os.kill(os.getpid(), signal.SIGTERM)
        ...     for _ in range(100): __import__("time").sleep(0.01)
        ... except KeyboardInterrupt:
        ...     print("interrupted by", interruption.signal)
        ... finally:
        ...     interruption.restore()
        interrupted by SIGTERM
    """

    # The signals that end a run as Ctrl-C does (SIGHUP where the platform has it).
    SIGNALS: tuple[signal.Signals, ...] = tuple(
        s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> "Interruption":
        if threading.current_thread() is threading.main_thread():  # Only the main thread may set handlers.
            for signum in self.SIGNALS:
                if signum != signal.SIGTERM and signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # nohup: the user asked to outlive the terminal.
                self._previous[signum] = signal.signal(signum, self._raise)
        return self

    def _raise(self, signum: int, frame: Any) -> None:
        self.signal = signal.Signals(signum).name
        raise KeyboardInterrupt

    def note(self) -> None:
        """Records an interruption that came some other way (Ctrl-C)."""
        self.signal = self.signal or "SIGINT"

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            if previous is not None:
                signal.signal(signum, previous)
        self._previous = {}
