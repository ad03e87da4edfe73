"""The one contract every `Table` adapter meets, run on each engine."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from store import dynamodb, formats
from store.dynamodb import DynamoTable, create_table, open_dynamo_table
from store.port import (
    Cancellation,
    Check,
    Compare,
    ConditionFailed,
    Delete,
    Exists,
    In,
    Index,
    InvalidCursor,
    Item,
    Key,
    NotExists,
    Put,
    SortKey,
    StoreError,
    Table,
    TransactionCancelled,
    Update,
    all_of,
    any_of,
    eq,
)
from store.sqlite import SqliteTable


def key_of(item: Item) -> Key:
    return (item["PK"], item["SK"])


def stored(item: Item) -> Item:
    """An item as a read gives it back: every write leaves it in the current
    format (`store.formats`)."""
    return formats.stamped(item)


async def all_pages(
    table: Table,
    pk: str,
    sk: SortKey | None = None,
    *,
    index: Index = "table",
    descending: bool = False,
    limit: int,
) -> list[list[Item]]:
    pages: list[list[Item]] = []
    cursor: str | None = None
    while True:
        page = await table.query(pk, sk, index=index, descending=descending, limit=limit, cursor=cursor)
        assert len(page.items) <= limit
        pages.append(page.items)
        if page.cursor is None:
            return pages
        assert len(page.items) == limit  # a cursor only after a full page
        cursor = page.cursor
        assert len(pages) < 1000


# Items --------------------------------------------------------------------------


async def test_put_get_round_trip_keeps_types_and_odd_names(table: Table) -> None:
    item: Item = {
        "PK": "FAMILY#f1",
        "SK": "META",
        "name": "Los García 😀",
        "empty": "",
        "count": 42,
        "negative": -7,
        "big": 2**53 + 1,
        "ratio": 1.5,
        "yes": True,
        "no": False,
        "nothing": None,
        "list": [1, "two", None, True, {"x": [3]}],
        "nested": {"a": {"b": {"c": "d"}}, "n": 0, "empty": {}},
        "R#😀": ["USER#u1", "USER#u2"],
        "név.with.dots": "ok",
    }
    await table.put(item)
    assert await table.get(key_of(item)) == stored(item)
    assert await table.get(("FAMILY#f1", "MISSING")) is None
    assert await table.get(("FAMILY#nobody", "META")) is None

    # A put replaces the whole item.
    await table.put({"PK": "FAMILY#f1", "SK": "META", "name": "new"})
    assert await table.get(("FAMILY#f1", "META")) == stored({"PK": "FAMILY#f1", "SK": "META", "name": "new"})


async def test_put_rejects_items_without_string_keys(table: Table) -> None:
    with pytest.raises(StoreError):
        await table.put({"PK": "A"})
    with pytest.raises(StoreError):
        await table.put({"PK": "A", "SK": 1})


async def test_batch_get_crosses_chunks_and_leaves_missing_keys_out(table: Table) -> None:
    items = [{"PK": f"P#{i % 7}", "SK": f"S#{i:04d}", "n": i, "R#😀": {"i": i}} for i in range(200)]
    await table.batch_write(puts=items)
    missing = [(f"P#{i % 7}", f"S#{i:04d}") for i in range(200, 250)]
    keys = [key_of(item) for item in items] + missing
    keys = keys[::-1] + keys[:10]  # any order, duplicates allowed
    assert len(keys) > 250
    found = await table.batch_get(keys)
    assert set(found) == {key_of(item) for item in items}
    for item in items:
        assert found[key_of(item)] == stored(item)
    assert await table.batch_get([]) == {}
    assert await table.batch_get(missing) == {}


async def test_batch_write_crosses_chunks_and_deletes(table: Table) -> None:
    items = [{"PK": "BULK", "SK": f"{i:03d}", "n": i} for i in range(60)]
    await table.batch_write(puts=items)
    page = await table.query("BULK")
    assert page.items == [stored(item) for item in items]
    assert page.cursor is None

    deleted = [key_of(item) for item in items[:30]]
    extra = [{"PK": "BULK", "SK": f"x{i:02d}", "n": i} for i in range(5)]
    await table.batch_write(puts=extra, deletes=deleted)
    remaining = (await table.query("BULK")).items
    assert remaining == [stored(item) for item in items[30:] + extra]
    assert await table.batch_get(deleted) == {}

    # Deleting what is missing is fine; a key both put and deleted ends deleted.
    await table.batch_write(
        puts=[{"PK": "BULK", "SK": "both", "n": 1}],
        deletes=[("BULK", "both"), ("BULK", "never-there")],
    )
    assert await table.get(("BULK", "both")) is None
    await table.batch_write()


# Queries ------------------------------------------------------------------------

SKS = [f"A#{i:02d}" for i in range(1, 11)] + ["B#01", "B#02", "C"]


async def put_partition(table: Table) -> None:
    await table.batch_write(
        puts=[{"PK": "Q", "SK": sk, "v": sk} for sk in SKS]
        + [{"PK": "Q2", "SK": sk, "v": "other"} for sk in SKS]
        + [{"PK": "Q#", "SK": "A#01"}]
    )


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (None, SKS),
        (SortKey("=", "A#05"), ["A#05"]),
        (SortKey("=", "A#5"), []),
        (SortKey("<", "A#03"), ["A#01", "A#02"]),
        (SortKey("<=", "A#03"), ["A#01", "A#02", "A#03"]),
        (SortKey(">", "B#01"), ["B#02", "C"]),
        (SortKey(">=", "B#01"), ["B#01", "B#02", "C"]),
        (SortKey.begins_with("A#"), SKS[:10]),
        (SortKey.begins_with("B"), ["B#01", "B#02"]),
        (SortKey.begins_with("Z"), []),
        (SortKey.between("A#09", "B#01"), ["A#09", "A#10", "B#01"]),
        (SortKey.between("A#095", "A#10"), ["A#10"]),
    ],
    ids=lambda value: repr(value),
)
async def test_query_sort_key_conditions(
    table: Table, condition: SortKey | None, expected: list[str]
) -> None:
    await put_partition(table)
    ascending = await table.query("Q", condition)
    assert [item["SK"] for item in ascending.items] == expected
    assert all(item["PK"] == "Q" and item["v"] == item["SK"] for item in ascending.items)
    assert ascending.cursor is None
    descending = await table.query("Q", condition, descending=True)
    assert [item["SK"] for item in descending.items] == expected[::-1]
    assert descending.cursor is None


async def test_query_empty_partition(table: Table) -> None:
    page = await table.query("NOBODY")
    assert page.items == []
    assert page.cursor is None
    page = await table.query("NOBODY", limit=3)
    assert page.items == []
    assert page.cursor is None


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize(("count", "limit"), [(23, 5), (20, 5), (5, 5), (4, 5), (7, 1)])
async def test_query_paging_walks_every_item_once(
    table: Table, descending: bool, count: int, limit: int
) -> None:
    items = [{"PK": "PAGED", "SK": f"M#{i:03d}", "i": i} for i in range(count)]
    await table.batch_write(puts=[*items, {"PK": "PAGED", "SK": "OTHER"}, {"PK": "PAGED2", "SK": "M#000"}])
    pages = await all_pages(table, "PAGED", SortKey.begins_with("M#"), descending=descending, limit=limit)
    walked = [item for page in pages for item in page]
    assert walked == [stored(item) for item in (items[::-1] if descending else items)]
    assert len(pages) == max(1, -(-count // limit))  # no empty page at the end


async def test_query_limit_follows_short_pages_of_large_items(table: Table) -> None:
    # ~2.5 MB in one partition: DynamoDB answers 1 MB per request.
    blob = "x" * 100_000
    items = [{"PK": "LARGE", "SK": f"{i:02d}", "blob": blob} for i in range(25)]
    await table.batch_write(puts=items)
    everything = await table.query("LARGE")
    assert [item["SK"] for item in everything.items] == [item["SK"] for item in items]
    assert everything.cursor is None

    first = await table.query("LARGE", limit=20)
    assert [item["SK"] for item in first.items] == [f"{i:02d}" for i in range(20)]
    assert first.cursor is not None
    rest = await table.query("LARGE", limit=20, cursor=first.cursor)
    assert [item["SK"] for item in rest.items] == [f"{i:02d}" for i in range(20, 25)]
    assert rest.cursor is None


async def test_query_after_the_cursor_item_was_deleted(table: Table) -> None:
    await table.batch_write(puts=[{"PK": "D", "SK": f"{i}"} for i in range(6)])
    first = await table.query("D", limit=3)
    assert first.cursor is not None
    await table.delete(("D", "2"))
    rest = await table.query("D", limit=3, cursor=first.cursor)
    assert [item["SK"] for item in rest.items] == ["3", "4", "5"]
    assert rest.cursor is None


# Indexes ------------------------------------------------------------------------


async def test_gsis_are_sparse_and_follow_updates(table: Table) -> None:
    await table.batch_write(
        puts=[
            {
                "PK": "USER#1",
                "SK": "PROFILE",
                "GSI1PK": "EMAIL",
                "GSI1SK": "b@x",
                "GSI2PK": "G2",
                "GSI2SK": "1",
            },
            {"PK": "USER#2", "SK": "PROFILE", "GSI1PK": "EMAIL", "GSI1SK": "a@x"},
            {"PK": "USER#3", "SK": "PROFILE", "GSI1PK": "EMAIL"},  # no GSI1SK: not in GSI1
            {"PK": "USER#4", "SK": "PROFILE", "GSI1SK": "c@x"},  # no GSI1PK
            {"PK": "USER#5", "SK": "PROFILE", "GSI2PK": "G2"},  # no GSI2SK: not in GSI2
            {"PK": "USER#6", "SK": "PROFILE", "GSI2PK": "G2", "GSI2SK": "0"},
        ]
    )

    gsi1 = await table.query("EMAIL", index="GSI1")
    assert [item["PK"] for item in gsi1.items] == ["USER#2", "USER#1"]
    assert gsi1.items[1]["GSI2SK"] == "1"  # projection ALL
    assert [i["PK"] for i in (await table.query("EMAIL", index="GSI1", descending=True)).items] == [
        "USER#1",
        "USER#2",
    ]
    assert [i["PK"] for i in (await table.query("EMAIL", SortKey("=", "a@x"), index="GSI1")).items] == [
        "USER#2"
    ]
    assert [i["PK"] for i in (await table.query("G2", index="GSI2")).items] == ["USER#6", "USER#1"]
    assert [i["PK"] for i in (await table.query("G2", SortKey(">", "0"), index="GSI2")).items] == ["USER#1"]
    assert (await table.query("EMAIL", index="GSI2")).items == []
    assert (await table.query("EMAIL")).items == []

    # Removing a GSI key attribute takes the item out of that index only.
    await table.update(Update(("USER#1", "PROFILE"), remove=["GSI1SK"]))
    assert [i["PK"] for i in (await table.query("EMAIL", index="GSI1")).items] == ["USER#2"]
    assert [i["PK"] for i in (await table.query("G2", index="GSI2")).items] == ["USER#6", "USER#1"]
    # Completing the keys puts it in; moving them moves it.
    await table.update(Update(("USER#3", "PROFILE"), set={"GSI1SK": "0@x"}))
    await table.update(Update(("USER#6", "PROFILE"), set={"GSI2PK": "G2b"}))
    assert [i["PK"] for i in (await table.query("EMAIL", index="GSI1")).items] == ["USER#3", "USER#2"]
    assert [i["PK"] for i in (await table.query("G2", index="GSI2")).items] == ["USER#1"]
    assert [i["PK"] for i in (await table.query("G2b", index="GSI2")).items] == ["USER#6"]
    await table.delete(("USER#2", "PROFILE"))
    assert [i["PK"] for i in (await table.query("EMAIL", index="GSI1")).items] == ["USER#3"]


@pytest.mark.parametrize("index", ["GSI1", "GSI2"])
async def test_gsi_paging_with_equal_index_sort_keys(table: Table, index: Index) -> None:
    pk_name, sk_name = ("GSI1PK", "GSI1SK") if index == "GSI1" else ("GSI2PK", "GSI2SK")
    # Several items share an index sort key, from several table partitions.
    items = [
        {"PK": f"P#{i % 4}", "SK": f"S#{i:02d}", pk_name: "FEED", sk_name: f"T#{i // 3:02d}"}
        for i in range(17)
    ]
    await table.batch_write(puts=[*items, {"PK": "P#x", "SK": "S", pk_name: "OTHER", sk_name: "T#00"}])
    for descending in (False, True):
        pages = await all_pages(table, "FEED", index=index, limit=4, descending=descending)
        walked = [item for page in pages for item in page]
        assert sorted(map(key_of, walked)) == sorted(map(key_of, items))
        index_sks = [item[sk_name] for item in walked]
        assert index_sks == sorted(index_sks, reverse=descending)
        assert len(pages) == 5
    first = await table.query("FEED", SortKey.between("T#01", "T#03"), index=index, limit=5)
    assert first.cursor is not None
    rest = await table.query(
        "FEED", SortKey.between("T#01", "T#03"), index=index, limit=5, cursor=first.cursor
    )
    assert rest.cursor is None
    assert sorted(map(key_of, first.items + rest.items)) == sorted(
        key_of(item) for item in items if "T#01" <= item[sk_name] <= "T#03"
    )


# Cursors ------------------------------------------------------------------------


async def test_cursor_of_another_partition_or_index_is_invalid(table: Table) -> None:
    await table.batch_write(
        puts=[{"PK": pk, "SK": f"{i}", "GSI1PK": f"G{pk}", "GSI1SK": f"{i}"} for pk in "AB" for i in range(4)]
    )
    page = await table.query("A", limit=2)
    assert page.cursor is not None
    with pytest.raises(InvalidCursor):
        await table.query("B", limit=2, cursor=page.cursor)
    with pytest.raises(InvalidCursor):
        await table.query("GA", index="GSI1", limit=2, cursor=page.cursor)
    gsi_page = await table.query("GA", index="GSI1", limit=2)
    assert gsi_page.cursor is not None
    with pytest.raises(InvalidCursor):
        await table.query("GB", index="GSI1", limit=2, cursor=gsi_page.cursor)
    with pytest.raises(InvalidCursor):
        await table.query("A", limit=2, cursor=gsi_page.cursor)
    # The right partition still works.
    assert [i["SK"] for i in (await table.query("A", limit=2, cursor=page.cursor)).items] == ["2", "3"]


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!!",
        "",
        "%%%%",
        base64.urlsafe_b64encode(b"not json").decode(),
        base64.urlsafe_b64encode(json.dumps([1, 2]).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps({"PK": "A"}).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps({"PK": "A", "SK": 3}).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps({"PK": "A", "SK": "1", "X": "y"}).encode()).decode(),
    ],
)
async def test_garbage_cursor_is_invalid(table: Table, cursor: str) -> None:
    await table.put({"PK": "A", "SK": "1"})
    with pytest.raises(InvalidCursor):
        await table.query("A", limit=1, cursor=cursor)


# Conditions and updates ---------------------------------------------------------


async def test_conditional_put(table: Table) -> None:
    original = {"PK": "FAMILY#f", "SK": "META", "name": "first"}
    await table.put(original, NotExists())
    with pytest.raises(ConditionFailed) as failure:
        await table.put({"PK": "FAMILY#f", "SK": "META", "name": "second"}, NotExists())
    assert failure.value.key == ("FAMILY#f", "META")
    assert await table.get(("FAMILY#f", "META")) == stored(original)

    with pytest.raises(ConditionFailed) as failure:
        await table.put({"PK": "FAMILY#g", "SK": "META"}, Exists())
    assert failure.value.key == ("FAMILY#g", "META")
    assert await table.get(("FAMILY#g", "META")) is None

    await table.put({**original, "name": "third"}, all_of(Exists(), eq("name", "first"), NotExists("R#😀")))
    assert (await table.get(("FAMILY#f", "META")) or {})["name"] == "third"


async def test_update_with_compare_condition(table: Table) -> None:
    key = ("POST#1", "META")
    await table.put({"PK": key[0], "SK": key[1], "status": "draft", "R#😀": 1})
    new = await table.update(
        Update(key, set={"status": "published", "at": 5}, condition=eq("status", "draft"))
    )
    assert new == stored({"PK": key[0], "SK": key[1], "status": "published", "at": 5, "R#😀": 1})
    assert await table.get(key) == new

    with pytest.raises(ConditionFailed) as failure:
        await table.update(Update(key, set={"status": "draft"}, condition=eq("status", "draft")))
    assert failure.value.key == key
    assert await table.get(key) == new

    # A comparison with a missing attribute is false, except <>.
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"x": 1}, condition=eq("missing", "draft")))
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"x": 1}, condition=eq("missing", None)))
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"x": 1}, condition=In("missing", ("a", None))))
    updated = await table.update(Update(key, set={"x": 1}, condition=Compare("missing", "<>", "draft")))
    assert updated["x"] == 1
    updated = await table.update(Update(key, set={"x": 2}, condition=Compare("at", ">=", 5)))
    assert updated["x"] == 2
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"x": 3}, condition=Compare("at", "<", 5)))
    updated = await table.update(
        Update(
            key, set={"x": 4}, condition=any_of(eq("status", "gone"), In("status", ("draft", "published")))
        )
    )
    assert updated["x"] == 4
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"x": 5}, condition=In("status", ("draft", "gone"))))
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"x": 5}, condition=eq("R#😀", 2)))
    assert (await table.get(key) or {})["x"] == 4


async def test_update_set_remove_and_add(table: Table) -> None:
    key = ("COUNTERS", "1")
    # ADD on a missing item creates it, starting from zero.
    assert await table.update(Update(key, add={"hearts": 1})) == stored(
        {"PK": key[0], "SK": key[1], "hearts": 1}
    )
    assert (await table.update(Update(key, add={"hearts": 5, "R#😀": 2})))["hearts"] == 6
    new = await table.update(Update(key, add={"hearts": -10, "R#😀": 1}, set={"label": "x"}))
    assert new == stored({"PK": key[0], "SK": key[1], "hearts": -4, "R#😀": 3, "label": "x"})
    new = await table.update(Update(key, remove=["label", "R#😀", "never-there"], set={"n": None}))
    assert new == stored({"PK": key[0], "SK": key[1], "hearts": -4, "n": None})
    assert await table.get(key) == new
    # NULL and whole lists compare for equality like any value.
    new = await table.update(
        Update(key, set={"tags": ["a", 1]}, condition=all_of(eq("n", None), eq("hearts", -4)))
    )
    assert new["tags"] == ["a", 1]
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"n": 1}, condition=eq("hearts", None)))
    new = await table.update(Update(key, set={"n": 1}, condition=eq("tags", ["a", 1])))
    assert new["n"] == 1


async def test_update_creates_a_missing_item(table: Table) -> None:
    key = ("NEW", "ITEM")
    created = await table.update(Update(key, set={"a": 1, "nested": {"b": [1, 2]}}, condition=NotExists()))
    assert created == stored({"PK": "NEW", "SK": "ITEM", "a": 1, "nested": {"b": [1, 2]}})
    assert await table.get(key) == created
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, set={"a": 2}, condition=NotExists()))


async def test_update_with_nothing_to_change(table: Table) -> None:
    # Condition only: succeeds unchanged, or fails.
    key = ("EMPTY", "UPDATE")
    await table.put({"PK": key[0], "SK": key[1], "status": "ok"})
    assert await table.update(Update(key, condition=eq("status", "ok"))) == stored(
        {"PK": key[0], "SK": key[1], "status": "ok"}
    )
    with pytest.raises(ConditionFailed):
        await table.update(Update(key, condition=eq("status", "no")))
    assert await table.get(key) == stored({"PK": key[0], "SK": key[1], "status": "ok"})
    # With no condition on a missing item, it creates the bare item as DynamoDB does.
    assert await table.update(Update(("EMPTY", "NEW"))) == stored({"PK": "EMPTY", "SK": "NEW"})
    assert await table.get(("EMPTY", "NEW")) == stored({"PK": "EMPTY", "SK": "NEW"})


async def test_delete_returns_the_old_item_and_honours_conditions(table: Table) -> None:
    key = ("DEL", "1")
    item = {"PK": key[0], "SK": key[1], "status": "active", "R#😀": [1]}
    await table.put(item)
    with pytest.raises(ConditionFailed) as failure:
        await table.delete(key, eq("status", "archived"))
    assert failure.value.key == key
    assert await table.get(key) == stored(item)
    assert await table.delete(key, eq("status", "active")) == stored(item)
    assert await table.get(key) is None
    assert await table.delete(key) is None
    with pytest.raises(ConditionFailed):
        await table.delete(key, Exists())


# Transactions -------------------------------------------------------------------


async def test_transaction_is_all_or_nothing(table: Table) -> None:
    await table.batch_write(
        puts=[
            {"PK": "T", "SK": "counter", "n": 1},
            {"PK": "T", "SK": "gone", "v": 1},
            {"PK": "T", "SK": "guard", "status": "locked"},
        ]
    )
    before = (await table.query("T")).items
    with pytest.raises(TransactionCancelled) as cancelled:
        await table.transact(
            [
                Put({"PK": "T", "SK": "new", "v": 1}, NotExists()),
                Update(("T", "counter"), add={"n": 1}),
                Check(("T", "guard"), eq("status", "open")),
                Delete(("T", "gone")),
            ]
        )
    assert cancelled.value.reasons == [Cancellation(2, ("T", "guard"), "ConditionalCheckFailed")]
    assert cancelled.value.failed_on(("T", "guard"))
    assert (await table.query("T")).items == before

    # Several failures are all named, by index.
    with pytest.raises(TransactionCancelled) as cancelled:
        await table.transact(
            [
                Put({"PK": "T", "SK": "counter", "n": 9}, NotExists()),
                Update(("T", "counter2"), set={"n": 1}),
                Delete(("T", "gone"), eq("v", 2)),
            ]
        )
    assert cancelled.value.reasons == [
        Cancellation(0, ("T", "counter"), "ConditionalCheckFailed"),
        Cancellation(2, ("T", "gone"), "ConditionalCheckFailed"),
    ]
    assert cancelled.value.failed_keys == [("T", "counter"), ("T", "gone")]
    assert (await table.query("T")).items == before


async def test_transaction_applies_every_kind_of_write(table: Table) -> None:
    await table.batch_write(
        puts=[
            {"PK": "T", "SK": "counter", "n": 1, "R#😀": "x"},
            {"PK": "T", "SK": "gone", "v": 1},
            {"PK": "T", "SK": "guard", "status": "open"},
        ]
    )
    await table.transact(
        [
            Put({"PK": "T", "SK": "new", "v": 1, "GSI1PK": "G", "GSI1SK": "1"}, NotExists()),
            Update(("T", "counter"), add={"n": 2}, remove=["R#😀"], condition=Exists()),
            Check(("T", "guard"), eq("status", "open")),
            Delete(("T", "gone"), Exists()),
            Update(("T", "created"), set={"by": "transaction"}),
            Update(("T", "bare")),
        ]
    )
    assert (await table.query("T")).items == [
        stored(item)
        for item in (
            {"PK": "T", "SK": "bare"},
            {"PK": "T", "SK": "counter", "n": 3},
            {"PK": "T", "SK": "created", "by": "transaction"},
            {"PK": "T", "SK": "guard", "status": "open"},
            {"PK": "T", "SK": "new", "v": 1, "GSI1PK": "G", "GSI1SK": "1"},
        )
    ]
    assert [item["SK"] for item in (await table.query("G", index="GSI1")).items] == ["new"]
    await table.transact([])


async def test_transaction_rejects_duplicate_keys_and_oversize(table: Table) -> None:
    with pytest.raises(StoreError):
        await table.transact([Put({"PK": "T", "SK": "1"}), Update(("T", "1"), set={"a": 1})])
    with pytest.raises(StoreError):
        await table.transact([Put({"PK": "T", "SK": f"{i}"}) for i in range(101)])
    assert (await table.query("T")).items == []


# Formats ------------------------------------------------------------------------


async def test_every_write_leaves_its_item_in_the_current_format(table: Table) -> None:
    """Whatever wrote it (a put, an update that changes or creates, a batch, a
    transaction's put or update), the item says the format it was last written
    in: no caller can leave the stamp out or set another."""
    await table.put({"PK": "F", "SK": "put", formats.ATTRIBUTE: formats.UNRECORDED})
    await table.put({"PK": "F", "SK": "changed"})
    await table.update(Update(("F", "changed"), set={"a": 1}, remove=[formats.ATTRIBUTE]))
    await table.update(Update(("F", "created"), add={"n": 1, formats.ATTRIBUTE: 5}))
    await table.update(Update(("F", "bare")))
    await table.batch_write(puts=[{"PK": "F", "SK": "batched"}])
    await table.put({"PK": "F", "SK": "checked"})
    await table.transact(
        [
            Put({"PK": "F", "SK": "t-put"}, NotExists()),
            Update(("F", "t-update"), set={formats.ATTRIBUTE: formats.UNRECORDED}),
            Check(("F", "checked"), Exists()),
        ]
    )
    found = {item["SK"]: item.get(formats.ATTRIBUTE) for item in (await table.query("F")).items}
    written = ["bare", "batched", "changed", "checked", "created", "put", "t-put", "t-update"]
    assert found == {sk: formats.CURRENT for sk in written}
    # An item written before formats were recorded says nothing: format 1.
    assert formats.format_of({"PK": "F", "SK": "old"}) == formats.UNRECORDED == 1
    assert formats.format_of(await table.get(("F", "put")) or {}) == formats.CURRENT


# Engine specifics ---------------------------------------------------------------


async def test_sqlite_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "store.db"
    first = SqliteTable(path)
    items: list[dict[str, Any]] = [
        {"PK": "R", "SK": f"{i}", "GSI1PK": "G", "GSI1SK": f"{i}", "R#😀": {"n": i}} for i in range(3)
    ]
    await first.batch_write(puts=items)
    await first.update(Update(("R", "0"), add={"n": 1}))
    await first.close()

    second = SqliteTable(path)
    try:
        assert await second.get(("R", "0")) == stored({**items[0], "n": 1})
        assert (await second.query("R")).items[1:] == [stored(item) for item in items[1:]]
        assert [i["SK"] for i in (await second.query("G", index="GSI1")).items] == ["0", "1", "2"]
        await second.ping()
    finally:
        await second.close()


async def test_dynamodb_create_table_is_safe_to_run_twice(moto_server: str) -> None:
    name = f"twice-{uuid.uuid4().hex[:12]}"
    async with open_dynamo_table(name, moto_server, "us-east-1") as dynamo:
        assert await create_table(dynamo.client, name) is True
        assert await create_table(dynamo.client, name) is False
        await dynamo.ping()
        described = (await dynamo.client.describe_table(TableName=name))["Table"]
        assert described["TableStatus"] == "ACTIVE"
        assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        indexes = {index["IndexName"]: index for index in described["GlobalSecondaryIndexes"]}
        assert set(indexes) == {"GSI1", "GSI2"}
        for index_name, index in indexes.items():
            assert [k["AttributeName"] for k in index["KeySchema"]] == [f"{index_name}PK", f"{index_name}SK"]
            assert index["Projection"]["ProjectionType"] == "ALL"
        await dynamo.put({"PK": "A", "SK": "B"})
        assert await dynamo.get(("A", "B")) == stored({"PK": "A", "SK": "B"})
        await dynamo.client.delete_table(TableName=name)


async def test_dynamodb_ping_fails_without_the_table(moto_server: str) -> None:
    async with open_dynamo_table(f"missing-{uuid.uuid4().hex[:8]}", moto_server, "us-east-1") as dynamo:
        with pytest.raises(StoreError):
            await dynamo.ping()


# DynamoDB retries, on a scripted client -----------------------------------------


class ScriptedClient:
    """Answers each call with the next scripted response or error."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = script
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, operation: str) -> Any:
        async def call(**params: Any) -> Any:
            self.calls.append((operation, params))
            answer = self.script[operation].pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        return call


def client_error(code: str, message: str = "", **extra: Any) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}, **extra}, "Operation")


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamodb, "BASE_DELAY", 0.0)


class ThrottlingEndpoint:
    """A DynamoDB endpoint on loopback that throttles the first `throttles`
    requests, then answers an empty GetItem: what botocore's retries meet."""

    def __init__(self, throttles: int) -> None:
        import http.server
        import threading

        outer = self
        self.throttles = throttles
        self.requests = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests += 1
                if outer.requests <= outer.throttles:
                    status = 400
                    body = (
                        b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"slow"}'
                    )
                else:
                    status, body = 200, b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_dynamodb_throttling_is_retried_by_botocore_within_a_bound(aws_env: None) -> None:
    """No retry loop of ours on plain calls: botocore's adaptive mode retries
    throttling, up to BOTOCORE_ATTEMPTS attempts in all."""
    assert dynamodb.client_config().retries == {
        "mode": "adaptive",
        "max_attempts": dynamodb.BOTOCORE_ATTEMPTS,
    }
    endpoint = ThrottlingEndpoint(throttles=2)
    try:
        async with dynamodb.open_dynamo_table("t", endpoint.url, "us-east-1") as table:
            assert await table.get(("A", "B")) is None
        assert endpoint.requests == 3
    finally:
        endpoint.close()

    # A call that reaches us throttled is an error at once: nothing is retried twice over.
    client = ScriptedClient({"put_item": [client_error("ThrottlingException")]})
    with pytest.raises(StoreError):
        await DynamoTable(client, "t").put({"PK": "A", "SK": "B"})
    assert len(client.calls) == 1


async def test_dynamodb_retries_unprocessed_batch_work_within_a_bound(no_backoff: None) -> None:
    raw_a = {"PK": {"S": "A"}, "SK": {"S": "1"}}
    raw_b = {"PK": {"S": "B"}, "SK": {"S": "1"}}
    client = ScriptedClient(
        {
            "batch_get_item": [
                {"Responses": {"t": [raw_a]}, "UnprocessedKeys": {"t": {"Keys": [raw_b]}}},
                {"Responses": {"t": []}, "UnprocessedKeys": {"t": {"Keys": [raw_b]}}},
                {"Responses": {"t": [raw_b]}, "UnprocessedKeys": {}},
            ]
        }
    )
    found = await DynamoTable(client, "t").batch_get([("A", "1"), ("B", "1")])
    assert found == {("A", "1"): {"PK": "A", "SK": "1"}, ("B", "1"): {"PK": "B", "SK": "1"}}
    assert [params["RequestItems"]["t"]["Keys"] for _, params in client.calls] == [
        [raw_a, raw_b],
        [raw_b],
        [raw_b],
    ]
    assert all(params["RequestItems"]["t"]["ConsistentRead"] for _, params in client.calls)

    stuck = {"UnprocessedKeys": {"t": {"Keys": [raw_b]}}}
    client = ScriptedClient({"batch_get_item": [stuck] * dynamodb.MAX_ATTEMPTS})
    with pytest.raises(StoreError):
        await DynamoTable(client, "t").batch_get([("B", "1")])

    fmt = {formats.ATTRIBUTE: {"N": str(formats.CURRENT)}}
    put_a, put_b = ({"PutRequest": {"Item": {**raw, **fmt}}} for raw in (raw_a, raw_b))
    client = ScriptedClient(
        {"batch_write_item": [{"UnprocessedItems": {"t": [put_b]}}, {"UnprocessedItems": {}}]}
    )
    await DynamoTable(client, "t").batch_write(puts=[{"PK": "A", "SK": "1"}, {"PK": "B", "SK": "1"}])
    assert [params["RequestItems"]["t"] for _, params in client.calls] == [[put_a, put_b], [put_b]]
    client = ScriptedClient(
        {"batch_write_item": [{"UnprocessedItems": {"t": [put_b]}}] * dynamodb.MAX_ATTEMPTS}
    )
    with pytest.raises(StoreError):
        await DynamoTable(client, "t").batch_write(puts=[{"PK": "B", "SK": "1"}])


async def test_dynamodb_cancellation_reasons_from_the_message_and_throttled_transactions(
    no_backoff: None,
) -> None:
    # Without the modeled CancellationReasons, the message still names them.
    message = (
        "Transaction cancelled, please refer cancellation reasons for specific reasons "
        "[None, ConditionalCheckFailed]"
    )
    client = ScriptedClient({"transact_write_items": [client_error("TransactionCanceledException", message)]})
    with pytest.raises(TransactionCancelled) as cancelled:
        await DynamoTable(client, "t").transact([Put({"PK": "A", "SK": "1"}), Check(("B", "1"), Exists())])
    assert cancelled.value.reasons == [Cancellation(1, ("B", "1"), "ConditionalCheckFailed")]

    # A transaction cancelled only by throttling is sent again.
    throttled = client_error(
        "TransactionCanceledException",
        "Transaction cancelled",
        CancellationReasons=[{"Code": "None"}, {"Code": "ThrottlingError"}],
    )
    client = ScriptedClient({"transact_write_items": [throttled, {}]})
    await DynamoTable(client, "t").transact([Put({"PK": "A", "SK": "1"}), Delete(("B", "1"))])
    assert len(client.calls) == 2
