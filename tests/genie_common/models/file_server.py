"""Local HTTP servers for pull tests: plain files with Range support (optionally dropping the connection
half-way through a body), and Hugging Face's file-resolve API as huggingface_hub sees it.

`/{name}` serves `files[name]`. `/{owner}/{repo}/resolve/{revision}/{file}` answers as huggingface.co
does for an LFS file: a HEAD or GET gets a 302 to `/cdn/{sha256}` with X-Repo-Commit, X-Linked-Etag
(the sha256) and X-Linked-Size; `/cdn/{sha256}` serves the bytes. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FileServer:
    files: dict[str, bytes] = field(default_factory=dict)  # "/x.gguf" -> bytes
    hf_files: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (OWNER/REPO, file) -> bytes
    hf_sha256: dict[tuple[str, str], str] = field(default_factory=dict)  # what X-Linked-Etag claims, if not the truth
    drop_after_bytes: int | None = None  # send this many body bytes of a file, then close the connection
    seen: list[Seen] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def gets(self, prefix: str = "/") -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path.startswith(prefix)]


def _handler(server: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            server.seen.append(Seen(self.command, self.path, dict(self.headers.items())))
            if "/resolve/" in self.path:
                return self._resolve()
            if self.path.startswith("/cdn/"):
                blobs = {hashlib.sha256(b).hexdigest(): b for b in server.hf_files.values()}
                data = blobs.get(self.path[len("/cdn/") :])
            else:
                data = server.files.get(unquote(self.path))
            if data is None:
                self.send_error(404)
                return
            self._serve(data, body)

        def _resolve(self) -> None:
            owner, repo, _, revision, filename = self.path.lstrip("/").split("/", 4)
            data = server.hf_files.get((f"{owner}/{repo}", filename))
            if data is None or revision not in ("main", COMMIT):
                self.send_error(404)
                return
            sha = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"{server.url}/cdn/{sha}")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Etag", f'"{server.hf_sha256.get((f"{owner}/{repo}", filename), sha)}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", '"a-git-blob-id"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _serve(self, data: bytes, body: bool) -> None:
            etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
            start = 0
            rng = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if rng and (if_range is None or if_range == etag):
                start = int(rng.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("ETag", etag)
            self.end_headers()
            if not body:
                return
            if server.drop_after_bytes is not None:
                self.wfile.write(data[start : server.drop_after_bytes])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(data[start:])

    return Handler


@contextmanager
def serving(server: FileServer) -> Iterator[FileServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
