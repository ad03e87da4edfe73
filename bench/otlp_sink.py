"""An OTLP/HTTP endpoint that accepts every export and keeps nothing, so the
tracing benchmark pays for encoding and sending spans but needs no collector.

    python -m bench.otlp_sink PORT
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector would

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()


if __name__ == "__main__":
    main()
