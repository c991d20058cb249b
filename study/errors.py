"""One exception type for every user-facing mistake.

Every entry point (`study`, `python -m study.search`, `python -m study.pretrain`) ends through
`run_main`: a `StudyError` becomes one line on stderr and exit code 2, before anything is written; a
full disk or an unwritable results folder one line and exit 2 too (nothing lost, the same command
resumes); `Diverged` 3, `Interrupted` 143, a bare Ctrl-C 130. Library code raises `StudyError` with the
offending setting (a dotted path such as ``masking.rate``) and what would have been allowed,
so the message always answers "which field, and what may I write instead?".
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

EXIT_USAGE = 2  # bad spec / bad input (nothing written), or a full disk / unwritable folder (all kept)
EXIT_DIVERGED = 3  # a run hit a non-finite loss and was marked `diverged`
EXIT_CTRL_C = 130  # 128 + SIGINT: stopped at once by a second Ctrl-C (or one outside pre-training)
EXIT_INTERRUPTED = 143  # 128 + SIGTERM: runs checkpointed and stopped on SIGTERM or Ctrl-C; they resume


class StudyError(Exception):
    """A problem the user can fix by changing their input."""

    def __init__(
        self, message: str, *, field: str | None = None, allowed: str | None = None, source: str | None = None
    ):
        self.field, self.allowed, self.source = field, allowed, source
        self.message = message  # without the prefixes: lets a caller re-raise it naming the file (`source`)
        parts = []
        if source:
            parts.append(f"{source}:")
        if field:
            parts.append(f"{field}:")
        parts.append(message)
        if allowed:
            parts.append(f"(allowed: {allowed})")
        super().__init__(" ".join(parts))

    def replace(self, **changes: str | None) -> StudyError:
        """This error with some of its parts replaced (message, field, allowed, source): how a caller that
        knows more (the file, the profile, the base that led there) re-raises it."""
        parts = {"message": self.message, "field": self.field, "allowed": self.allowed, "source": self.source}
        parts |= changes
        return StudyError(parts.pop("message"), **parts)


class Diverged(Exception):
    """Raised inside training when the loss stops being finite."""

    def __init__(self, step: int, loss: float):
        self.step, self.loss = step, loss
        super().__init__(f"non-finite loss {loss} at step {step}")


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGTERM or Ctrl-C after checkpointing `step`: resumable, no status written. A
    KeyboardInterrupt, so code that records failures with `except Exception` lets it through unrecorded."""

    def __init__(self, step: int | None):
        self.step = step
        super().__init__(
            "interrupted (SIGTERM or Ctrl-C); every run in training checkpointed and none was left "
            "half-written: the same command resumes"
            if step is None
            else f"interrupted (SIGTERM or Ctrl-C) at step {step}; checkpoint written, the run resumes from it"
        )

    def __reduce__(self):  # a --jobs worker sends it back to the parent pickled: keep the step
        return (type(self), (self.step,))


# --------------------------------------------------------------------------- the one error -> exit mapping
# A full disk, a quota, a read-only or unwritable folder: nothing the code or the spec can fix. Every write
# is atomic and every run checkpoints, so what was finished stays, and the same command resumes.
ENVIRONMENTAL = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space or raise the quota",
    errno.EROFS: "make the folder writable",
    errno.EACCES: "make the folder writable",
    errno.EPERM: "make the folder writable",
}
KEPT = (
    "kept: every finished run and result, and each unfinished run's last checkpoint; "
    "{fix}, then run the same command again: it resumes from them"
)


def environmental(exc: BaseException) -> bool:
    """True for an OSError the machine caused (full disk, quota, read-only or unwritable folder)."""
    return isinstance(exc, OSError) and exc.errno in ENVIRONMENTAL


def exit_code(exc: BaseException) -> int | None:
    """The exit status every entry point ends with for `exc`; None for anything else (a bug: the caller
    re-raises it, traceback and all)."""
    if isinstance(exc, StudyError) or environmental(exc):
        return EXIT_USAGE
    if isinstance(exc, Diverged):
        return EXIT_DIVERGED
    if isinstance(exc, Interrupted):  # before KeyboardInterrupt: it is one
        return EXIT_INTERRUPTED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_CTRL_C
    return None


def message(exc: BaseException) -> str:
    """The one line on stderr for an exception `exit_code` maps."""
    if environmental(exc):
        where = exc.filename or "a results file"  # io.atomic_write_bytes names the file it was writing
        what = os.strerror(exc.errno).lower()
        return f"error: {what} ({errno.errorcode[exc.errno]}): {where}; " + KEPT.format(
            fix=ENVIRONMENTAL[exc.errno]
        )
    if isinstance(exc, StudyError):
        return f"error: {exc}"
    if isinstance(exc, Diverged):
        return f"diverged: {exc}"
    if isinstance(exc, Interrupted):  # SIGTERM or Ctrl-C: runs checkpointed and stay pending
        return f"interrupted: {exc}"
    # a second Ctrl-C, or one outside pre-training: every file written is whole
    return (
        "stopped at once (Ctrl-C): the same command resumes from the last checkpoint and the results "
        "already written"
    )


def run_main(fn: Callable[[], int]) -> int:
    """Run an entry point's body: its exit status, or the mapped one with one line on stderr (no
    traceback) for a user mistake, a divergence, an interruption or a machine fault. Used by `study`,
    `python -m study.search` and `python -m study.pretrain`, so they cannot disagree."""
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - mapped or re-raised, never swallowed
        code = exit_code(exc)
        if code is None:
            raise
        print(message(exc), file=sys.stderr)
        return code
