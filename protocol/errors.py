"""Errors of the wire protocol: each carries a stable code for the ERROR reply."""

from __future__ import annotations


class ProtocolError(Exception):
    """A frame that cannot be accepted. `request_id` is set when the frame named one, so the sender of a
    malformed request still gets an ERROR reply for it. When one field is wrong, `field` names it as the
    message's body does (`params.top_p`) and `problem` says what is wrong with it, so that a front with
    names of its own (the HTTP APIs' `options.top_p`) can say it in those."""

    def __init__(
        self, code: str, message: str, request_id: str | None = None, field: str = "", problem: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.field = field
        self.problem = problem


# codes sent in ERROR replies
BAD_FRAME = "bad_frame"  # not a genie frame: empty, unknown type byte, not msgpack, too large
BAD_MESSAGE = "bad_message"  # a known type whose fields are missing, mistyped or out of range
