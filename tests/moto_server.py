"""moto_server, answering one request at a time.

moto's TransactWriteItems snapshots the table, applies the writes and, when a
condition fails, puts the snapshot back. Under moto_server's threads that
rollback can erase another request's committed write, and the snapshot itself
can fail mid-copy ("dictionary changed size during iteration"). Real DynamoDB
has neither problem; serializing requests gives tests moto's semantics without
its races. It is still the real server app on a real socket.

moto also deep-copies every table a transaction names before it starts, to
put it back if the transaction fails: a cost that grows with the table (a
300-capsule opening test spent minutes in it). With requests serialized, the
items the transaction names are all it can change, so a copy of those is the
same rollback at the cost of the transaction, not of the table.

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


def undo_by_item() -> None:
    import copy

    import moto.dynamodb.models as models
    from moto.dynamodb.models.table import Table

    original = models.DynamoDBBackend.transact_write_items
    real_deepcopy = copy.deepcopy

    class _TablesAsTheyAre:
        """moto's `copy` module, but a Table is "copied" as itself: the rollback below replaces it."""

        def deepcopy(self, value: Any, memo: Any = None) -> Any:
            return value if isinstance(value, Table) else real_deepcopy(value, memo)

        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved = []
        for entry in transact_items:
            op: Any = next(iter(entry.values()), None)
            table = self.tables.get(op.get("TableName")) if isinstance(op, dict) else None
            if table is None:
                continue  # moto answers this one itself
            try:
                hash_key, range_key = self.get_keys_value(table, op.get("Key") or op.get("Item") or {})
            except Exception:
                continue  # nor can it change an item it cannot name
            saved.append((table, hash_key, range_key, real_deepcopy(table.get_item(hash_key, range_key))))
        try:
            original(self, transact_items)
        except Exception:
            for table, hash_key, range_key, item in reversed(saved):
                table.delete_item(hash_key, range_key)
                if item is not None and range_key is not None:
                    table.items[hash_key][range_key] = item
                elif item is not None:
                    table.items[hash_key] = item
            raise

    models.copy = _TablesAsTheyAre()  # type: ignore[attr-defined, assignment]
    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


class KeptAliveRequestHandler(MotoRequestHandler):
    """HTTP/1.1, so a client's connection serves many requests: werkzeug's default,
    HTTP/1.0, made every store call a new TCP connection (and a new thread here),
    a tenth of a server process's time on a busy test."""

    protocol_version = "HTTP/1.1"


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    undo_by_item()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, serialized(app), threaded=True, request_handler=KeptAliveRequestHandler)


if __name__ == "__main__":
    main()
