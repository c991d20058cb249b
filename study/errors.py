"""One exception type for every user-facing mistake.

The CLI turns a `StudyError` into a one-paragraph message on stderr and exit
code 2, before anything is written. Library code raises it with the offending
setting (a dotted path such as ``masking.rate``) and what would have been allowed,
so the message always answers "which field, and what may I write instead?".
"""

from __future__ import annotations

EXIT_USAGE = 2  # bad spec / bad input: nothing was computed or written
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
