"""The one exception type of the capability loader."""

from __future__ import annotations


class CapabilityError(Exception):
    """A capability file or profile is wrong.

    The message names the file, the field (dotted path) and how to fix it.  The same
    parts are kept as attributes for callers that want to format them differently.
    """

    def __init__(self, message: str, *, file: str = "", field: str = "", hint: str = ""):
        self.file = file
        self.field = field
        self.hint = hint
        parts = [p for p in (file, field) if p]
        text = ": ".join(parts + [message]) if parts else message
        if hint:
            text += f" (fix: {hint})"
        super().__init__(text)
