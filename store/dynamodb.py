"""The DynamoDB engine: the `Table` port on one DynamoDB table, through one
aiobotocore client opened once per process (see `open_dynamo_table`).

Semantics follow the SQLite adapter, which is the reference: the same cursors
(`cursor_for` / `decode_cursor`), the same paging rules (a cursor only when
at least one more item exists), the same condition and update meaning. What
DynamoDB cannot make atomic is said so where it matters: `batch_write` is not
a transaction here (use `transact` for that).

Throttling is botocore's to retry (adaptive mode, `client_config`): one call
makes at most `BOTOCORE_ATTEMPTS` attempts, with client-side rate limiting.
What botocore does not retry is retried here, with capped, jittered
exponential backoff: unprocessed keys and items of the batch calls, and a
transaction cancelled only for throttling.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from decimal import Decimal
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from store import formats
from store.expressions import cursor_for, decode_cursor
from store.port import (
    INDEX_KEYS,
    MAX_TRANSACTION_ITEMS,
    TTL_ATTRIBUTE,
    And,
    Cancellation,
    Check,
    Compare,
    Condition,
    ConditionFailed,
    Delete,
    Exists,
    In,
    Index,
    InvalidCursor,
    Item,
    Key,
    NotExists,
    Or,
    Page,
    Put,
    SortKey,
    StoreError,
    StoreUnavailable,
    TransactionCancelled,
    Update,
    WriteOp,
    op_key,
)

BATCH_GET_SIZE = 100
BATCH_WRITE_SIZE = 25
BOTOCORE_ATTEMPTS = 6  # per call, botocore's own (adaptive mode backs off and rate-limits)
MAX_ATTEMPTS = 8  # our own, for unprocessed batch items and throttled transactions
BASE_DELAY = 0.05  # seconds; doubled per attempt, jittered, capped
MAX_DELAY = 3.0

# Calls that change the table: one not answered may have been applied.
_WRITES = frozenset({"put_item", "update_item", "delete_item", "batch_write_item", "transact_write_items"})
# Refusals that mean "not now", after botocore's own retries.
_THROTTLED = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
# No answer from DynamoDB at all.
_UNANSWERED = (ConnectTimeoutError, ReadTimeoutError, EndpointConnectionError, ConnectionClosedError)

# Cancellation reasons after which the whole transaction may simply be resent.
_RETRYABLE_CANCELLATIONS = frozenset({"ThrottlingError", "ProvisionedThroughputExceeded"})
# UpdateItem needs at least one action; removing an attribute nobody writes is a
# no-op that still creates a missing item, as an empty update does in SQLite.
_NOOP_ATTRIBUTE = "__mifamilias_noop__"

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def client_config() -> AioConfig:
    return AioConfig(
        retries={"mode": "adaptive", "max_attempts": BOTOCORE_ATTEMPTS},
        connect_timeout=5,
        read_timeout=20,
        max_pool_connections=50,
    )


# Values -----------------------------------------------------------------------


def _to_dynamo(value: Any) -> Any:
    """Floats become Decimals (boto3 refuses floats); everything else as is."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StoreError(f"DynamoDB cannot store {value!r}")
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_dynamo(v) for v in value]
    return value


def _from_dynamo(value: Any) -> Any:
    """Decimals become int when integral, float otherwise."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_dynamo(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {_from_dynamo(v) for v in value}
    return value


def serialize(value: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = _serializer.serialize(_to_dynamo(value))
    except (TypeError, ValueError, ArithmeticError) as error:
        raise StoreError(f"DynamoDB cannot store {value!r}: {error}") from error
    return result


def serialize_item(item: Mapping[str, Any]) -> dict[str, Any]:
    return {name: serialize(value) for name, value in item.items()}


def stored_item(item: Item) -> dict[str, Any]:
    """An item as every put sends it: in the current format (`store.formats`)."""
    return serialize_item(formats.stamped(item))


def deserialize_item(raw: Mapping[str, Any]) -> Item:
    return {name: _from_dynamo(_deserializer.deserialize(value)) for name, value in raw.items()}


def _key(key: Key) -> dict[str, Any]:
    return {"PK": {"S": key[0]}, "SK": {"S": key[1]}}


def _validate(item: Item) -> None:
    if not isinstance(item.get("PK"), str) or not isinstance(item.get("SK"), str):
        raise StoreError("an item needs string PK and SK")
    for name in ("GSI1PK", "GSI1SK", "GSI2PK", "GSI2SK"):
        if name in item and not isinstance(item[name], str):
            raise StoreError(f"{name} must be a string")


# Expressions ------------------------------------------------------------------


class _Expression:
    """Collects #n / :v placeholders; attribute names are never inlined, since
    they may hold '#', '.', emoji or reserved words."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self._placeholders: dict[str, str] = {}

    def name(self, attr: str) -> str:
        placeholder = self._placeholders.get(attr)
        if placeholder is None:
            placeholder = f"#n{len(self._placeholders)}"
            self._placeholders[attr] = placeholder
            self.names[placeholder] = attr
        return placeholder

    def value(self, value: Any) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = serialize(value)
        return placeholder

    def condition(self, condition: Condition) -> str:
        if isinstance(condition, Exists):
            return f"attribute_exists({self.name(condition.attr)})"
        if isinstance(condition, NotExists):
            return f"attribute_not_exists({self.name(condition.attr)})"
        if isinstance(condition, Compare):
            name = self.name(condition.attr)
            test = f"{name} {condition.op} {self.value(condition.value)}"
            if condition.op == "<>":
                # A missing attribute is "not equal" (expressions.matches).
                return f"(attribute_not_exists({name}) OR {test})"
            if condition.value is None:
                # ... and never equal, not even to NULL (moto says otherwise).
                return f"(attribute_exists({name}) AND {test})"
            return test
        if isinstance(condition, In):
            if not condition.values:
                return self._never(condition.attr)
            name = self.name(condition.attr)
            # IN takes at most 100 operands.
            parts = [
                f"{name} IN ({', '.join(self.value(v) for v in condition.values[i : i + 100])})"
                for i in range(0, len(condition.values), 100)
            ]
            test = parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"
            if None in condition.values:
                return f"(attribute_exists({name}) AND {test})"
            return test
        if isinstance(condition, And):
            if not condition.conditions:
                return self._always()
            return "(" + " AND ".join(self.condition(c) for c in condition.conditions) + ")"
        if isinstance(condition, Or):
            if not condition.conditions:
                return self._never("PK")
            return "(" + " OR ".join(self.condition(c) for c in condition.conditions) + ")"
        raise TypeError(f"unknown condition {condition!r}")

    def _always(self) -> str:
        name = self.name("PK")
        return f"(attribute_exists({name}) OR attribute_not_exists({name}))"

    def _never(self, attr: str) -> str:
        name = self.name(attr)
        return f"(attribute_exists({name}) AND attribute_not_exists({name}))"

    def update(self, update: Update) -> str:
        # Fold SET, then REMOVE, then ADD per attribute, in expressions.apply_update's
        # order, since DynamoDB refuses two actions on one attribute.
        final: dict[str, tuple[str, Any]] = {}
        for attr, value in update.set.items():
            final[attr] = ("set", value)
        for attr in update.remove:
            final[attr] = ("remove", None)
        for attr, delta in update.add.items():
            before = final.get(attr)
            if before is None:
                final[attr] = ("add", delta)
            elif before[0] == "set":
                final[attr] = ("set", int(before[1] or 0) + delta)
            else:
                final[attr] = ("set", delta)
        for attr, key_part in (("PK", update.key[0]), ("SK", update.key[1])):
            action = final.pop(attr, None)
            if action is not None and action != ("set", key_part):
                raise StoreError(f"an update cannot change {attr}")
        sets = [f"{self.name(a)} = {self.value(v)}" for a, (kind, v) in final.items() if kind == "set"]
        removes = [self.name(a) for a, (kind, _) in final.items() if kind == "remove"]
        adds = [f"{self.name(a)} {self.value(d)}" for a, (kind, d) in final.items() if kind == "add"]
        clauses = []
        if sets:
            clauses.append("SET " + ", ".join(sets))
        if removes:
            clauses.append("REMOVE " + ", ".join(removes))
        if adds:
            clauses.append("ADD " + ", ".join(adds))
        if not clauses:
            clauses.append(f"REMOVE {self.name(_NOOP_ATTRIBUTE)}")
        return " ".join(clauses)

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self.names:
            params["ExpressionAttributeNames"] = dict(self.names)
        if self.values:
            params["ExpressionAttributeValues"] = dict(self.values)
        return params


def _condition_params(condition: Condition | None) -> dict[str, Any]:
    if condition is None:
        return {}
    expression = _Expression()
    compiled = expression.condition(condition)
    return {"ConditionExpression": compiled, **expression.params()}


def _update_params(update: Update) -> dict[str, Any]:
    """An update as every UpdateItem sends it: the item it leaves is in the
    current format (`store.formats`)."""
    expression = _Expression()
    params: dict[str, Any] = {"UpdateExpression": expression.update(formats.stamped_update(update))}
    if update.condition is not None:
        params["ConditionExpression"] = expression.condition(update.condition)
    params.update(expression.params())
    return params


# Errors and retries -------------------------------------------------------------


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


async def _backoff(attempt: int) -> None:
    delay = min(MAX_DELAY, BASE_DELAY * 2**attempt)
    await asyncio.sleep(delay * random.uniform(0.5, 1.0))


_REASONS_IN_MESSAGE = re.compile(r"\[([^\]]*)\]\s*$")


def _cancellation_codes(error: ClientError) -> list[str]:
    """One code per transaction item, "None" for those that did not fail.
    botocore puts the modeled `CancellationReasons` in the response (as moto
    and DynamoDB send it); older stacks only had them in the message."""
    reasons = error.response.get("CancellationReasons")
    if isinstance(reasons, list):
        return [str(reason.get("Code", "None")) for reason in reasons]
    message = str(error.response.get("Error", {}).get("Message", ""))
    found = _REASONS_IN_MESSAGE.search(message)
    if found is None:
        return []
    return [part.strip() for part in found.group(1).split(",")]


# The adapter ------------------------------------------------------------------------


class DynamoTable:
    def __init__(self, client: Any, table_name: str) -> None:
        self._client = client
        self.table_name = table_name
        self._owned: AsyncExitStack | None = None

    @property
    def client(self) -> Any:
        return self._client

    @classmethod
    async def connect(
        cls, table_name: str, endpoint_url: str | None = None, region: str | None = None
    ) -> DynamoTable:
        """Open one client for this table; `close()` closes it."""
        stack = AsyncExitStack()
        try:
            client = await stack.enter_async_context(
                aioboto3.Session().client(
                    "dynamodb", endpoint_url=endpoint_url, region_name=region, config=client_config()
                )
            )
        except BaseException:
            await stack.aclose()
            raise
        table = cls(client, table_name)
        table._owned = stack
        return table

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        """One call (botocore retries throttling), its errors in our terms: a
        call DynamoDB did not answer is StoreUnavailable, and a write among
        them has an unknown outcome unless DynamoDB refused it (throttling)."""
        method = getattr(self._client, operation)
        try:
            response: dict[str, Any] = await method(**params)
            return response
        except ClientError as error:
            code = _code(error)
            if code in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                raise
            if code == "ValidationException" and "ExclusiveStartKey" in params:
                message = str(error.response.get("Error", {}).get("Message", ""))
                if "start" in message.lower():
                    raise InvalidCursor("the cursor does not fit this query") from error
            if code in _THROTTLED:
                raise StoreUnavailable(
                    f"DynamoDB {operation} throttled: {code}", outcome_known=True
                ) from error
            if int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) >= 500:
                raise StoreUnavailable(
                    f"DynamoDB {operation} failed: {code}", outcome_known=operation not in _WRITES
                ) from error
            raise StoreError(f"DynamoDB {operation} failed: {code}: {error}") from error
        except _UNANSWERED as error:
            raise StoreUnavailable(
                f"DynamoDB {operation} did not answer: {type(error).__name__}",
                # Nothing was sent when no connection was made; botocore may
                # have sent an earlier attempt, so only reads are sure.
                outcome_known=operation not in _WRITES,
            ) from error
        except BotoCoreError as error:
            raise StoreError(f"DynamoDB {operation} failed: {error}") from error

    # Reads --------------------------------------------------------------------

    async def get(self, key: Key) -> Item | None:
        response = await self._call("get_item", TableName=self.table_name, Key=_key(key), ConsistentRead=True)
        raw = response.get("Item")
        return None if raw is None else deserialize_item(raw)

    async def batch_get(self, keys: Sequence[Key]) -> dict[Key, Item]:
        unique = list(dict.fromkeys(keys))
        chunks = [unique[i : i + BATCH_GET_SIZE] for i in range(0, len(unique), BATCH_GET_SIZE)]
        found: dict[Key, Item] = {}
        for part in await asyncio.gather(*(self._batch_get_chunk(chunk) for chunk in chunks)):
            found.update(part)
        return found

    async def _batch_get_chunk(self, keys: Sequence[Key]) -> dict[Key, Item]:
        found: dict[Key, Item] = {}
        pending: list[dict[str, Any]] = [_key(key) for key in keys]
        for attempt in range(MAX_ATTEMPTS):
            response = await self._call(
                "batch_get_item",
                RequestItems={self.table_name: {"Keys": pending, "ConsistentRead": True}},
            )
            for raw in response.get("Responses", {}).get(self.table_name, []):
                item = deserialize_item(raw)
                found[(item["PK"], item["SK"])] = item
            pending = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys", [])
            if not pending:
                return found
            if attempt < MAX_ATTEMPTS - 1:
                await _backoff(attempt)
        raise StoreError(f"BatchGetItem left {len(pending)} keys unprocessed after {MAX_ATTEMPTS} attempts")

    async def query(
        self,
        pk: str,
        sk: SortKey | None = None,
        *,
        index: Index = "table",
        descending: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page:
        if limit is not None and limit < 1:
            raise StoreError("limit must be at least 1")
        pk_name, sk_name = INDEX_KEYS[index]
        names = {"#pk": pk_name}
        values: dict[str, Any] = {":pk": {"S": pk}}
        condition = "#pk = :pk"
        if sk is not None:
            names["#sk"] = sk_name
            values[":sk"] = {"S": sk.value}
            if sk.op == "begins_with":
                condition += " AND begins_with(#sk, :sk)"
            elif sk.op == "between":
                if sk.upper is None:
                    raise StoreError("between needs an upper bound")
                values[":upper"] = {"S": sk.upper}
                condition += " AND #sk BETWEEN :sk AND :upper"
            else:
                condition += f" AND #sk {sk.op} :sk"
        params: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ScanIndexForward": not descending,
        }
        if index == "table":
            params["ConsistentRead"] = True
        else:
            params["IndexName"] = index
        if cursor is not None:
            position = decode_cursor(cursor, index)
            if position[pk_name] != pk:
                raise InvalidCursor("the cursor belongs to another partition")
            params["ExclusiveStartKey"] = {name: {"S": value} for name, value in position.items()}

        wanted = None if limit is None else limit + 1  # one more tells whether a next page exists
        items: list[Item] = []
        while True:
            if wanted is not None:
                params["Limit"] = wanted - len(items)
            response = await self._call("query", **params)
            items.extend(deserialize_item(raw) for raw in response.get("Items", []))
            last = response.get("LastEvaluatedKey")
            if not last or (wanted is not None and len(items) >= wanted):
                break
            params["ExclusiveStartKey"] = last

        if limit is not None and len(items) > limit:
            items = items[:limit]
            return Page(items, cursor_for(items[-1], index))
        return Page(items, None)

    # Writes -------------------------------------------------------------------

    async def put(self, item: Item, condition: Condition | None = None) -> None:
        _validate(item)
        key = (item["PK"], item["SK"])
        try:
            await self._call(
                "put_item",
                TableName=self.table_name,
                Item=stored_item(item),
                **_condition_params(condition),
            )
        except ClientError as error:
            raise self._failure(error, key) from error

    async def update(self, update: Update) -> Item:
        try:
            response = await self._call(
                "update_item",
                TableName=self.table_name,
                Key=_key(update.key),
                ReturnValues="ALL_NEW",
                **_update_params(update),
            )
        except ClientError as error:
            raise self._failure(error, update.key) from error
        return deserialize_item(response.get("Attributes", _key(update.key)))

    async def delete(self, key: Key, condition: Condition | None = None) -> Item | None:
        try:
            response = await self._call(
                "delete_item",
                TableName=self.table_name,
                Key=_key(key),
                ReturnValues="ALL_OLD",
                **_condition_params(condition),
            )
        except ClientError as error:
            raise self._failure(error, key) from error
        raw = response.get("Attributes")
        return None if not raw else deserialize_item(raw)

    @staticmethod
    def _failure(error: ClientError, key: Key) -> StoreError:
        if _code(error) == "ConditionalCheckFailedException":
            return ConditionFailed(key)
        return StoreError(f"DynamoDB write failed: {_code(error)}: {error}")

    async def batch_write(self, puts: Sequence[Item] = (), deletes: Sequence[Key] = ()) -> None:
        """Puts, then deletes, as in SQLite: a key both put and deleted ends
        deleted. Not atomic across items (BatchWriteItem never is)."""
        for item in puts:
            _validate(item)
        requests: dict[Key, dict[str, Any]] = {}
        for item in puts:
            requests[(item["PK"], item["SK"])] = {"PutRequest": {"Item": stored_item(item)}}
        for key in deletes:
            requests.pop(key, None)
            requests[key] = {"DeleteRequest": {"Key": _key(key)}}
        ordered = list(requests.values())
        for start in range(0, len(ordered), BATCH_WRITE_SIZE):
            await self._batch_write_chunk(ordered[start : start + BATCH_WRITE_SIZE])

    async def _batch_write_chunk(self, requests: list[dict[str, Any]]) -> None:
        pending = requests
        for attempt in range(MAX_ATTEMPTS):
            response = await self._call("batch_write_item", RequestItems={self.table_name: pending})
            pending = response.get("UnprocessedItems", {}).get(self.table_name, [])
            if not pending:
                return
            if attempt < MAX_ATTEMPTS - 1:
                await _backoff(attempt)
        raise StoreError(
            f"BatchWriteItem left {len(pending)} writes unprocessed after {MAX_ATTEMPTS} attempts"
        )

    async def transact(self, ops: Sequence[WriteOp]) -> None:
        if not ops:
            return
        if len(ops) > MAX_TRANSACTION_ITEMS:
            raise StoreError(f"a transaction holds at most {MAX_TRANSACTION_ITEMS} items")
        op_keys = [op_key(op) for op in ops]
        if len(set(op_keys)) != len(op_keys):
            raise StoreError("a transaction may touch each item only once")
        items = [self._transact_item(op) for op in ops]
        for attempt in range(MAX_ATTEMPTS):
            try:
                await self._call("transact_write_items", TransactItems=items)
                return
            except ClientError as error:
                codes = _cancellation_codes(error)
                failed = [
                    Cancellation(i, op_keys[i], code)
                    for i, code in enumerate(codes)
                    if code not in ("None", "") and i < len(op_keys)
                ]
                retry = bool(failed) and all(r.reason in _RETRYABLE_CANCELLATIONS for r in failed)
                if retry and attempt < MAX_ATTEMPTS - 1:
                    await _backoff(attempt)
                    continue
                if not failed:
                    raise StoreError(f"transaction cancelled: {error}") from error
                raise TransactionCancelled(failed) from error
        raise AssertionError("unreachable")  # pragma: no cover

    def _transact_item(self, op: WriteOp) -> dict[str, Any]:
        if isinstance(op, Put):
            _validate(op.item)
            return {
                "Put": {
                    "TableName": self.table_name,
                    "Item": stored_item(op.item),
                    **_condition_params(op.condition),
                }
            }
        if isinstance(op, Update):
            return {"Update": {"TableName": self.table_name, "Key": _key(op.key), **_update_params(op)}}
        if isinstance(op, Delete):
            return {
                "Delete": {
                    "TableName": self.table_name,
                    "Key": _key(op.key),
                    **_condition_params(op.condition),
                }
            }
        if isinstance(op, Check):
            return {
                "ConditionCheck": {
                    "TableName": self.table_name,
                    "Key": _key(op.key),
                    **_condition_params(op.condition),
                }
            }
        raise TypeError(f"unknown write {op!r}")

    # Lifecycle ------------------------------------------------------------------

    async def ping(self) -> None:
        await self._call("describe_table", TableName=self.table_name)

    async def close(self) -> None:
        """Closes the client only when this table opened it (`connect`)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.aclose()


@asynccontextmanager
async def open_dynamo_table(
    table_name: str, endpoint_url: str | None = None, region: str | None = None
) -> AsyncIterator[DynamoTable]:
    """One client for the process: enter it in the app lifespan."""
    table = await DynamoTable.connect(table_name, endpoint_url, region)
    try:
        yield table
    finally:
        await table.close()


# Table creation -------------------------------------------------------------------------


async def create_table(client: Any, table_name: str, *, wait_seconds: float = 120.0) -> bool:
    """Create the table with GSI1 and GSI2 (projection ALL, on demand) and TTL on
    `expiresAt`. True when created, False when it already existed; either way it
    is ACTIVE, with TTL on, on return. deploy/cloudformation.yaml declares the
    same table (tests/test_deploy.py compares them)."""
    attributes = ["PK", "SK", "GSI1PK", "GSI1SK", "GSI2PK", "GSI2SK"]
    created = True
    try:
        await client.create_table(
            TableName=table_name,
            AttributeDefinitions=[{"AttributeName": name, "AttributeType": "S"} for name in attributes],
            KeySchema=[
                {"AttributeName": "PK", "KeyType": "HASH"},
                {"AttributeName": "SK", "KeyType": "RANGE"},
            ],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": index,
                    "KeySchema": [
                        {"AttributeName": INDEX_KEYS[index][0], "KeyType": "HASH"},
                        {"AttributeName": INDEX_KEYS[index][1], "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                }
                for index in ("GSI1", "GSI2")
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    except ClientError as error:
        message = str(error.response.get("Error", {}).get("Message", "")).lower()
        if _code(error) != "ResourceInUseException" and "already exists" not in message:
            raise StoreError(f"cannot create table {table_name}: {error}") from error
        created = False
    await _wait_active(client, table_name, wait_seconds)
    await _enable_ttl(client, table_name)
    return created


async def _enable_ttl(client: Any, table_name: str) -> None:
    """TTL on TTL_ATTRIBUTE; a table made before it existed gets it here too."""
    try:
        described = await client.describe_time_to_live(TableName=table_name)
        status = described.get("TimeToLiveDescription", {}).get("TimeToLiveStatus")
        if status in ("ENABLED", "ENABLING"):
            return  # turning it on twice is an error
        await client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )
    except ClientError as error:
        raise StoreError(f"cannot turn on TTL for table {table_name}: {error}") from error


async def _wait_active(client: Any, table_name: str, wait_seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while True:
        try:
            response: dict[str, Any] = await client.describe_table(TableName=table_name)
        except ClientError as error:
            if _code(error) != "ResourceNotFoundException":
                raise StoreError(f"cannot describe table {table_name}: {error}") from error
            response = {}
        table = response.get("Table", {})
        indexes = table.get("GlobalSecondaryIndexes", [])
        if table.get("TableStatus") == "ACTIVE" and all(i.get("IndexStatus") == "ACTIVE" for i in indexes):
            return
        if loop.time() >= deadline:
            raise StoreError(f"table {table_name} is not active after {wait_seconds:.0f}s")
        await asyncio.sleep(0.5)
