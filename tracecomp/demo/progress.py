"""A text progress bar for long loops, readable on a terminal and in a log file.

On a terminal the bar redraws in place (carriage return), at most every `interval`
seconds; on anything else (a pipe, a file, CI logs) it prints a new line at every tenth of
the work, so a log gets about ten lines instead of thousands of carriage returns.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 30


class ProgressBar:
    def __init__(self, total: int, label: str = "", stream: TextIO | None = None,
                 interval: float = 0.1):
        if total <= 0:
            raise ValueError(f"ProgressBar: total must be positive, got {total}")
        self.total, self.label, self.interval = total, label, interval
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._last_draw = -1.0
        self._last_tenth = -1

    def line(self, done: int, note: str = "") -> str:
        filled = BAR_WIDTH * done // self.total
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        elapsed = time.perf_counter() - self.start
        return (f"{self.label}[{bar}] {100 * done // self.total:3d}% {done}/{self.total} "
                f"{elapsed:5.1f} s" + (f"  {note}" if note else ""))

    def update(self, done: int, note: str = "") -> None:
        """Report `done` of `total` units finished; draws only when it is time to."""
        if self.tty:
            now = time.perf_counter()
            if now - self._last_draw >= self.interval or done == self.total:
                self._last_draw = now
                self.stream.write("\r" + self.line(done, note) + ("\n" if done == self.total else ""))
                self.stream.flush()
            return
        tenth = 10 * done // self.total
        if tenth > self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(self.line(done, note) + "\n")
            self.stream.flush()
