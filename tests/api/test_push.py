"""Push devices and Web Push, in process on both engines, against a push
service on loopback that checks VAPID and decrypts every payload
(tests/push_service.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from resolvers.core.leases import Lease
from resolvers.domain.push import device_id
from resolvers.processes import pusher as pushing
from store import items, keys
from store.enums import NotificationType
from store.port import Key, all_items
from tests.api.conftest import Api, running_api
from tests.api.test_capsules import SCHEDULE, make_capsule
from tests.api.test_resume import note_for
from tests.counting import CountingTable
from tests.factories import capsule_rows, family_rows, family_with_members, settle, upload
from tests.push_service import PushService, b64url, running_push_service
from tests.servers import until

REGISTER = "mutation($i: RegisterPushDeviceInput!) { registerPushDevice(input: $i) { id platform name createdAt lastPushedAt } }"
DEVICES = "{ myPushDevices { id platform name } }"
DELIVERIES = "{ myPushDevices { name gone lastDelivery { at status error } } }"
UNREGISTER = "mutation($id: ID!) { unregisterPushDevice(id: $id) }"
NOTES = "{ notifications(first: 50) { edges { node { id type read } } } }"
COMMENT = "mutation($id: ID!, $b: String!) { addComment(contentId: $id, body: $b) { id } }"
PUSH_TYPES = "mutation($t: [NotificationType!]) { updateProfile(input: {pushTypes: $t}) { pushTypes } }"
MUTE = "mutation($f: ID!, $u: DateTime) { muteFamily(familyId: $f, until: $u) }"


@pytest.fixture
def service() -> Iterator[PushService]:
    with running_push_service() as found:
        yield found


@pytest.fixture(params=["sqlite", "dynamodb"])
async def api(request: pytest.FixtureRequest, tmp_path: Path, service: PushService) -> AsyncIterator[Api]:
    async with running_api(
        request.param, "local", tmp_path, request, push_allowed_origins=(service.origin,)
    ) as app:
        await app.sign_in("ana")
        service.server_key = (await app.ok("{ webPushPublicKey }", as_="ana"))["webPushPublicKey"]
        yield app


async def pushed(api: Api) -> None:
    """Until every note in the push outbox that may go now has been handled."""
    pusher = api.services.pusher
    await pusher.recover()
    await pusher.queue.join()


async def register(api: Api, service: PushService, person: str, name: str) -> str:
    browser = service.browsers.get(name) or service.browser(name)
    return str((await api.ok(REGISTER, {"i": browser.input()}, as_=person))["registerPushDevice"]["id"])


async def note_ids(api: Api, person: str) -> dict[str, str]:
    edges = (await api.ok(NOTES, as_=person))["notifications"]["edges"]
    return {e["node"]["id"]: e["node"]["type"] for e in edges}


# Devices -------------------------------------------------------------------------------


async def test_devices_are_registered_updated_listed_and_removed_by_their_owner_alone(
    api: Api, service: PushService
) -> None:
    await api.sign_in("ben")
    browser = service.browser("laptop")
    first = (await api.ok(REGISTER, {"i": browser.input("Laptop")}, as_="ana"))["registerPushDevice"]
    assert first["platform"] == "WEB" and first["name"] == "Laptop" and first["lastPushedAt"] is None
    # The same endpoint again: the same device, updated.
    again = (await api.ok(REGISTER, {"i": browser.input("Portátil")}, as_="ana"))["registerPushDevice"]
    assert again["id"] == first["id"] and again["createdAt"] == first["createdAt"]
    assert (await api.ok(DEVICES, as_="ana"))["myPushDevices"] == [
        {"id": first["id"], "platform": "WEB", "name": "Portátil"}
    ]
    # Someone else's device is never touched, nor listed.
    assert (await api.ok(DEVICES, as_="ben"))["myPushDevices"] == []
    before = await api.snapshot()
    assert (await api.ok(UNREGISTER, {"id": first["id"]}, as_="ben"))["unregisterPushDevice"] is False
    assert (await api.ok(UNREGISTER, {"id": "nope#x"}, as_="ben"))["unregisterPushDevice"] is False
    assert await api.snapshot() == before
    assert (await api.ok(UNREGISTER, {"id": first["id"]}, as_="ana"))["unregisterPushDevice"] is True
    assert (await api.ok(DEVICES, as_="ana"))["myPushDevices"] == []
    assert (await api.ok(UNREGISTER, {"id": first["id"]}, as_="ana"))["unregisterPushDevice"] is False


async def test_the_21st_device_takes_the_place_of_the_oldest(api: Api, service: PushService) -> None:
    ids = []
    for n in range(20):
        ids.append(await register(api, service, "ana", f"b{n}"))
        api.clock.advance(seconds=1)
    assert len((await api.ok(DEVICES, as_="ana"))["myPushDevices"]) == 20
    newest = await register(api, service, "ana", "b20")
    listed = [d["id"] for d in (await api.ok(DEVICES, as_="ana"))["myPushDevices"]]
    assert len(listed) == 20 and ids[0] not in listed and newest in listed
    # Refreshing a device makes it young again: the next to go is b2, not b1.
    api.clock.advance(seconds=1)
    await register(api, service, "ana", "b1")
    await register(api, service, "ana", "b21")
    listed = [d["id"] for d in (await api.ok(DEVICES, as_="ana"))["myPushDevices"]]
    assert len(listed) == 20 and ids[1] in listed and ids[2] not in listed


P256_NOT_ON_CURVE = "BA" + "A" * 85  # 65 bytes, 0x04 first, (0, 0) is not on the curve


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"endpoint": "http://push.example.org/x"}, "endpoint"),
        ({"endpoint": "https://127.0.0.1/x"}, "endpoint"),
        ({"endpoint": "https://localhost/x"}, "endpoint"),
        ({"endpoint": "https://10.1.2.3/x"}, "endpoint"),
        ({"endpoint": "https://192.168.0.10:8443/x"}, "endpoint"),
        ({"endpoint": "https://169.254.169.254/latest/meta-data"}, "endpoint"),
        ({"endpoint": "https://[::1]/x"}, "endpoint"),
        ({"endpoint": "https://[::ffff:10.0.0.1]/x"}, "endpoint"),
        ({"endpoint": "https://[fd00:ec2::254]/x"}, "endpoint"),
        # IPv6 forms that deliver to an embedded IPv4 address that is not public.
        ({"endpoint": "https://[64:ff9b::7f00:1]/x"}, "endpoint"),
        ({"endpoint": "https://[64:ff9b::a9fe:a9fe]/x"}, "endpoint"),
        ({"endpoint": "https://[64:ff9b:1::7f00:1]/x"}, "endpoint"),
        ({"endpoint": "https://[64:ff9b:1:2::808:808]/x"}, "endpoint"),
        ({"endpoint": "https://[2002:7f00:1::]/x"}, "endpoint"),
        ({"endpoint": "https://[2002:a00:1::1]/x"}, "endpoint"),
        ({"endpoint": "https://[::7f00:1]/x"}, "endpoint"),
        ({"endpoint": "https://[::10.0.0.1]/x"}, "endpoint"),
        ({"endpoint": "https://[::ffff:127.0.0.1]/x"}, "endpoint"),
        ({"endpoint": "https://100.100.100.200/x"}, "endpoint"),
        ({"endpoint": "https://user:pw@93.184.216.34/x"}, "endpoint"),
        ({"endpoint": "https://no-such-host.invalid/x"}, "endpoint"),
        ({"endpoint": None}, "endpoint"),
        ({"p256dh": "not base64!"}, "p256dh"),
        ({"p256dh": "AAAA"}, "p256dh"),
        ({"p256dh": P256_NOT_ON_CURVE}, "p256dh"),
        ({"auth": "AAAAAAAAAAAAAAAAAAAA"}, "auth"),  # 15 bytes
        ({"auth": None}, "auth"),
        ({"token": "abc"}, "token"),
        (
            {"platform": "APNS", "endpoint": None, "p256dh": None, "auth": None, "token": "ab" * 32},
            "platform",
        ),
        ({"platform": "FCM", "endpoint": None, "p256dh": None, "auth": None, "token": "x:y"}, "platform"),
    ],
)
async def test_refusals_name_the_field_and_change_nothing(
    api: Api, service: PushService, changes: dict[str, Any], field: str
) -> None:
    given = {**service.browser("b").input(), **changes}
    before = await api.snapshot()
    body = await api.post(REGISTER, {"i": given}, as_="ana")
    error = body["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert error["extensions"].get("field") == field and error["message"].startswith(field), error
    assert await api.snapshot() == before


async def test_an_endpoint_out_of_reach_says_how_to_push_locally_while_developing(
    api: Api, service: PushService
) -> None:
    # The server signs its own tokens (no JWKS): a development one.
    for endpoint in ("https://no-such-host.invalid/x", "http://localhost:8090/push/b"):
        given = {**service.browser("b").input(), "endpoint": endpoint}
        error = (await api.post(REGISTER, {"i": given}, as_="ana"))["errors"][0]
        assert "MIFAMILIAS_PUSH_ALLOWED_ORIGINS" in error["message"], error


@pytest.mark.parametrize(
    "host",
    ["93.184.216.34", "[2606:2800:220:1:248:1893:25c8:1946]", "[64:ff9b::5db8:d822]", "[2002:5db8:d822::1]"],
    ids=["ipv4", "ipv6", "nat64-of-public", "6to4-of-public"],
)
async def test_a_public_address_is_accepted(api: Api, service: PushService, host: str) -> None:
    given = {**service.browser("b").input(), "endpoint": f"https://{host}/push/abc"}
    assert (await api.ok(REGISTER, {"i": given}, as_="ana"))["registerPushDevice"]["platform"] == "WEB"


# Web Push --------------------------------------------------------------------------------


async def test_a_push_names_its_notification_and_is_encrypted_for_its_browser(
    api: Api, service: PushService
) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await register(api, service, "ben", "phone")
    await register(api, service, "ben", "laptop")
    await upload(
        api, "ana", family_id, "TEXT", b"un secreto de familia", "text/plain", title="Título privado"
    )
    await settle(api)
    await pushed(api)
    assert service.problems == []
    notes = await note_ids(api, "ben")
    for browser in ("phone", "laptop"):
        [got] = service.to(browser)
        assert set(got.payload) == {"id", "type", "familyId", "title", "body"}
        assert got.payload["type"] == "NEW_CONTENT" and got.payload["familyId"] == family_id
        assert notes[got.payload["id"]] == "NEW_CONTENT"  # the public id, as listed
        assert "secreto" not in str(got.payload) and "Título" not in str(got.payload)
        assert got.headers["urgency"] == "normal" and got.claims["aud"] == service.origin
    # Pushed once: another pass sends nothing more.
    await pushed(api)
    assert len(service.to("phone")) == 1
    assert all(d["id"] for d in (await api.ok(DEVICES, as_="ben"))["myPushDevices"])
    [device] = [
        d
        for d in (await api.ok("{ myPushDevices { name lastPushedAt } }", as_="ben"))["myPushDevices"]
        if d["name"] == "phone"
    ]
    assert device["lastPushedAt"] is not None


async def test_a_410_marks_the_device_gone_and_a_429_is_retried_after_its_retry_after(
    api: Api, service: PushService
) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await register(api, service, "ben", "gone")
    await register(api, service, "ben", "busy")
    service.answer("gone", 410)
    service.answer("busy", 429, {"Retry-After": "120"})
    await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    await pushed(api)
    # Each device says what became of its last push, and why.
    seen = {d["name"]: d for d in (await api.ok(DELIVERIES, as_="ben"))["myPushDevices"]}
    assert seen["gone"]["gone"] is True and seen["gone"]["lastDelivery"]["status"] == 410
    assert "registered again" in seen["gone"]["lastDelivery"]["error"]
    assert seen["busy"]["gone"] is False and seen["busy"]["lastDelivery"]["status"] == 429
    assert "429" in seen["busy"]["lastDelivery"]["error"]
    assert service.to("busy") == []
    api.clock.advance(seconds=100)
    await pushed(api)
    assert service.to("busy") == []  # not before its Retry-After
    api.clock.advance(seconds=30)
    await pushed(api)
    assert len(service.to("busy")) == 1 and service.to("gone") == []
    await pushed(api)
    assert len(service.to("busy")) == 1
    seen = {d["name"]: d for d in (await api.ok(DELIVERIES, as_="ben"))["myPushDevices"]}
    assert seen["busy"]["lastDelivery"]["status"] == 201 and seen["busy"]["lastDelivery"]["error"] is None
    # Nothing more goes to the gone one until its browser subscribes again.
    await upload(api, "ana", family_id, "TEXT", b"otra", "text/plain")
    await settle(api)
    await pushed(api)
    assert service.to("gone") == [] and len(service.to("busy")) == 2
    service.answer("gone", 201)
    await register(api, service, "ben", "gone")
    seen = {d["name"]: d for d in (await api.ok(DELIVERIES, as_="ben"))["myPushDevices"]}
    assert seen["gone"]["gone"] is False


async def test_a_5xx_is_retried_with_backoff(api: Api, service: PushService) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await register(api, service, "ben", "flaky")
    service.answer("flaky", 503, times=2)
    await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    for _ in range(3):
        await pushed(api)
        api.clock.advance(seconds=10)
    assert len(service.to("flaky")) == 1


async def test_a_member_who_left_hears_nothing_more(api: Api, service: PushService) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    await register(api, service, "ben", "ben")
    await register(api, service, "cy", "cy")
    await api.services.pusher.stop()  # the note waits in the outbox
    await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    # ben leaves before the push goes: it is decided at send time.
    await api.ok("mutation($f: ID!) { leaveFamily(familyId: $f) }", {"f": family_id}, as_="ben")
    await api.services.pusher.start()
    await pushed(api)
    assert service.to("ben") == [] and len(service.to("cy")) == 1


async def test_a_capsule_is_pushed_once_open_and_says_nothing_of_what_it_holds(
    api: Api, service: PushService
) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await register(api, service, "ben", "ben")
    capsule_id = await make_capsule(api, "ana", family_id, ["ben"], hours=1)
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    await upload(
        api,
        "ana",
        family_id,
        "TEXT",
        b"te quiero mucho",
        "text/plain",
        title="Para Ben",
        capsule_id=capsule_id,
    )
    await settle(api)
    await pushed(api)
    assert service.to("ben") == []  # sealed: nothing at all before the opening
    api.clock.advance(hours=1, seconds=1)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    await pushed(api)
    [got] = service.to("ben")
    assert got.payload["type"] == "CAPSULE_UNLOCKED" and got.headers["urgency"] == "high"
    assert "quiero" not in str(got.payload) and "Para Ben" not in str(got.payload)


async def test_push_types_and_a_muted_family_are_honoured_at_send_time(
    api: Api, service: PushService
) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await register(api, service, "ben", "ben")
    await register(api, service, "ana", "ana")
    defaults = (await api.ok("{ me { pushTypes } }", as_="ben"))["me"]["pushTypes"]
    assert set(defaults) == {"CAPSULE_UNLOCKED", "NEW_COMMENT", "NEW_CONTENT", "MEMBER_PENDING"}
    assert (await api.ok(PUSH_TYPES, {"t": ["CAPSULE_UNLOCKED"]}, as_="ben"))["updateProfile"][
        "pushTypes"
    ] == ["CAPSULE_UNLOCKED"]
    later = (api.clock.moment.replace(year=api.clock.moment.year + 1)).isoformat()
    assert (await api.ok(MUTE, {"f": family_id, "u": later}, as_="ana"))["muteFamily"] is True
    post = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    await api.ok(COMMENT, {"id": post, "b": "qué bien"}, as_="ben")
    await pushed(api)
    assert service.to("ben") == [] and service.to("ana") == []
    # Unmuted, the next comment reaches ana.
    assert (await api.ok(MUTE, {"f": family_id, "u": None}, as_="ana"))["muteFamily"] is True
    await api.ok(COMMENT, {"id": post, "b": "otra vez"}, as_="ben")
    await pushed(api)
    assert [r.payload["type"] for r in service.to("ana")] == ["NEW_COMMENT"]
    code, _ = await api.error(MUTE, {"f": family_id, "u": None}, as_="dee")
    assert code == "NOT_FOUND"
    body = await api.post(PUSH_TYPES, {"t": ["NOPE"]}, as_="ben")
    assert body["errors"]


async def test_comments_on_one_content_within_a_minute_are_one_push(api: Api, service: PushService) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    await register(api, service, "ana", "ana")
    post = await upload(api, "ana", family_id, "TEXT", b"mi nota", "text/plain")
    await settle(api)
    for person in ("ben", "cy", "ben"):
        await api.ok(COMMENT, {"id": post, "b": f"de {person}"}, as_=person)
        api.clock.advance(seconds=10)
        await pushed(api)
    [got] = service.to("ana")
    assert got.payload["type"] == "NEW_COMMENT" and got.headers.get("topic")
    # Three notifications all the same, unread.
    assert list((await note_ids(api, "ana")).values()).count("NEW_COMMENT") == 3
    api.clock.advance(seconds=60)
    await api.ok(COMMENT, {"id": post, "b": "un minuto después"}, as_="cy")
    await pushed(api)
    assert len(service.to("ana")) == 2


async def test_an_endpoint_whose_host_now_resolves_privately_is_not_sent_to(
    api: Api, service: PushService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the host resolved publicly at registration and resolves to
    loopback at the send; the send is refused before any connection."""
    import asyncio
    import socket

    answers = {"push.rebind.example": "93.184.216.34"}
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]
        return await real(host, port, *args, **kwargs)

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    family_id = await family_with_members(api, "ana", ["ben"])
    browser = service.browser("rebound")
    given = {**browser.input(), "endpoint": "https://push.rebind.example/push/rebound"}
    await api.ok(REGISTER, {"i": given}, as_="ben")
    answers["push.rebind.example"] = "127.0.0.1"
    connections: list[Any] = []
    sender = api.services.web_push
    monkeypatch.setattr(sender, "pool", lambda origin: connections.append(origin))
    await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    await pushed(api)
    assert connections == []
    assert [d["name"] for d in (await api.ok(DEVICES, as_="ben"))["myPushDevices"]] == ["rebound"]


# An opening -----------------------------------------------------------------------------

RECIPIENTS = 30
OPENING_READS = 6


async def opened_for(api: Api, service: PushService, people: list[str]) -> None:
    """A capsule for `people`, each with one browser, opened with the push
    workers stopped: its notes wait in the push outbox."""
    now = api.clock()
    family_id = "famopening"
    shards = api.services.settings.unlock_shards
    # Due tomorrow on the test's clock, which then moves past it: today, the
    # app's own scheduler (started with it) could open it before this test does.
    _, capsule = capsule_rows(family_id, "ana", people, now + timedelta(days=1), shards)
    rows = family_rows(family_id, "ana", people) + capsule
    for person in people:
        browser = service.browser(person)
        device = items.PushDevice(
            user_id=person,
            id=device_id("WEB", browser.endpoint),
            platform="WEB",
            created_at=items.iso(now),
            updated_at=items.iso(now),
            endpoint=browser.endpoint,
            p256dh=browser.p256dh,
            auth=b64url(browser.auth),
        )
        rows += [device.to_item(), items.PushDeviceCount(person, 1).to_item()]
    await api.table.batch_write(rows)
    await api.services.pusher.stop()
    api.clock.advance(days=1, seconds=1)
    assert (await api.services.scheduler.run_once()).unlocked == 1


async def outbox(api: Api) -> list[Key]:
    found = await all_items(api.table, keys.PUSH_OUTBOX_PK, index="GSI1")
    return [(item["PK"], item["SK"]) for item in found]


async def test_an_opening_reads_once_a_push_and_writes_at_most_twice(api: Api, service: PushService) -> None:
    """Its family and capsule are read once for all its notes, its people and
    memberships in one batch read, its claims and writes committed together:
    what is left per push is the query of the person's devices."""
    people = [f"r{n}" for n in range(RECIPIENTS)]
    await opened_for(api, service, people)
    counting = api.table
    assert isinstance(counting, CountingTable)
    await api.services.pusher.start()
    counting.reset()
    await pushed(api)
    assert service.problems == []
    assert [len(service.to(person)) for person in people] == [1] * RECIPIENTS
    assert await outbox(api) == []
    calls = counting.calls
    # Reads: the query of each person's devices, and a few for the opening
    # (its people and memberships in batches, its family and capsule, the
    # outbox listed), never one per note.
    reads = calls["query"] + calls["batch_get"] + calls["get"]
    assert reads <= RECIPIENTS + OPENING_READS, dict(calls)
    # Writes: the batched claims, then each push's settling write and its
    # device's stamp, committed together with whatever arrives with them. How
    # many arrive together depends on when each send returns (about 0.3 calls
    # a push on a quiet machine, bench section 10), so what is certain is the
    # bound: two a push, however the sends fall.
    writes = calls["transact"] + calls["update"] + calls["put"] + calls["batch_write"]
    assert writes <= 2 * RECIPIENTS, dict(calls)


async def test_a_batch_claimed_by_a_process_that_died_is_pushed_once_after_its_lease(
    api: Api, service: PushService
) -> None:
    """A process claims an opening's notes in one batched claim and dies before
    any send: nothing goes while its leases live, then every device gets its
    push once, from the process that takes them over."""
    people = [f"r{n}" for n in range(5)]
    await opened_for(api, service, people)
    waiting = await outbox(api)
    assert len(waiting) == len(people)
    doomed = Lease("doomed", timedelta(seconds=60))
    taken = await doomed.claim_many(api.table, waiting, api.clock(), when=pushing.SPEC.claimable)
    assert sorted(taken) == sorted(waiting)
    # Claimed again at once, by anyone: nothing is taken twice.
    assert await Lease("other", timedelta(seconds=60)).claim_many(api.table, waiting, api.clock()) == {}
    await api.services.pusher.start()
    await pushed(api)
    assert all(service.to(person) == [] for person in people)
    api.clock.advance(seconds=61)
    await pushed(api)
    assert all(len(service.to(person)) == 1 for person in people)
    assert await outbox(api) == []
    await pushed(api)
    assert all(len(service.to(person)) == 1 for person in people)
    assert service.problems == []


# Fairness ------------------------------------------------------------------------------


async def test_another_persons_slow_devices_do_not_delay_a_push(api: Api, service: PushService) -> None:
    """Ben's 20 devices answer only when the test lets them; 30 notes for him
    are queued before Cy's one. Cy's push goes out while all of Ben's wait: a
    person's notes hold one push worker at a time, and the others take turns."""
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    slow = [f"ben-{n}" for n in range(20)]
    for name in slow:
        await register(api, service, "ben", name)
    await register(api, service, "cy", "cy-phone")
    await pushed(api)  # whatever the joins left
    stalls = [service.stall(name) for name in slow]
    pusher = api.services.pusher
    try:
        pending = NotificationType.MEMBER_PENDING  # pushed by default
        bens = [(await note_for(api, "ben", family_id, pending)).key for _ in range(30)]
        cys = (await note_for(api, "cy", family_id, pending)).key
        for key in [*bens, cys]:
            pusher.submit(key)
        await until(lambda: service.to("cy-phone"), "Cy's push", seconds=60, interval=0.05)
        # Meanwhile every one of Ben's devices still holds his first push.
        assert not any(stall.is_set() for stall in stalls)
        assert all(service.to(name) == [] for name in slow)
    finally:
        for stall in stalls:
            stall.set()
    await pushed(api)
    assert all(service.to(name) for name in slow)
    assert service.problems == []
