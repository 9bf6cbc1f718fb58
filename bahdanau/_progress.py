"""Progress bars of long work (training, translating, scoring, preparing, averaging), on stderr.

Every long loop of the package asks `progress_bar` for its bar, so one switch governs them all:
`show_progress(True | False | None)` (the command line's ``--no-progress``), where None, the
default, shows bars only when stderr is a terminal. Bars are tqdm's, an optional extra
(``pip install 'bahdanau[progress]'``): without tqdm there are none, and nothing else changes.
A bar never writes to stdout, which carries a command's results; lines printed or logged while
a bar is drawn go through `clear_bars`, so they do not land in the middle of one. Work that
is no count of anything (a run being set up) shows a `StatusLine` instead: what it is doing,
and for how long.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

__all__ = ["Bar", "StatusLine", "clear_bars", "progress_bar", "progress_shown", "show_progress",
           "tracked"]

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

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        """Show `text` after the bar (now, or with `refresh` False at its next update)."""

    def close(self) -> None:
        """Remove the bar."""

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(what: str, *, total: float | None = None, unit: str = "it",
                 unit_scale: bool = False, leave: bool = False, initial: float = 0) -> Any:
    """A progress bar on stderr (a tqdm instance), or a `Bar` that draws nothing when bars are
    off (`progress_shown`).

    Args:
        what: the bar's label, e.g. "translating".
        total: the count at the end (None: unknown; the bar counts and shows the rate).
        unit: what is counted ("sentences", "B").
        unit_scale: show large counts as 1.2M (bytes as 1.2MB).
        leave: keep the finished bar on screen (default: it disappears).
        initial: the count it starts from (a resumed run's updates); its rate and the time
            left count only what is done from here.
    Returns:
        An object with `update(n)`, `set_postfix_str(text, refresh=True)` and `close()`; a
        context manager.
    """
    if not progress_shown():
        return Bar()
    from tqdm import tqdm

    return tqdm(desc=what, total=total, unit=unit, unit_scale=unit_scale, leave=leave,
                initial=initial, file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


class StatusLine:
    """A line on stderr that says that `what` is under way, what it is doing now and for how
    long: ``preparing the run: building the model [00:03]``, when bars are shown
    (`progress_shown`; else it draws nothing). Call it with what is being done now; close it
    (or leave its ``with``) when the work is done."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._line: Any = None
        if progress_shown():
            from tqdm import tqdm

            self._line = tqdm(desc=what, bar_format="{desc} [{elapsed}]", leave=False,
                              file=sys.stderr, dynamic_ncols=True, mininterval=0.5)

    def __call__(self, doing: str) -> None:
        """Say that the work is now `doing` this."""
        if self._line is not None:
            self._line.set_description_str(f"{self.what}: {doing}")

    def close(self) -> None:
        """Remove the line (again: nothing)."""
        if self._line is not None:
            self._line.close()
            self._line = None

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
