"""The authorization matrix, generated from the schema.

Every query, mutation and subscription the schema has is run as every role of
`access_matrix.txt`, against objects of the viewer's family and of another, on
both storage engines. Each operation selects every field of what it returns,
nested a few levels deep, so a leak through `Capsule.recipients`,
`Content.comments`, `Notification.*` or a media URL shows up in the answer.
Two things are checked per cell:

- the outcome written in `access_matrix.txt` (an operation the schema has and
  the file does not fails the test, so a new operation needs a row);
- no marker of something the role may not read appears anywhere in the answer:
  titles, comment bodies, tag values, names and ids are all markers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from graphql import (
    GraphQLEnumType,
    GraphQLField,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
    GraphQLType,
)

from resolvers.adapters.broker import user_channel
from resolvers.core.context import Context
from schema import schema
from schema.strawberry_internals import core_schema
from store import items, keys
from store.port import Update
from tests.api.conftest import Api
from tests.factories import capsule_rows, family_rows, join, make_family, settle, upload
from tests.servers import until
from tests.typical_calls import web_subscription

MATRIX = Path(__file__).with_name("access_matrix.txt")
ROLES = ["none", "out", "pen", "left", "rem", "rleft", "crm", "oadm", "rcp", "mem", "adm"]
USERS = {role: role for role in ROLES if role != "none"}
CODES = {
    "UNA": "UNAUTHENTICATED",
    "NF": "NOT_FOUND",
    "FB": "FORBIDDEN",
    "CF": "CONFLICT",
    "BAD": "BAD_USER_INPUT",
}
READERS_A = {"rcp", "mem", "adm"}
MEMBERS_A = READERS_A | {"pen"}
MAX_SELECTION_DEPTH = 4


@dataclass(frozen=True)
class Row:
    operation: str
    target: str
    outcomes: dict[str, str]
    line: int


def read_matrix() -> list[Row]:
    rows = []
    for number, raw in enumerate(MATRIX.read_text().splitlines(), start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        operation, target, *cells = text.split()
        assert len(cells) == len(ROLES), f"line {number}: {len(cells)} cells for {len(ROLES)} roles"
        rows.append(Row(operation, target, dict(zip(ROLES, cells, strict=True)), number))
    return rows


# Documents generated from the schema -----------------------------------------------


NESTED_PAGE = 5


def _named(type_: GraphQLType) -> GraphQLType:
    while isinstance(type_, GraphQLNonNull | GraphQLList):
        type_ = type_.of_type
    return type_


def selection(type_: GraphQLType, depth: int, path: frozenset[str] = frozenset()) -> str:
    """Every field of the type, objects expanded `depth` levels, a type never
    inside itself on one path (so the document stays finite)."""
    named = _named(type_)
    if isinstance(named, GraphQLScalarType | GraphQLEnumType):
        return ""
    assert isinstance(named, GraphQLObjectType), named
    parts = []
    for name, definition in named.fields.items():
        if any(isinstance(arg.type, GraphQLNonNull) for arg in definition.args.values()):
            continue  # nested fields with required arguments: none in the schema today
        inner = _named(definition.type)
        if isinstance(inner, GraphQLScalarType | GraphQLEnumType):
            parts.append(name)
        elif depth > 0 and isinstance(inner, GraphQLObjectType) and inner.name not in path:
            sub = selection(inner, depth - 1, path | {named.name})
            # Short pages keep every document under the cost limit: the world
            # holds a few of each, and the rule is per object, not per page.
            paged = f"{name}(first: {NESTED_PAGE})" if "first" in definition.args else name
            if sub:
                parts.append(f"{paged} {sub}")
    return "{ " + " ".join(parts) + " }" if parts else ""


def _type_literal(type_: GraphQLType) -> str:
    return str(type_)


def document(kind: str, name: str, definition: GraphQLField) -> tuple[str, list[str]]:
    """The operation with a variable for each argument, selecting everything."""
    args = list(definition.args.items())
    variables = ", ".join(f"${arg}: {_type_literal(spec.type)}" for arg, spec in args)
    call = ", ".join(f"{arg}: ${arg}" for arg, _ in args)
    head = f"{kind} Cell({variables})" if args else kind
    field_call = f"{name}({call})" if args else name
    body = selection(definition.type, MAX_SELECTION_DEPTH)
    if name == "joinFamily":
        body = "{ role }"  # the joiner may read the family afterwards; that is not a leak
    return f"{head} {{ {field_call} {body} }}", [arg for arg, _ in args]


def schema_operations() -> dict[str, tuple[str, GraphQLField]]:
    graphql_schema = core_schema(schema)
    found: dict[str, tuple[str, GraphQLField]] = {}
    for kind, root in (
        ("query", graphql_schema.query_type),
        ("mutation", graphql_schema.mutation_type),
        ("subscription", graphql_schema.subscription_type),
    ):
        assert root is not None
        for name, definition in root.fields.items():
            found[name] = (kind, definition)
    return found


# The world --------------------------------------------------------------------------


@dataclass
class World:
    ids: dict[str, str] = field(default_factory=dict)
    # marker text -> the roles that may read it
    markers: dict[str, set[str]] = field(default_factory=dict)
    sentinels: dict[str, str] = field(default_factory=dict)  # role -> its own capsule id

    def secret(self, text: str, readers: set[str]) -> str:
        self.markers[text] = set(readers)
        return text


async def gql(api: Api, query: str, variables: dict[str, Any] | None, role: str) -> dict[str, Any]:
    return await api.post(query, variables, as_=None if role == "none" else USERS[role])


async def build_world(api: Api) -> World:
    world = World()
    await api.sign_in(*USERS.values(), "pen2", "spare", "bm")
    for user in [*USERS.values(), "pen2", "spare", "bm"]:
        readers = {"oadm"} if user in ("oadm", "bm") else set(READERS_A)
        if user == "adm":
            readers |= {"pen"}  # a PENDING member sees who the admin is
        name = world.secret(f"GN{user}X", readers | {user})
        await api.ok(
            "mutation($n: String!) { updateProfile(input: {givenName: $n}) { id } }", {"n": name}, as_=user
        )

    # Family A: VOUCHED with a high threshold, so joiners wait for the admin.
    fam_a = await make_family(api, "adm", world.secret("FamAX", MEMBERS_A), "VOUCHED", 5)
    world.ids["A"] = fam_a["id"]
    world.markers[fam_a["id"]] = set(MEMBERS_A)
    approve = "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }"
    for user in ("mem", "rcp", "left", "rem", "rleft", "crm", "spare", "pen", "pen2"):
        await join(api, user, fam_a["inviteCode"])
        if user not in ("pen", "pen2"):
            await api.ok(approve, {"f": fam_a["id"], "u": user}, as_="adm")

    note = await upload(
        api, "adm", fam_a["id"], "TEXT", b"hola", "text/plain", title=world.secret("NoteAX", READERS_A)
    )
    note2 = await upload(
        api, "mem", fam_a["id"], "TEXT", b"adios", "text/plain", title=world.secret("Note2AX", READERS_A)
    )
    await settle(api)
    world.ids |= {"A.note": note, "A.note2": note2}
    comment = await api.ok(
        "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }",
        {"c": note, "b": world.secret("CommentAX", READERS_A)},
        as_="mem",
    )
    world.ids["A.comment"] = comment["addComment"]["id"]
    await api.ok(
        'mutation($c: ID!) { addReaction(contentId: $c, emoji: "👍") { id } }', {"c": note}, as_="mem"
    )
    set_tags = """mutation($c: ID!, $v: [String!]!, $s: String, $p: Boolean) {
      setTags(contentId: $c, values: $v, setName: $s, private: $p) { value } }"""
    await api.ok(set_tags, {"c": note, "v": [world.secret("tagax", READERS_A)], "s": "SetA"}, as_="mem")
    await api.ok(
        set_tags, {"c": note, "v": [world.secret("privtagax", {"rcp"})], "s": "SetA", "p": True}, as_="rcp"
    )

    now = api.clock.moment
    create = """mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }"""
    schedule = "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }"

    async def capsule(
        creator: str,
        family: str,
        title: str,
        recipients: list[str],
        due: timedelta,
        *,
        scheduled: bool = True,
    ) -> str:
        made = await api.ok(
            create,
            {
                "i": {
                    "familyId": family,
                    "title": title,
                    "unlockDate": (now + due).isoformat(),
                    "recipientIds": recipients,
                }
            },
            as_=creator,
        )
        capsule_id = str(made["createCapsule"]["id"])
        if scheduled:
            await api.ok(schedule, {"id": capsule_id}, as_=creator)
        return capsule_id

    pending = await capsule(
        "adm", fam_a["id"], world.secret("CapPendAX", {"adm", "rcp"}), ["rcp"], timedelta(days=3)
    )
    sealed = await upload(
        api, "adm", fam_a["id"], "TEXT", b"secreto", "text/plain", world.secret("SealedAX", {"adm"}), pending
    )
    # A draft names its recipient, who may not know of it until it is scheduled...
    draft = await capsule(
        "adm", fam_a["id"], world.secret("CapDraftAX", {"adm"}), ["rcp"], timedelta(days=4), scheduled=False
    )
    # So does a cancelled one.
    cancelled = await capsule(
        "adm", fam_a["id"], world.secret("CapCancelAX", {"adm"}), ["rcp"], timedelta(days=5)
    )
    await api.ok("mutation($id: ID!) { cancelCapsule(capsuleId: $id) { id } }", {"id": cancelled}, as_="adm")
    opened = await capsule(
        "crm", fam_a["id"], world.secret("CapOpenAX", {"mem"}), ["rleft", "mem"], timedelta(hours=1)
    )
    opened_content = await upload(
        api, "crm", fam_a["id"], "TEXT", b"abierto", "text/plain", world.secret("OpenedAX", READERS_A), opened
    )
    await settle(api)
    await api.ok(
        set_tags, {"c": sealed, "v": [world.secret("sealedtagx", {"adm"})], "s": "SetSealed"}, as_="adm"
    )
    world.ids |= {
        "A.cap_pending": pending,
        "A.cap_draft": draft,
        "A.cap_cancelled": cancelled,
        "A.sealed": sealed,
        "A.cap_opened": opened,
        "A.opened": opened_content,
    }
    world.markers[pending] = {"adm", "rcp"}
    world.markers[draft] = {"adm"}
    world.markers[cancelled] = {"adm"}
    world.markers[opened] = {"mem"}
    world.markers[sealed] = {"adm"}
    # What a transcription leaves on content (its text, language, captions), so that the
    # fields that show it are checked against the rule like the rest.
    for content_id, said, readers in ((note, "SpokenAX", READERS_A), (sealed, "SpokenSealedAX", {"adm"})):
        await api.table.update(
            Update(
                keys.content(content_id),
                set={
                    "transcription": world.secret(said, readers),
                    "transcriptLanguage": "es",
                    "captionsKey": f"content/{content_id}/captions.vtt",
                },
            )
        )

    # Family B: another family, with its own content, comment and capsule.
    fam_b = await make_family(api, "oadm", world.secret("FamBX", {"oadm"}), "OPEN", 1)
    world.ids["B"] = fam_b["id"]
    world.markers[fam_b["id"]] = {"oadm"}
    await join(api, "bm", fam_b["inviteCode"])
    note_b = await upload(
        api, "oadm", fam_b["id"], "TEXT", b"otra", "text/plain", world.secret("NoteBX", {"oadm"})
    )
    await settle(api)
    comment_b = await api.ok(
        "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }",
        {"c": note_b, "b": world.secret("CommentBX", {"oadm"})},
        as_="bm",
    )
    cap_b = await capsule("oadm", fam_b["id"], world.secret("CapBX", {"oadm"}), ["bm"], timedelta(hours=1))
    await upload(
        api,
        "oadm",
        fam_b["id"],
        "TEXT",
        b"para bm",
        "text/plain",
        world.secret("CapBContentX", {"oadm"}),
        cap_b,
    )
    await settle(api)
    world.ids |= {"B.note": note_b, "B.comment": comment_b["addComment"]["id"], "B.cap": cap_b}
    world.markers[note_b] = {"oadm"}
    world.markers[cap_b] = {"oadm"}
    world.ids |= {
        "A.adm": "adm",
        "A.mem": "mem",
        "A.crm": "crm",
        "B.oadm": "oadm",
        "A.pen2": "pen2",
        "A.spare": "spare",
        "B.bm": "bm",
    }

    # An invite in each family: its code and id are its ADMINs' alone.
    make_invite = "mutation($f: ID!) { createInvite(input: {familyId: $f, maxUses: 5}) { id code } }"
    for family, admin in (("A", "adm"), ("B", "oadm")):
        made = (await api.ok(make_invite, {"f": world.ids[family]}, as_=admin))["createInvite"]
        world.ids[f"{family}.invite"] = made["id"]
        world.markers[made["id"]] = {admin}
        world.markers[made["code"]] = {admin}

    # People leave; then the opened capsule's date comes.
    leave = "mutation($f: ID!) { leaveFamily(familyId: $f) }"
    remove = "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }"
    await api.ok(leave, {"f": fam_a["id"]}, as_="left")
    await api.ok(leave, {"f": fam_a["id"]}, as_="rleft")
    await api.ok(remove, {"f": fam_a["id"], "u": "rem"}, as_="adm")
    await api.ok(remove, {"f": fam_a["id"], "u": "crm"}, as_="adm")
    api.clock.advance(hours=2)
    result = await api.services.scheduler.run_once()
    assert result.unlocked == 2, result
    await api.ok(
        "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }",
        {"c": opened_content, "b": world.secret("LateCommentAX", READERS_A)},
        as_="mem",
    )
    for key in ("A.note", "A.note2", "A.opened", "A.comment"):
        world.markers[world.ids[key]] = set(READERS_A)

    # mem's data export: its owner's alone.
    export = await api.ok("mutation { requestDataExport { id } }", as_="mem")
    world.ids["export"] = export["requestDataExport"]["id"]
    world.markers[world.ids["export"]] = {"mem"}
    # mem's push device: listed to mem alone, and removed by mem alone.
    device = await api.ok(
        "mutation($i: RegisterPushDeviceInput!) { registerPushDevice(input: $i) { id } }",
        {"i": web_subscription("mem-phone")},
        as_="mem",
    )
    world.ids["device"] = device["registerPushDevice"]["id"]
    world.markers[world.ids["device"]] = {"mem"}

    # Each signed-in role also creates a capsule in a family of its own, whose
    # event is the sentinel that shows another event was not delivered.
    for role, user in USERS.items():
        family_id = f"sentinel{uuid.uuid4().hex[:8]}"
        rows = [r for r in family_rows(family_id, user, []) if r["type"] != "User"]
        capsule_id, more = capsule_rows(family_id, user, [user], datetime.now(UTC), 8)
        for row in rows + more:
            await api.table.put(row)
        world.sentinels[role] = capsule_id
    return world


# Running one cell --------------------------------------------------------------------


def variables_for(
    api: Api, world: World, operation: str, target: str, invite_codes: dict[str, str]
) -> dict[str, Any]:
    ids = world.ids
    later = (api.clock.moment + timedelta(days=2)).isoformat()
    family = ids.get(target.split(".")[0]) if target != "-" else None
    by_operation: dict[str, dict[str, Any]] = {
        "user": {"id": ids.get(target)},
        "family": {"id": family},
        "content": {"id": ids.get(target)},
        "capsule": {"id": ids.get(target)},
        "searchTags": {"familyId": family, "prefix": "ta"},
        # Title words: "NoteAX", "SealedAX" (adm's alone), "NoteBX".
        "searchContent": {"familyId": family, "text": target.split(".")[-1], "first": NESTED_PAGE},
        "myTags": {"prefix": ""},
        "tagStatus": {"familyId": family, "setName": "SetSealed" if target == "A" else "SetA"},
        "contentStatusChanged": {"contentId": ids.get(target)},
        "dataExport": {"id": ids.get(target)},
        "updateProfile": {"input": {}},
        "createFamily": {"input": {"name": "Otra familia", "trustLevel": "OPEN", "vouchThreshold": 1}},
        "markNotificationsRead": {"ids": None},
        "registerPushDevice": {"input": web_subscription(target)},
        "unregisterPushDevice": {"id": ids.get(target)},
        "muteFamily": {"familyId": family, "until": later},
        "createUpload": {
            "input": {
                "familyId": family,
                "type": "TEXT",
                "mimeType": "text/plain",
                "sizeBytes": 4,
                "title": "nueva",
            }
        },
        "addComment": {"contentId": ids.get(target), "body": "un comentario"},
        "addReaction": {"contentId": ids.get(target), "emoji": "🎉"},
        "removeReaction": {"contentId": ids.get(target), "emoji": "🎉"},
        "setTags": {"contentId": ids.get(target), "values": ["matriz"], "setName": None, "private": False},
        "createCapsule": {
            "input": {
                "familyId": family,
                "title": "Nueva cápsula",
                "unlockDate": later,
                "recipientIds": ["mem"] if target == "A" else ["bm"],
            }
        },
        "rotateInviteCode": {"familyId": family},
        "setMemberRole": {"familyId": family, "userId": ids.get(target), "role": "MEMBER"},
        "createInvite": {"input": {"familyId": family}},
        "revokeInvite": {"id": ids.get(target)},
        "updateFamilySettings": {"input": {"familyId": family}},
        "vouch": {"familyId": family, "userId": ids.get(target)},
        "approveMember": {"familyId": family, "userId": ids.get(target)},
        "removeMember": {"familyId": family, "userId": ids.get(target)},
        "leaveFamily": {"familyId": family},
        "joinFamily": {"inviteCode": invite_codes.get(target)},
        "deleteComment": {
            "contentId": ids["A.note" if target == "A.comment" else "B.note"],
            "commentId": ids.get(target),
        },
    }
    if operation in by_operation:
        return by_operation[operation]
    if operation in (
        "completeUpload",
        "resumeUpload",
        "retryContent",
        "restoreContent",
        "markContentViewed",
        "deleteContent",
    ):
        return {"contentId": ids.get(target)}
    if operation in ("scheduleCapsule", "cancelCapsule", "openCapsule"):
        return {"capsuleId": ids.get(target)}
    return {}


def outcome_of(body: dict[str, Any], operation: str) -> str:
    data = body.get("data") or {}
    errors = body.get("errors") or []
    at_operation = [
        e for e in errors if (e.get("path") or [operation])[0] == operation and len(e.get("path") or [1]) <= 1
    ]
    if data.get(operation) is not None and not at_operation:
        return "ok"
    if not errors:
        return "ok"
    code = (at_operation or errors)[0].get("extensions", {}).get("code", "?")
    for short, full in CODES.items():
        if code == full:
            return short
    return code


@contextlib.asynccontextmanager
async def subscribed(api: Api, query: str, variables: dict[str, Any], role: str) -> AsyncIterator[Any]:
    """The stream of results, or the one result that refused it."""
    context = Context(services=api.services)
    await context.authenticate(None if role == "none" else f"Bearer {api.token(USERS[role])}")
    result = await schema.subscribe(query, variable_values=variables, context_value=context)
    if not hasattr(result, "__anext__"):
        yield result
        return
    try:
        yield result
    finally:
        await result.aclose()


async def wait_subscribed(api: Api, channel: str, step: Any) -> Any:
    """Starts the stream and returns its first-result task once the stream
    listens on `channel` (polled with a deadline, never slept on)."""
    broker = api.services.broker
    task = asyncio.ensure_future(step)
    await until(
        lambda: task.done() or broker.subscriber_count(channel), f"a subscriber on {channel}", interval=0
    )
    return task


async def run_subscription(
    api: Api, world: World, row: Row, role: str, query: str, variables: dict[str, Any]
) -> dict[str, Any]:
    async with subscribed(api, query, variables, role) as stream:
        if not hasattr(stream, "__anext__"):
            return _formatted_one(stream)
        viewer = USERS.get(role, "")
        if row.operation == "contentStatusChanged":
            result = await asyncio.wait_for(stream.__anext__(), 30)
            return _formatted_one(result)
        if row.operation == "capsuleUnlocked":
            channel = user_channel(viewer, "capsules")
            first = await wait_subscribed(api, channel, stream.__anext__())
            if first.done():  # refused before it listened
                return _formatted_one(first.result())
            broker = api.services.broker
            moment = datetime.now(UTC).isoformat()
            await broker.publish(
                channel, {"kind": "capsule", "capsuleId": world.ids[row.target], "unlockedAt": moment}
            )
            await broker.publish(
                channel, {"kind": "capsule", "capsuleId": world.sentinels[role], "unlockedAt": moment}
            )
            body = _formatted_one(await asyncio.wait_for(first, 30))
            capsule_id = ((body.get("data") or {}).get("capsuleUnlocked") or {}).get("capsule", {}).get("id")
            body["_delivered"] = capsule_id == world.ids[row.target]
            return body
        # notificationAdded: a notification of the viewer's own that points into the target family.
        channel = user_channel(viewer, "notifications")
        first = await wait_subscribed(api, channel, stream.__anext__())
        if first.done():
            return _formatted_one(first.result())
        family = row.target
        note = items.Notification(
            user_id=viewer,
            id=uuid.uuid4().hex[:24],
            type="NEW_CONTENT",
            created_at=items.iso(datetime.now(UTC)),
            family_id=world.ids[family],
            content_id=world.ids[f"{family}.note"],
            capsule_id=world.ids["A.cap_opened" if family == "A" else "B.cap"],
        )
        await api.table.put(note.to_item())
        await api.services.broker.publish(
            channel, {"kind": "notification", "userId": viewer, "createdAt": note.created_at, "id": note.id}
        )
        body = _formatted_one(await asyncio.wait_for(first, 30))
        body["_delivered"] = bool((body.get("data") or {}).get("notificationAdded"))
        return body


def _formatted_one(result: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"data": result.data}
    if result.errors:
        body["errors"] = [error.formatted for error in result.errors]
    return body


async def test_access_matrix(api: Api) -> None:
    rows = read_matrix()
    operations = schema_operations()
    missing = sorted(set(operations) - {row.operation for row in rows})
    unknown = sorted({row.operation for row in rows} - set(operations))
    assert not missing, f"operations without a row in {MATRIX.name}: {missing}"
    assert not unknown, f"rows for operations the schema does not have: {unknown}"

    world = await build_world(api)
    failures: list[str] = []
    cells = 0
    for row in rows:
        kind, definition = operations[row.operation]
        query, _ = document(kind, row.operation, definition)
        for role in ROLES:
            invite_codes = {}
            if row.operation == "joinFamily":
                for family, admin in (("A", "adm"), ("B", "oadm")):
                    found = await api.ok(
                        "query($id: ID!) { family(id: $id) { inviteCode } }",
                        {"id": world.ids[family]},
                        as_=admin,
                    )
                    invite_codes[family] = found["family"]["inviteCode"]
            variables = variables_for(api, world, row.operation, row.target, invite_codes)
            if kind == "subscription":
                body = await run_subscription(api, world, row, role, query, variables)
                outcome = outcome_of(body, row.operation)
                if outcome == "ok":
                    outcome = "ev" if body.get("_delivered", True) else "no"
            else:
                body = await gql(api, query, variables, role)
                outcome = outcome_of(body, row.operation)
            cells += 1
            expected = row.outcomes[role]
            where = f"line {row.line}: {row.operation} {row.target} as {role}"
            if outcome != expected:
                failures.append(f"{where}: expected {expected}, got {outcome}: {json.dumps(body)[:300]}")
            text = json.dumps(body, ensure_ascii=False)
            leaked = [m for m, readers in world.markers.items() if role not in readers and m in text]
            if leaked:
                failures.append(f"{where}: leaked {leaked}: {text[:300]}")
            assert "Traceback" not in text, where
    assert cells == len(rows) * len(ROLES)
    assert not failures, f"{len(failures)} of {cells} cells failed:\n" + "\n".join(failures)
