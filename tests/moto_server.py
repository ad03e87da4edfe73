"""moto_server, answering one request at a time.

moto's TransactWriteItems snapshots the table, applies the writes and, when a
condition fails, puts the snapshot back. Under moto_server's threads that
rollback can erase another request's committed write, and the snapshot itself
can fail mid-copy ("dictionary changed size during iteration"). Real DynamoDB
has neither problem; serializing requests gives tests moto's semantics without
its races. It is still the real server app on a real socket.

moto also deep-copies the whole table once per item of a transaction (seven
copies for a seven-item transaction) although nothing changes between those
copies; with requests serialized, one copy per transaction is the same
snapshot, and a 2,000-item table no longer costs half a second a transaction.

    python -m tests.moto_server HOST PORT
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


def serialized(app: Callable[..., Iterable[bytes]]) -> Callable[..., list[bytes]]:
    lock = threading.Lock()

    def handle(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with lock:
            return list(app(environ, start_response))

    return handle


def one_snapshot_per_transaction() -> None:
    import copy

    import moto.dynamodb.models as models

    original = models.DynamoDBBackend.transact_write_items
    real_deepcopy = copy.deepcopy

    class _Copy:
        def __init__(self) -> None:
            self.memo: dict[int, Any] | None = None

        def deepcopy(self, value: Any, memo: Any = None) -> Any:
            if self.memo is None:
                return real_deepcopy(value, memo)
            if id(value) not in self.memo:
                self.memo[id(value)] = real_deepcopy(value)
            return self.memo[id(value)]

        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

    shim = _Copy()

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        shim.memo = {}
        try:
            original(self, transact_items)
        finally:
            shim.memo = None

    models.copy = shim  # type: ignore[attr-defined, assignment]
    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    one_snapshot_per_transaction()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, serialized(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
