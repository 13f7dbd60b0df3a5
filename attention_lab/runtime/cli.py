"""The command lines' one way of failing: a problem the user can fix is one `error:` line on stderr and exit
code 2, never a traceback. The exception's message says what went wrong and what to do; nothing already
written is touched on the way out."""

from __future__ import annotations

import sys
from collections.abc import Callable

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)


def fail(message: object) -> int:
    """Print `error: <message>` on stderr; return the exit code (2) for the caller to return."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def run(main: Callable[[], int | None], *errors: type[BaseException]) -> int:
    """main()'s exit code (None counts as 0); a ValueError, FileNotFoundError or one of `errors` becomes fail()."""
    try:
        return main() or 0
    except (*USER_ERRORS, *errors) as e:
        return fail(e)
