"""Errors of the wire protocol: each carries a stable code for the ERROR reply."""

from __future__ import annotations


class ProtocolError(Exception):
    """A frame that cannot be accepted. `request_id` is set when the frame named one, so the sender of a
    malformed request still gets an ERROR reply for it."""

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# codes sent in ERROR replies
BAD_FRAME = "bad_frame"  # not a genie frame: empty, unknown type byte, not msgpack, too large
BAD_MESSAGE = "bad_message"  # a known type whose fields are missing, mistyped or out of range
