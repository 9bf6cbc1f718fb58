"""Progress bars of long work (translating, scoring, preparing, averaging), on stderr.

Every long loop of the package asks `progress_bar` for its bar, so one switch governs them all:
`show_progress(True | False | None)` (the command line's ``--no-progress``), where None, the
default, shows bars only when stderr is a terminal. Bars are tqdm's, an optional extra
(``pip install 'bahdanau[progress]'``): without tqdm there are none, and nothing else changes.
A bar never writes to stdout, which carries a command's results; lines printed or logged while
a bar is drawn go through `clear_bars`, so they do not land in the middle of one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

__all__ = ["Bar", "clear_bars", "progress_bar", "progress_shown", "show_progress", "tracked"]

T = TypeVar("T")

_shown: bool | None = None      # None: on when stderr is a terminal


def show_progress(shown: bool | None) -> bool | None:
    """Show the bars (True), hide them (False), or show them when stderr is a terminal (None);
    returns the setting it replaces (to put it back)."""
    global _shown
    previous, _shown = _shown, shown
    return previous


def progress_shown() -> bool:
    """Whether a bar made now would be drawn: asked for (or stderr is a terminal), and tqdm is
    installed."""
    stderr = sys.stderr
    wanted = _shown if _shown is not None else bool(stderr is not None and stderr.isatty())
    if not wanted or stderr is None:
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


class Bar:
    """A bar that draws nothing: what `progress_bar` gives when bars are off (tqdm's methods
    that the package calls)."""

    def update(self, n: float = 1) -> None:
        """Advance by `n`."""

    def set_postfix_str(self, text: str) -> None:
        """Show `text` after the bar."""

    def close(self) -> None:
        """Remove the bar."""

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(what: str, *, total: float | None = None, unit: str = "it",
                 unit_scale: bool = False, leave: bool = False) -> Any:
    """A progress bar on stderr (a tqdm instance), or a `Bar` that draws nothing when bars are
    off (`progress_shown`).

    Args:
        what: the bar's label, e.g. "translating".
        total: the count at the end (None: unknown; the bar counts and shows the rate).
        unit: what is counted ("sentences", "B").
        unit_scale: show large counts as 1.2M (bytes as 1.2MB).
        leave: keep the finished bar on screen (default: it disappears).
    Returns:
        An object with `update(n)`, `set_postfix_str(text)` and `close()`; a context manager.
    """
    if not progress_shown():
        return Bar()
    from tqdm import tqdm

    return tqdm(desc=what, total=total, unit=unit, unit_scale=unit_scale, leave=leave,
                file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


def tracked(items: Iterable[T], what: str, *, total: int | None = None,
            unit: str = "it") -> Iterator[T]:
    """`items`, one by one, counted on a progress bar (`progress_bar`) that closes at the end."""
    with progress_bar(what, total=total, unit=unit) as bar:
        for item in items:
            yield item
            del item                 # before the next is made: one item in memory at a time
            bar.update(1)


@contextmanager
def clear_bars() -> Iterator[None]:
    """While inside, the bars on screen are cleared (and redrawn on leaving): print or log a
    line inside it while bars may be drawn."""
    tqdm = sys.modules.get("tqdm")      # no bar can be drawn before tqdm was imported
    with tqdm.tqdm.external_write_mode() if tqdm is not None else nullcontext():
        yield
