"""A push service for section 10, in a process of its own: HTTP/1.1 with
keep-alive, 201 to every POST, the moment of each noted (the machine's
monotonic clock, which every process shares), nothing decrypted. In its own
process its CPU is not taken from the server's event loop by the GIL, as a
push service's never is. `GET /stats` answers how many it took and when the
first and the last came (`/stats?count=N` once N have come, so the bench
need not poll); `POST /reset` forgets them. With a delay, each push is
answered that long after it came, as a push service across a network is
(its connection waits meanwhile, as an HTTP/1.1 connection does).

    python -m bench.push_sink [DELAY_MS]   # prints its port, then serves until killed
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


class Sink:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.waiting: list[tuple[int, asyncio.Future[None]]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length:
                    await reader.readexactly(length)
                body = b""
                if method == "POST" and path.startswith("/push/"):
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    now = time.monotonic()
                    if not self.count:
                        self.first = now
                    self.count += 1
                    self.last = now
                    status = b"201 Created"
                    for wanted, future in self.waiting:
                        if self.count >= wanted and not future.done():
                            future.set_result(None)
                elif path.startswith("/stats"):
                    # `/stats?count=N` answers once N have come.
                    wanted = int(path.partition("count=")[2] or 0)
                    if self.count < wanted:
                        future = asyncio.get_running_loop().create_future()
                        self.waiting.append((wanted, future))
                        await future
                        self.waiting.remove((wanted, future))
                    body = json.dumps({"count": self.count, "first": self.first, "last": self.last}).encode()
                    status = b"200 OK"
                elif path == "/reset":
                    self.count, self.first, self.last = 0, 0.0, 0.0
                    status = b"200 OK"
                else:
                    status = b"404 Not Found"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def main(delay: float) -> None:
    sink = Sink(delay)
    server = await asyncio.start_server(sink.serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(float(sys.argv[1]) / 1000 if len(sys.argv) > 1 else 0.0))
