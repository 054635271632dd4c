"""Console output for the command-line tools: a progress bar and a plain table, no dependency.

The bar is drawn on stderr, only when stderr is a terminal, and at most ten times a
second; it is erased before any table row is printed, so both can share a terminal.

    >>> import io
    >>> out = io.StringIO()
    >>> table = Table([("model", 8), ("acc", 6, ".3f")], stream=out)
    >>> table.header(); table.row("edRVFL-F", 0.96123)
    >>> print(out.getvalue(), end="")
    model        acc
    edRVFL-F   0.961
"""

from __future__ import annotations

import math
import sys
import time


class ProgressBar:
    """``[#####.....]  50%  label  extra`` on one terminal line, redrawn in place."""

    def __init__(
        self, total: int, label: str = "", *, stream=None, enabled: bool | None = None, width: int = 30
    ):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self.width = width
        self._last_draw = 0.0
        self._shown = False

    def update(self, done: int, extra: str = "", *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1 and done < self.total:
            return
        self._last_draw = now
        frac = min(max(done / self.total, 0.0), 1.0)
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {frac:4.0%}  {self.label}  {extra}\x1b[K")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Erase the bar (before printing anything else on the terminal)."""
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def close(self) -> None:
        self.clear()


class Table:
    """Fixed-width rows: ``columns`` is a list of (title, width) or (title, width, format spec).
    None and NaN print as ``-``."""

    def __init__(self, columns, *, stream=None, bar: ProgressBar | None = None):
        self.columns = [(c[0], c[1], c[2] if len(c) > 2 else "") for c in columns]
        self.stream = sys.stdout if stream is None else stream
        self.bar = bar

    def header(self) -> None:
        self._write([title for title, _, _ in self.columns], raw=True)

    def row(self, *values) -> None:
        self._write(values)

    def _write(self, values, raw: bool = False) -> None:
        cells = []
        for i, ((_, width, spec), value) in enumerate(zip(self.columns, values)):
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                text = "-"  # not measured (no test split, no regret): never "nan"
            elif raw or not spec:
                text = str(value)
            else:
                text = format(value, spec)
            cells.append(text.ljust(width) if i == 0 else text.rjust(width))
        if self.bar is not None:
            self.bar.clear()
        self.stream.write("  ".join(cells).rstrip() + "\n")
        self.stream.flush()


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Reporter:
    """A progress bar on a terminal; elsewhere (logs, CI) one plain line every few seconds."""

    def __init__(self, total: int, label: str, *, enabled: bool, every_seconds: float = 3.0):
        self.bar = ProgressBar(total, label, enabled=None if enabled else False)  # None: on a terminal
        self.lines = enabled and not self.bar.enabled
        self.every = every_seconds
        self.last = 0.0
        self.stream = sys.stderr

    def update(self, done: int, text: str, *, force: bool = False) -> None:
        if self.bar.enabled:
            self.bar.update(done, text, force=force)
        elif self.lines and (force or time.monotonic() - self.last >= self.every):
            self.last = time.monotonic()
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        self.bar.close()
