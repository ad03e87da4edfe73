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

import base64
import json
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


def query_without_sorting_the_table() -> None:
    """moto's query sorts every item of the table by its keys, keeps those of the
    partition (or of the index key) asked for, then sorts those again. The second
    sort alone sets the order of the answer, so the first is waste, and it grew
    with the table: a third of moto's time in a test of a few thousand items. Here
    a query starts from the partition's items (or, for an index, from every item,
    unsorted)."""
    from moto.dynamodb.models.table import Table

    original = Table.query

    def query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.range_key_attr:
            return original(self, hash_key, *args, **kwargs)
        on_index = args[6] if len(args) > 6 else kwargs.get("index_name")
        if on_index:
            candidates = [item for partition in self.items.values() for item in partition.values()]
        else:
            candidates = list(self.items.get(hash_key, {}).values())
        self.all_items = lambda: candidates
        try:
            return original(self, hash_key, *args, **kwargs)
        finally:
            del self.all_items

    Table.query = query  # type: ignore[method-assign]


# The item operations the store makes: their answers are items and keys, already
# in DynamoDB's own JSON once moto has turned its types into plain values.
ITEM_OPERATIONS = frozenset(
    {
        "GetItem",
        "BatchGetItem",
        "Query",
        "Scan",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "BatchWriteItem",
        "TransactWriteItems",
        "TransactGetItems",
    }
)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(inner) for key, inner in value.items() if inner is not None}
    if isinstance(value, list):
        return [_plain(inner) for inner in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def items_answered_as_json() -> None:
    """moto writes every answer by walking botocore's model of it, member by
    member, looking up each name under several spellings: over a quarter of its
    time in a test that reads many items. An item operation's answer is a plain
    mapping of DynamoDB JSON already, so it is written as JSON (binary values
    in base64, as the wire has them; members its model does not name left out, as
    moto's writer leaves them). Errors and every other operation keep
    moto's own writer. MOTO_CHECK_ANSWERS=1 writes both and fails on a difference."""
    from moto.dynamodb.responses import DynamoResult

    original = DynamoResult.execute_result
    check = os.environ.get("MOTO_CHECK_ANSWERS") == "1"

    def execute_result(self: Any, context: Any) -> Any:
        if str(context.operation_model.name) not in ITEM_OPERATIONS or not isinstance(self.result, dict):
            return original(self, context)
        members = context.operation_model.output_shape.members
        answer = {
            key: _plain(value) for key, value in self.result.items() if key in members and value is not None
        }
        body = json.dumps(answer, separators=(",", ":"))
        if check:
            status, _, theirs = original(self, context)
            assert status == 200 and json.loads(theirs) == json.loads(body), (theirs, body)
        return 200, {"Content-Type": "application/x-amz-json-1.0"}, body

    DynamoResult.execute_result = execute_result  # type: ignore[method-assign]


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))
    undo_by_item()
    query_without_sorting_the_table()
    items_answered_as_json()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, serialized(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
