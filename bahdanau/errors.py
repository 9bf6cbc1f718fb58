"""The one exception type for a caller's mistake.

Every check of an argument, an option, an input file or a checkpoint raises `InputError`, a
`ValueError` whose message is one line naming what is wrong (the argument, option, file or
checkpoint entry). The `bahdanau` command prints such an error as one ``bahdanau: error:`` line
and exits with status 2; any other exception is a bug of the library and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """A bad argument, option, input file or checkpoint, named in a one-line message."""
