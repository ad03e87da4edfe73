"""Store calls and sequential round trips, counted through the port with a
simulated latency so calls of one resolver level overlap as over a network.

`test_every_operation` runs the typical call of every query and mutation
(tests/typical_calls.py, the calls bench section 5 reports) and asserts its
exact numbers on both engines. The operations come from the schema: one it has
and `EXPECTED` does not fails the test until it gets a row."""

from __future__ import annotations

import pytest

from schema import schema
from tests.api.conftest import Api
from tests.counting import CountingTable
from tests.factories import join, make_family, settle, upload
from tests.typical_calls import VIEWERS, build_world, label, only_the_request, operations, schema_operations

pytestmark = pytest.mark.usefixtures("turns_without_time")

LATENCY = 0.02
MOST_ROUND_TRIPS = 3

# label: (store calls, sequential round trips) of the typical call.
EXPECTED: dict[str, tuple[int, int]] = {
    "query `me`": (1, 1),
    "query `user`": (3, 2),
    "query `myFamilies`": (3, 3),
    "query `family` (members)": (3, 3),
    "query `family` (the feed query of sections 1–2)": (11, 4),
    "query `content`": (3, 3),
    "query `capsule`": (3, 3),
    "query `myCapsules`": (2, 2),
    "query `receivedCapsules`": (3, 3),
    "query `searchTags`": (3, 3),
    # The family check, the index, then every hit's checks at once: the contents in one
    # batch, one query per term and hit (2 terms x 3 hits).
    "query `searchContent`": (9, 3),
    "query `myTags`": (1, 1),
    "query `tagStatus`": (1, 1),
    "query `notifications`": (4, 3),
    "mutation `updateProfile`": (1, 1),
    "mutation `completeOnboarding`": (1, 1),
    "mutation `createFamily`": (2, 2),
    "mutation `rotateInviteCode`": (2, 2),
    "mutation `joinFamily`": (8, 4),
    "mutation `vouch`": (2, 2),
    "mutation `approveMember`": (5, 3),
    "mutation `removeMember`": (3, 3),
    "mutation `leaveFamily`": (3, 3),
    "mutation `setMemberRole`": (2, 2),
    "mutation `createInvite`": (2, 2),
    "mutation `revokeInvite`": (2, 2),
    "mutation `updateFamilySettings`": (2, 2),
    "query `family` (the admins' view)": (5, 3),
    "mutation `createUpload`": (3, 2),
    "mutation `completeUpload`": (3, 3),
    "mutation `retryContent`": (3, 3),
    "mutation `markContentViewed`": (3, 3),
    "mutation `deleteContent`": (4, 3),
    "mutation `addComment`": (4, 3),
    "mutation `deleteComment`": (3, 3),
    "mutation `addReaction`": (4, 3),
    "mutation `removeReaction`": (4, 3),
    "mutation `createCapsule`": (3, 2),
    "mutation `scheduleCapsule`": (3, 3),
    "mutation `cancelCapsule`": (3, 3),
    "mutation `openCapsule`": (3, 3),
    "mutation `setTags`": (3, 3),
    "mutation `markNotificationsRead`": (2, 2),
    "mutation `restoreContent`": (3, 3),
    "mutation `resumeUpload`": (2, 2),
    "mutation `requestDataExport`": (2, 2),
    "query `rateLimit`": (0, 0),
    "query `dataExport`": (1, 1),
    "mutation `deleteMyAccount`": (17, 17),
    "query `webPushPublicKey`": (0, 0),
    "mutation `registerPushDevice`": (2, 2),
    "query `myPushDevices`": (1, 1),
    "mutation `unregisterPushDevice`": (2, 2),
    "mutation `muteFamily`": (2, 2),
}
# Over the bound, each for a reason written in docs/decisions.md ("Three round
# trips at most"). The notifications are being rewritten elsewhere: recorded as
# they are, not yet held to it.
BEYOND_THREE = {
    "query `family` (the feed query of sections 1–2)",
    "mutation `joinFamily`",
    "mutation `deleteMyAccount`",
}


async def measure(api: Api, query: str, variables: dict, viewer: str) -> tuple[int, int, dict[str, int]]:
    await api.sign_in(viewer)  # the first-request profile check is cached per process
    await api.services.pusher.stop()  # its work is not the request's
    api.table.latency = LATENCY  # type: ignore[attr-defined]
    api.table.reset()  # type: ignore[attr-defined]
    await api.ok(query, variables, as_=viewer)
    calls = dict(api.table.calls)  # type: ignore[attr-defined]
    rounds = api.table.round_trips  # type: ignore[attr-defined]
    api.table.latency = 0  # type: ignore[attr-defined]
    await api.services.pusher.start()
    return sum(calls.values()), rounds, calls


async def test_every_operation(api: Api) -> None:
    table = api.table
    assert isinstance(table, CountingTable)
    world = await build_world(api, api.clock)
    ops = operations(api, world)
    kinds = {(label(op).split()[0], op.field) for op in ops}
    assert schema_operations(schema) - kinds == set(), "an operation without a typical call"
    assert {label(op) for op in ops} == set(EXPECTED), "an operation without a row in EXPECTED"
    await api.sign_in(*VIEWERS)
    measured: dict[str, tuple[int, int]] = {}
    traces: dict[str, str] = {}
    for op in ops:
        variables = await op.setup() if op.setup else {}
        async with only_the_request(api):
            table.reset()
            table.latency = LATENCY
            try:
                await api.ok(op.document, variables, as_=op.viewer)
            finally:
                table.latency = 0
        measured[label(op)] = (table.total_calls, table.round_trips)
        traces[label(op)] = table.rounds()
        import os

        if os.environ.get("TRACE_ALL"):
            print(f"\n== {label(op)} {measured[label(op)]}\n{traces[label(op)]}")
    differing = {
        name: (measured[name], EXPECTED[name]) for name in EXPECTED if measured[name] != EXPECTED[name]
    }
    assert not differing, "\n".join(
        f"{name}: measured {got}, expected {want}\n{traces[name]}" for name, (got, want) in differing.items()
    )
    over = {name for name, (_, rounds) in EXPECTED.items() if rounds > MOST_ROUND_TRIPS}
    assert over == BEYOND_THREE, "more than three sequential round trips, or a reason no longer needed"


async def test_my_families_is_one_store_call_per_level(api: Api) -> None:
    for n in range(3):
        family = await make_family(api, "viewer", f"Family {n}")
        for m in range(9):
            await join(api, f"f{n}m{m}", family["inviteCode"])
    query = "{ myFamilies { family { name admin { givenName } members { edges { node { user { givenName } } } } } } }"
    _, rounds, calls = await measure(api, query, {}, "viewer")
    # 1: the viewer's family mirrors (query); 2: families + memberships (one batch get);
    # 3: each family's members (one query per family partition, in parallel) and the admins
    # (one batch get); 4: the 27 other members' profiles (one batch get).
    assert calls == {"query": 4, "batch_get": 3}
    assert rounds == 4


async def test_feed_page_budget(api: Api) -> None:
    family = await make_family(api, "ana")
    authors = ["ana", "ben", "cy", "dee", "eve"]
    for user in authors[1:]:
        await join(api, user, family["inviteCode"])
    for n in range(20):
        await upload(api, authors[n % 5], family["id"], "TEXT", b"hola", "text/plain", title=str(n))
    await settle(api)
    query = """query($id: ID!) { family(id: $id) { feed(first: 20) { edges { node {
      id author { givenName } reactions { emoji count } viewerReactions commentCount } } } } }"""
    total, rounds, calls = await measure(api, query, {"id": family["id"]}, "ben")
    # 1: family + viewer membership; 2: the feed (GSI1); 3: authors and the viewer's reactions.
    assert calls == {"batch_get": 2, "query": 1}
    assert rounds == 3
    assert total == 3
