"""A loopback HTTP server for tests that stand in for a provider: ``serving(Handler)`` runs one in a thread and
yields its port; `ProviderHandler` answers the model list every CLI chat asks for first and writes bodies whole."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class ProviderHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that lists no models on GET (the check before the first prompt passes) and logs nothing."""

    def do_GET(self) -> None:
        self.send_body("application/json", b'{"data": []}')

    def send_body(self, kind: str, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving(
    handler: type[http.server.BaseHTTPRequestHandler], *, on_close: Callable[[], None] = lambda: None
) -> Iterator[int]:
    """A threading HTTP server on 127.0.0.1 running ``handler``, its port yielded; ``on_close`` runs first at the end
    (to release a handler still waiting), then the server stops."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        on_close()
        server.shutdown()
        server.server_close()
        thread.join(5)
