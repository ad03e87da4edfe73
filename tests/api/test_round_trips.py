"""Store calls and sequential round trips, counted through the port with a
simulated latency so calls of one resolver level overlap as over a network."""

from __future__ import annotations

from tests.api.conftest import Api
from tests.factories import join, make_family, settle, upload

LATENCY = 0.02


async def measure(api: Api, query: str, variables: dict, viewer: str) -> tuple[int, int, dict[str, int]]:
    await api.sign_in(viewer)  # the first-request profile check is cached per process
    api.table.latency = LATENCY  # type: ignore[attr-defined]
    api.table.reset()  # type: ignore[attr-defined]
    await api.ok(query, variables, as_=viewer)
    calls = dict(api.table.calls)  # type: ignore[attr-defined]
    rounds = api.table.round_trips  # type: ignore[attr-defined]
    api.table.latency = 0  # type: ignore[attr-defined]
    return sum(calls.values()), rounds, calls


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
