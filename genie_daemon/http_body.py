"""A request's body as the HTTP fronts read it: against a deadline, within the size limit, as JSON.

aiohttp bounds the wait for a request's headers (keepalive_timeout, http_server.py) but not for its body:
a POST whose Content-Length promised more than it sent, or a chunked body that never ended, held its
handler and its connection until the client went away (issue 34 item 12: 27 of 5 000 malformed requests
had no status line within 10 s). So a body is answered 408 when nothing of it arrives for `timeout_s`
(after the headers or its last bytes: nginx's client_body_timeout), and when it falls behind an average
of `min_rate_b_s` bytes a second after the first `timeout_s` (Apache mod_reqtimeout's `body=…,MinRate=…`),
so that a trickle of a byte every few seconds cannot hold a connection for hours either. An upload that
keeps that average is never cut off, however long it takes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .http_turn import HttpError

BODY_TIMEOUT_S = 5.0  # a body that sends nothing for this long is answered 408
# after that, each this many bytes buy a second more: 500 B/s is slower than any working link (a 2G
# phone link carries ~5 kB/s), and a trickle slower than it cannot hold a connection for hours
BODY_MIN_RATE_B_S = 500.0


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int  # http_max_body_mb: past it, 413
    timeout_s: float = BODY_TIMEOUT_S
    min_rate_b_s: float = BODY_MIN_RATE_B_S


BODY_LIMITS: web.AppKey[BodyLimits] = web.AppKey("body_limits")


async def read_body(request: web.Request) -> bytes:
    """The whole body, or a 408 when it does not arrive in time, or a 413 when it is too large (the
    guard in http_server.py closes a connection whose body was not read to its end)."""
    limits = request.app[BODY_LIMITS]
    loop = asyncio.get_running_loop()
    start = loop.time()
    behind = start + limits.timeout_s  # when the body falls behind min_rate_b_s
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout_at(min(behind, loop.time() + limits.timeout_s)):
                chunk = await request.content.readany()
        except TimeoutError:
            waited = loop.time() - start
            message = f"the request body did not arrive in time: {size} bytes in {waited:.1f} s"
            raise HttpError(408, message, "body_timeout") from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limits.max_bytes:
            raise HttpError(413, f"the body exceeds {limits.max_bytes} bytes", "too_large")
        chunks.append(chunk)
        behind += len(chunk) / limits.min_rate_b_s


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it (408 and 413: read_body)."""
    raw = await read_body(request)
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise HttpError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise HttpError(400, "the body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body
