"""Tags: setTags replacing the viewer's tags, search by normalized prefix in
several scripts, paging, privacy, tag-set status from marker items, the feed's
store budget with tags, and what deleting content does to tags."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from resolvers.domain import tags as tag_resolvers
from tests.api.conftest import Api
from tests.factories import family_with_members

pytestmark = pytest.mark.usefixtures("turns_without_time")

SET_TAGS = """mutation($c: ID!, $v: [String!]!, $s: String, $p: Boolean) {
  setTags(contentId: $c, values: $v, setName: $s, private: $p) {
    value setName mimeType createdAt author { id } content { id }
  }
}"""
SEARCH = """query($f: ID!, $p: String!, $first: Int, $after: String) {
  searchTags(familyId: $f, prefix: $p, first: $first, after: $after) {
    edges { cursor node { value author { id } content { id } } }
    pageInfo { hasNextPage endCursor }
  }
}"""
MY_TAGS = """query($p: String!, $first: Int, $after: String) {
  myTags(prefix: $p, first: $first, after: $after) {
    edges { cursor node { value content { id } } }
    pageInfo { hasNextPage endCursor }
  }
}"""
STATUS = (
    "query($f: ID!, $s: String!) { tagStatus(familyId: $f, setName: $s) { taggedByAnyone taggedByViewer } }"
)
CONTENT_TAGS = "query($id: ID!) { content(id: $id) { tags { value setName author { id } } } }"
CREATE_UPLOAD = "mutation($input: CreateUploadInput!) { createUpload(input: $input) { content { id } } }"
DELETE = "mutation($c: ID!) { deleteContent(contentId: $c) }"


async def new_content(api: Api, user: str, family_id: str, capsule_id: str | None = None) -> str:
    upload: dict[str, Any] = {"familyId": family_id, "type": "TEXT", "mimeType": "text/plain", "sizeBytes": 4}
    if capsule_id is not None:
        upload["capsuleId"] = capsule_id
    data = await api.ok(CREATE_UPLOAD, {"input": upload}, as_=user)
    return str(data["createUpload"]["content"]["id"])


async def set_tags(
    api: Api,
    user: str,
    content_id: str,
    values: list[str],
    set_name: str | None = None,
    private: bool = False,
) -> list[dict[str, Any]]:
    data = await api.ok(SET_TAGS, {"c": content_id, "v": values, "s": set_name, "p": private}, as_=user)
    result: list[dict[str, Any]] = data["setTags"]
    return result


async def search(api: Api, user: str, family_id: str, prefix: str, **more: Any) -> dict[str, Any]:
    data = await api.ok(SEARCH, {"f": family_id, "p": prefix, **more}, as_=user)
    result: dict[str, Any] = data["searchTags"]
    return result


async def found(api: Api, user: str, family_id: str, prefix: str) -> list[str]:
    return [e["node"]["value"] for e in (await search(api, user, family_id, prefix))["edges"]]


async def mine(api: Api, user: str, prefix: str = "") -> list[str]:
    data = await api.ok(MY_TAGS, {"p": prefix}, as_=user)
    return [e["node"]["value"] for e in data["myTags"]["edges"]]


async def content_tags(api: Api, user: str, content_id: str) -> list[tuple[str, str]]:
    data = await api.ok(CONTENT_TAGS, {"id": content_id}, as_=user)
    return [(t["value"], t["author"]["id"]) for t in data["content"]["tags"]]


async def status(api: Api, user: str, family_id: str, set_name: str) -> tuple[bool, bool]:
    data = (await api.ok(STATUS, {"f": family_id, "s": set_name}, as_=user))["tagStatus"]
    return data["taggedByAnyone"], data["taggedByViewer"]


def tag_items(snapshot: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {key: item for key, item in snapshot.items() if key[0].startswith(("TAG#", "TAGSET#"))}


async def test_set_tags_and_retag_replaces_the_old_values(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    content = await new_content(api, "ana", family)
    written = await set_tags(api, "ana", content, ["  Abuela ", "playa", "Verano 2024"], "vacaciones")
    assert [t["value"] for t in written] == ["Abuela", "playa", "Verano 2024"]
    assert {(t["setName"], t["mimeType"], t["author"]["id"], t["content"]["id"]) for t in written} == {
        ("vacaciones", "text/plain", "ana", content)
    }
    assert await found(api, "ben", family, "a") == ["Abuela"]
    assert await found(api, "ben", family, "VER") == ["Verano 2024"]
    assert await mine(api, "ana") == ["Abuela", "playa", "Verano 2024"]
    assert await content_tags(api, "ben", content) == [
        ("Abuela", "ana"),
        ("playa", "ana"),
        ("Verano 2024", "ana"),
    ]
    # Ben's tags sit next to Ana's; Ana's retag leaves them alone.
    await set_tags(api, "ben", content, ["abuelo"])
    await set_tags(api, "ana", content, ["Mar", "playa"], "vacaciones")
    assert await found(api, "ben", family, "a") == ["abuelo"]
    assert await found(api, "ben", family, "ver") == []
    assert await found(api, "ben", family, "p") == ["playa"]
    assert await mine(api, "ana") == ["Mar", "playa"]
    assert await mine(api, "ben") == ["abuelo"]
    assert await content_tags(api, "ana", content) == [("abuelo", "ben"), ("Mar", "ana"), ("playa", "ana")]
    items = tag_items(await api.snapshot())
    assert sorted(k for k in items if k[0].startswith("TAG#")) == [
        (f"TAG#ana#{content}", "VALUE#mar"),
        (f"TAG#ana#{content}", "VALUE#playa"),
        (f"TAG#ben#{content}", "VALUE#abuelo"),
    ]


async def test_search_in_several_scripts_and_cases(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    first, second = await new_content(api, "ana", family), await new_content(api, "ben", family)
    await set_tags(api, "ana", first, ["Ábuela", "Ελένη", "Бабушка", "おばあちゃん", "Straße", "ｶﾞｯｺｳ"])
    await set_tags(api, "ben", second, ["Strasse", "ÁRBOL", "İstanbul", "Việt Nam"])
    assert await found(api, "ben", family, "abu") == ["Ábuela"]
    assert await found(api, "ben", family, "ÁB") == ["Ábuela"]
    assert await found(api, "ben", family, "a") == ["Ábuela", "ÁRBOL"]
    assert await found(api, "ben", family, "ελ") == ["Ελένη"]
    assert await found(api, "ben", family, "ΕΛΈΝ") == ["Ελένη"]
    assert await found(api, "ben", family, "БАБ") == ["Бабушка"]
    assert await found(api, "ben", family, "ба") == ["Бабушка"]
    assert await found(api, "ben", family, "おば") == ["おばあちゃん"]
    assert await found(api, "ben", family, "ガッ") == ["ｶﾞｯｺｳ"]
    assert await found(api, "ben", family, "か") == []  # voicing marks are kept
    # ß folds to ss: both spellings are found by either (equal values follow content ids).
    assert sorted(await found(api, "ben", family, "straß")) == ["Strasse", "Straße"]
    assert sorted(await found(api, "ben", family, "STRASS")) == ["Strasse", "Straße"]
    assert await found(api, "ben", family, "ist") == ["İstanbul"]
    assert await found(api, "ben", family, "viet n") == ["Việt Nam"]
    assert await found(api, "ben", family, "  viet") == ["Việt Nam"]
    assert await found(api, "ben", family, "x") == []


async def test_hash_and_punctuation_stay_inside_the_value(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    content = await new_content(api, "ana", family)
    await set_tags(api, "ana", content, ["C++", "C", "C#", "c d", "C$", "cd"])
    assert await found(api, "ben", family, "c") == ["C", "c d", "C#", "C$", "C++", "cd"]
    assert await found(api, "ben", family, "c#") == ["C#"]
    # A prefix must not run on into the separator after the value "C".
    assert await found(api, "ben", family, "c#" + content[:4]) == []
    assert await found(api, "ben", family, "c ") == ["c d"]
    assert await found(api, "ben", family, "c$") == ["C$"]


async def test_value_order_and_paging_with_cursors(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben", "cy"])
    one, two = await new_content(api, "ana", family), await new_content(api, "ben", family)
    await set_tags(api, "ana", one, ["alto", "Alba", "sol"])
    await set_tags(api, "ben", two, ["ALMA", "ala", "alto"])
    page = await search(api, "cy", family, "al")
    everything = [(e["node"]["value"], e["node"]["author"]["id"]) for e in page["edges"]]
    # Value order; equal values (the two "alto") follow their content ids.
    assert [value for value, _ in everything] == ["ala", "Alba", "ALMA", "alto", "alto"]
    assert sorted(everything) == sorted(
        [("ala", "ben"), ("Alba", "ana"), ("ALMA", "ben"), ("alto", "ana"), ("alto", "ben")]
    )
    assert page["pageInfo"]["hasNextPage"] is False

    seen: list[tuple[str, str]] = []
    after = None
    pages = 0
    while True:
        page = await search(api, "cy", family, "al", first=2, after=after)
        seen += [(e["node"]["value"], e["node"]["author"]["id"]) for e in page["edges"]]
        pages += 1
        assert page["pageInfo"]["endCursor"] == (page["edges"][-1]["cursor"] if page["edges"] else None)
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == everything and pages == 3

    cursor = (await search(api, "cy", family, "al", first=2))["pageInfo"]["endCursor"]
    tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
    for variables in (
        {"f": family, "p": "al", "after": tampered},
        {"f": family, "p": "alt", "after": cursor},  # another prefix
        {"f": family, "p": "al", "after": "not-a-cursor"},
    ):
        code, _ = await api.error(SEARCH, variables, as_="cy")
        assert code == "BAD_USER_INPUT", variables
    # Nor may another viewer reuse it.
    assert (await api.error(SEARCH, {"f": family, "p": "al", "after": cursor}, as_="ben"))[
        0
    ] == "BAD_USER_INPUT"

    data = await api.ok(MY_TAGS, {"p": "", "first": 2}, as_="ben")
    assert [e["node"]["value"] for e in data["myTags"]["edges"]] == ["ala", "ALMA"]
    rest = await api.ok(MY_TAGS, {"p": "", "after": data["myTags"]["pageInfo"]["endCursor"]}, as_="ben")
    assert [e["node"]["value"] for e in rest["myTags"]["edges"]] == ["alto"]
    assert rest["myTags"]["pageInfo"]["hasNextPage"] is False


async def test_private_tags_are_their_authors_alone(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    content = await new_content(api, "ana", family)
    await set_tags(api, "ana", content, ["Secreto", "Sorpresa"], "regalos", private=True)
    await set_tags(api, "ben", content, ["Sol"], "verano")
    assert await found(api, "ben", family, "s") == ["Sol"]
    # Family search lists public tags; one's own private tags are in myTags.
    assert await found(api, "ana", family, "s") == ["Sol"]
    assert await mine(api, "ana", "s") == ["Secreto", "Sorpresa"]
    assert await content_tags(api, "ben", content) == [("Sol", "ben")]
    assert await content_tags(api, "ana", content) == [
        ("Secreto", "ana"),
        ("Sol", "ben"),
        ("Sorpresa", "ana"),
    ]
    # A private tag does not tell others that the set is tagged.
    assert await status(api, "ben", family, "regalos") == (False, False)
    assert await status(api, "ana", family, "regalos") == (True, True)
    # Making them public shows them.
    await set_tags(api, "ana", content, ["Secreto"], "regalos")
    assert await found(api, "ben", family, "s") == ["Secreto", "Sol"]
    assert await status(api, "ben", family, "regalos") == (True, False)


async def test_tag_status_follows_the_markers(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    one, two = await new_content(api, "ana", family), await new_content(api, "ana", family)
    assert await status(api, "ana", family, "boda") == (False, False)
    await set_tags(api, "ana", one, ["novia", "novio"], "boda")
    await set_tags(api, "ana", two, ["tarta"], "boda")
    assert await status(api, "ana", family, "boda") == (True, True)
    assert await status(api, "ben", family, "boda") == (True, False)
    await set_tags(api, "ben", one, ["baile"], "boda")
    assert await status(api, "ben", family, "boda") == (True, True)
    snapshot = await api.snapshot()
    assert snapshot[(f"TAGSET#{family}#boda", "ANY")]["count"] == 4
    assert snapshot[(f"TAGSET#{family}#boda", "USER#ana")]["count"] == 3
    # Moving one content's tags to another set moves the counts.
    await set_tags(api, "ana", one, ["novia"], "fiesta")
    assert await status(api, "ana", family, "fiesta") == (True, True)
    snapshot = await api.snapshot()
    assert snapshot[(f"TAGSET#{family}#boda", "ANY")]["count"] == 2
    assert snapshot[(f"TAGSET#{family}#boda", "USER#ana")]["count"] == 1
    # Removing the last tag of a set clears its markers.
    await set_tags(api, "ana", two, [])
    await set_tags(api, "ben", one, [])
    assert await status(api, "ana", family, "boda") == (False, False)
    assert await status(api, "ben", family, "boda") == (False, False)
    await set_tags(api, "ana", one, [])
    assert await status(api, "ana", family, "fiesta") == (False, False)
    assert tag_items(await api.snapshot()) == {}
    assert await content_tags(api, "ana", one) == []
    assert await mine(api, "ana") == []


async def test_duplicates_fold_to_the_first_spelling(api: Api) -> None:
    family = await family_with_members(api, "ana", [])
    content = await new_content(api, "ana", family)
    written = await set_tags(
        api, "ana", content, ["Abuela", "abuela", " ABUELA ", "Ábuela", "Straße", "STRASSE"]
    )
    assert [t["value"] for t in written] == ["Abuela", "Straße"]
    assert await mine(api, "ana") == ["Abuela", "Straße"]
    # Ten distinct values after folding are fine.
    ten = [f"v{n}" for n in range(10)] + ["V0", "v1 "]
    assert len(await set_tags(api, "ana", content, ten)) == 10


async def test_refusals_change_nothing(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    other = await family_with_members(api, "zoe", [], "Los Pérez")
    content = await new_content(api, "ana", family)
    await set_tags(api, "ana", content, ["abuela"], "fotos")
    await api.sign_in("ana", "ben", "zoe")
    before = await api.snapshot()
    refusals: list[tuple[str, str, dict[str, Any], str]] = [
        ("zoe", SET_TAGS, {"c": content, "v": ["intruso"]}, "NOT_FOUND"),
        ("ana", SET_TAGS, {"c": "nope", "v": ["x"]}, "NOT_FOUND"),
        ("zoe", SEARCH, {"f": family, "p": "a"}, "NOT_FOUND"),
        ("ana", SEARCH, {"f": other, "p": "a"}, "NOT_FOUND"),
        ("zoe", STATUS, {"f": family, "s": "fotos"}, "NOT_FOUND"),
        ("ana", SET_TAGS, {"c": content, "v": [f"t{n}" for n in range(11)]}, "BAD_USER_INPUT"),
        ("ana", SET_TAGS, {"c": content, "v": ["x" * 51]}, "BAD_USER_INPUT"),
        ("ana", SET_TAGS, {"c": content, "v": ["ok"], "s": "s" * 65}, "BAD_USER_INPUT"),
        ("ana", SET_TAGS, {"c": content, "v": ["ok"], "s": "  "}, "BAD_USER_INPUT"),
        ("ana", SET_TAGS, {"c": content, "v": ["ok", ""]}, "BAD_USER_INPUT"),
        ("ana", SET_TAGS, {"c": content, "v": ["   "]}, "BAD_USER_INPUT"),
        ("ana", SET_TAGS, {"c": content, "v": ["a\nb"]}, "BAD_USER_INPUT"),
        ("ana", SET_TAGS, {"c": content, "v": ["\u0301"]}, "BAD_USER_INPUT"),
        ("ana", SEARCH, {"f": family, "p": ""}, "BAD_USER_INPUT"),
        ("ana", SEARCH, {"f": family, "p": "   "}, "BAD_USER_INPUT"),
        ("ana", SEARCH, {"f": family, "p": "a", "first": 0}, "BAD_USER_INPUT"),
        ("ana", STATUS, {"f": family, "s": ""}, "BAD_USER_INPUT"),
    ]
    for user, query, variables, expected in refusals:
        code, _ = await api.error(query, variables, as_=user)
        assert code == expected, (user, variables)
    assert await api.snapshot() == before
    # Fifty characters and a 64-character set name are fine.
    await set_tags(api, "ana", content, ["x" * 50], "s" * 64)
    assert await mine(api, "ana") == ["x" * 50]


async def test_sealed_capsule_content_stays_hidden(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    unlock = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    capsule = await api.ok(
        "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
        {"i": {"familyId": family, "title": "Para Ben", "unlockDate": unlock, "recipientIds": ["ben"]}},
        as_="ana",
    )
    capsule_id = capsule["createCapsule"]["id"]
    await api.ok(
        "mutation($c: ID!) { scheduleCapsule(capsuleId: $c) { status } }", {"c": capsule_id}, as_="ana"
    )
    sealed = await new_content(api, "ana", family, capsule_id)
    visible = await new_content(api, "ana", family)
    await set_tags(api, "ana", sealed, ["cumpleaños"], "sorpresas")
    await set_tags(api, "ana", visible, ["cumbia"])
    assert await found(api, "ana", family, "cum") == ["cumbia", "cumpleaños"]
    assert await found(api, "ben", family, "cum") == ["cumbia"]
    assert await mine(api, "ana", "cump") == ["cumpleaños"]
    before = await api.snapshot()
    assert (await api.error(SET_TAGS, {"c": sealed, "v": ["x"]}, as_="ben"))[0] == "NOT_FOUND"
    assert await api.snapshot() == before


async def test_deleting_content_removes_its_tags(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    content, kept = await new_content(api, "ana", family), await new_content(api, "ana", family)
    await set_tags(api, "ana", content, ["boda", "baile"], "boda")
    await set_tags(api, "ben", content, ["brindis"], "boda", private=True)
    await set_tags(api, "ben", kept, ["bosque"], "campo")
    assert await status(api, "ben", family, "boda") == (True, True)
    assert await api.ok(DELETE, {"c": content}, as_="ana") == {"deleteContent": True}
    assert await found(api, "ben", family, "b") == ["bosque"]
    assert await mine(api, "ana") == [] and await mine(api, "ben") == ["bosque"]
    assert await status(api, "ana", family, "boda") == (False, False)
    assert await status(api, "ben", family, "boda") == (False, False)
    assert await status(api, "ben", family, "campo") == (True, True)
    left = tag_items(await api.snapshot())
    assert sorted(left) == [
        (f"TAG#ben#{kept}", "VALUE#bosque"),
        (f"TAGSET#{family}#campo", "ANY"),
        (f"TAGSET#{family}#campo", "USER#ben"),
    ]
    assert not any(key[0] == f"CONTENT#{content}" for key in await api.snapshot())


async def test_deleting_content_with_more_tags_than_one_transaction_holds(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend a transaction holds very little, so whole authors' tags go first.
    monkeypatch.setattr(tag_resolvers, "CLEANUP_BUDGET", 4)
    family = await family_with_members(api, "ana", ["ben", "cy"])
    content = await new_content(api, "ana", family)
    for user in ("ana", "ben", "cy"):
        await set_tags(api, user, content, [f"{user}-1", f"{user}-2", f"{user}-3"], "lote")
    assert await api.ok(DELETE, {"c": content}, as_="ana") == {"deleteContent": True}
    assert tag_items(await api.snapshot()) == {}
    assert await found(api, "ana", family, "a") == []
    assert await status(api, "cy", family, "lote") == (False, False)


async def test_tag_status_is_one_batch_get(api: Api) -> None:
    family = await family_with_members(api, "ana", ["ben"])
    content = await new_content(api, "ana", family)
    await set_tags(api, "ana", content, ["uno"], "serie")
    await api.sign_in("ben")
    api.table.latency = 0.02  # type: ignore[attr-defined]
    api.table.reset()  # type: ignore[attr-defined]
    assert await status(api, "ben", family, "serie") == (True, False)
    assert dict(api.table.calls) == {"batch_get": 1}  # type: ignore[attr-defined]
    assert api.table.round_trips == 1  # type: ignore[attr-defined]


FEED = """query($id: ID!) { family(id: $id) { feed(first: 20) { edges { node {
  id author { givenName } reactions { emoji count } viewerReactions commentCount %s } } } } }"""


async def test_feed_with_tags_costs_no_extra_round_trip(api: Api) -> None:
    authors = ["ana", "ben", "cy", "dee"]
    family = await family_with_members(api, "ana", authors[1:])
    contents = [await new_content(api, authors[n % 4], family) for n in range(20)]
    for n, content in enumerate(contents[:12]):
        await set_tags(api, authors[n % 4], content, [f"tag{n}", "común"], private=n % 3 == 0)
        await set_tags(api, authors[(n + 1) % 4], content, [f"otro{n}"])

    async def measure(fields: str) -> tuple[dict[str, int], int, dict[str, Any]]:
        await api.sign_in("ben")
        api.table.latency = 0.02  # type: ignore[attr-defined]
        api.table.reset()  # type: ignore[attr-defined]
        data = await api.ok(FEED % fields, {"id": family}, as_="ben")
        calls = dict(api.table.calls)  # type: ignore[attr-defined]
        rounds = api.table.round_trips  # type: ignore[attr-defined]
        api.table.latency = 0  # type: ignore[attr-defined]
        return calls, rounds, data

    plain_calls, plain_rounds, _ = await measure("")
    tag_calls, tag_rounds, data = await measure("tags { value }")
    # 1: family + membership; 2: the feed query (GSI1); 3: authors, the viewer's
    # reactions and (with tags) every content's tag summary, in one batch get.
    assert (plain_calls, plain_rounds) == ({"batch_get": 2, "query": 1}, 3)
    assert (tag_calls, tag_rounds) == ({"batch_get": 2, "query": 1}, 3)
    by_id = {
        e["node"]["id"]: [t["value"] for t in e["node"]["tags"]] for e in data["family"]["feed"]["edges"]
    }
    assert len(by_id) == 20
    # Ben sees public tags and his own private ones (n = 9: 9 % 4 == 1).
    assert by_id[contents[1]] == ["común", "otro1", "tag1"]
    assert by_id[contents[0]] == ["otro0"]  # Ana's tags there are private
    assert by_id[contents[9]] == ["común", "otro9", "tag9"]
    assert by_id[contents[19]] == []


async def test_concurrent_set_tags_keep_the_counts(api: Api) -> None:
    users = ["ana", "ben", "cy", "dee"]
    family = await family_with_members(api, "ana", users[1:])
    content = await new_content(api, "ana", family)
    others = [await new_content(api, user, family) for user in users]
    await api.sign_in(*users)
    writes = [set_tags(api, user, content, [f"{user}-a", f"{user}-b"], "juntos") for user in users]
    writes += [
        set_tags(api, user, other, ["solo"], "juntos") for user, other in zip(users, others, strict=True)
    ]
    # A little latency makes the requests interleave: they read the same markers
    # and summary, all but one transaction is cancelled, and those retry.
    api.table.latency = 0.01  # type: ignore[attr-defined]
    api.table.reset()  # type: ignore[attr-defined]
    await asyncio.gather(*writes)
    assert api.table.calls["transact"] > len(writes)  # type: ignore[attr-defined]
    api.table.latency = 0  # type: ignore[attr-defined]
    snapshot = await api.snapshot()
    assert snapshot[(f"TAGSET#{family}#juntos", "ANY")]["count"] == 12
    assert {snapshot[(f"TAGSET#{family}#juntos", f"USER#{u}")]["count"] for u in users} == {3}
    assert len(snapshot[(f"CONTENT#{content}", "TAGS")]["tags"]) == 8
    await asyncio.gather(*(set_tags(api, user, content, []) for user in users))
    await asyncio.gather(*(set_tags(api, user, other, []) for user, other in zip(users, others, strict=True)))
    assert tag_items(await api.snapshot()) == {}
