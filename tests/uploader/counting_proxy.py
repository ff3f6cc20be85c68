"""A tiny HTTP proxy in front of the moto server that counts each PUT per S3 key.

moto keeps no request log a test can read, so to prove "nothing uploaded twice" the test puts this
in the path: it forwards every request unchanged and answers with moto's response. Loopback only.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import threading
import urllib.parse


class CountingProxy:
    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlparse(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.puts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                connection = http.client.HTTPConnection(*proxy._upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                payload = response.read()
                if self.command == "PUT" and response.status == 200:
                    with proxy._lock:
                        proxy.puts[urllib.parse.unquote(urllib.parse.urlparse(self.path).path)] += 1
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # A HEAD answer has no body but must keep the object's length.
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        self.wfile.write(payload)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the client was killed mid-request: what the kill test does
                connection.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
