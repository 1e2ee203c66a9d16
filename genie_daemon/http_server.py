"""The daemon's HTTP server (aiohttp): the Ollama API (ollama_api.py) and the OpenAI API (openai_api.py) on
one port, /health and /metrics; an optional API key; every refusal a 4xx in the API's own error shape.

A client that disconnects cancels its request (aiohttp's handler cancellation), during prefill too. A
connection that has not sent a whole request's headers within HEADER_TIMEOUT_S of opening (or of its
previous answer) is closed, a body that stops arriving is answered 408 (http_body.py), and a malformed
request costs one log line.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from . import ollama_api, openai_api
from .http_body import BODY_LIMITS, BODY_TIMEOUT_S, BodyLimits
from .http_turn import SERVICE, HttpError, Service
from .metrics import CONTENT_TYPE

log = logging.getLogger("genie.http")
OPEN_PATHS = frozenset({"/", "/health", "/api/version"})  # answered without the API key (liveness probes)
# aiohttp kept a connection that never finished its headers for an hour (its keep-alive default): ten
# slowloris connections held that long (issue 21 item 7); at 30 s such a request still went unanswered
# past the 10 s a malformed request is given (issue 34 item 12). Longer than the keep-alive expiry of the
# clients' pools (httpx, under the ollama and openai libraries: 5 s), so the daemon does not close a pooled
# connection as a request is sent on it
HEADER_TIMEOUT_S = 8.0


def error_response(
    path: str, status: int, message: str, code: str | None = None, param: str | None = None
) -> web.Response:
    if path.startswith("/v1/"):
        body: dict[str, Any] = {"error": openai_api.error_object(status, message, code, param)}
    else:
        body = {"error": message}
    return web.json_response(body, status=status)


@web.middleware
async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    key = service.config.api_key
    if key and request.path not in OPEN_PATHS:
        given = request.headers.get("Authorization", "")
        # aiohttp decodes headers with surrogateescape: undecodable bytes must not make this a 500
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {key}".encode()):
            message = "missing or wrong API key (Authorization: Bearer ...)"
            return error_response(request.path, 401, message, "invalid_api_key")
    limit = request.app[BODY_LIMITS].max_bytes
    if request.content_length is not None and request.content_length > limit:
        # refused before reading it; the connection closes so the client stops sending
        resp = error_response(request.path, 413, f"the body exceeds {limit} bytes", "too_large")
        resp.force_close()
        return resp
    try:
        return await handler(request)
    except HttpError as e:
        resp = error_response(request.path, e.status, e.message, e.code, e.param)
        if not request.content.is_eof():  # refused before its body was read to the end (408, 413)
            resp.force_close()  # what is left of it must never be read as the next request
        return resp
    except web.HTTPException as e:  # aiohttp's own: 404, 405, 413
        if e.status < 400:
            raise
        return error_response(request.path, e.status, f"{e.reason}: {request.method} {request.path}")
    except Exception:  # a bug, not the client's fault: logged, and answered in the API's shape
        log.exception("event=http_handler_failed path=%s", request.path)
        return error_response(request.path, 500, "internal error (see the daemon log)")


async def health(request: web.Request) -> web.Response:
    s = request.app[SERVICE].status()
    if s["ready"]:
        state = "ready"
    elif s.get("load_error"):
        state = "load_failed"
    elif not s.get("loaded_model"):
        state = "unloaded"
    else:
        state = "loading"
    body = {"status": state, "model": s.get("loaded_model"), "worker_pid": s.get("worker_pid")}
    if s.get("load_error"):
        body["error"] = s["load_error"]  # why it cannot serve: the worker's own reason
    return web.json_response(body, status=200 if state == "ready" else 503)


async def metrics(request: web.Request) -> web.Response:
    service: Service = request.app[SERVICE]
    state = {**service.status(), "kv": await service.kv_metrics()}
    text = service.metrics.render(state)
    return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE})


def make_app(service: Service, body_timeout_s: float = BODY_TIMEOUT_S) -> web.Application:
    limit = int(service.config.http_max_body_mb * 1024 * 1024)
    app = web.Application(middlewares=[guard], client_max_size=limit)
    app[SERVICE] = service
    app[BODY_LIMITS] = BodyLimits(limit, body_timeout_s)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    ollama_api.add_routes(app)
    openai_api.add_routes(app)
    return app


class OneLineBadRequests(logging.LoggerAdapter):
    """What aiohttp's connection handler logs, but a malformed request (a bad request line, header or chunk:
    the client's fault, answered 400) is one escaped line at INFO, not a traceback at ERROR: 10 000 of them
    made 11 263 log lines (issue 21 item 7). Anything else is passed on as it is."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            remote = args[0] if len(args) == 1 else None  # aiohttp's "Error handling request from %s"
            self.logger.log(
                min(level, logging.INFO),
                "event=http_bad_request remote=%r status=%d error=%r",
                remote,
                exc.code,
                exc.message,
            )
            return
        super().log(level, msg, *args, **kwargs)


class HttpFront:
    """Binds the app to config.http_host:http_port (port 0: any free one, see `port`)."""

    def __init__(
        self, service: Service, header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S
    ) -> None:
        self.service = service
        self.runner = web.AppRunner(
            make_app(service, body_timeout_s),
            handler_cancellation=True,
            access_log=None,
            # on shutdown open streams get a few seconds, not aiohttp's default minute (the daemon drains first)
            shutdown_timeout=1.0,
            # aiohttp closes a connection still waiting for a whole request this long after it opened or was
            # last answered: the header deadline, which also closes idle keep-alive connections
            keepalive_timeout=header_timeout_s,
            logger=OneLineBadRequests(logging.getLogger("genie.http.protocol")),
        )
        self.port = 0

    async def start(self) -> None:
        cfg = self.service.config
        await self.runner.setup()
        site = web.TCPSite(self.runner, cfg.http_host, cfg.http_port, reuse_address=True)
        await site.start()
        server = site._server  # the bound socket: the real port when 0 was asked for
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else cfg.http_port
        log.info("event=http_listening host=%s port=%d auth=%s", cfg.http_host, self.port, bool(cfg.api_key))

    async def stop(self) -> None:
        await self.runner.cleanup()
