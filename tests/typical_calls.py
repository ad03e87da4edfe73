"""One typical call of every query and mutation, and the world they run in.

`bench/round_trips.py` (section 5) and `tests/api/test_round_trips.py` both run
these, so the numbers the bench reports are the numbers the test asserts. Each
`Op` is a document, a viewer and, when it needs one, a setup that prepares its
variables outside the count. The world is built through the public API; the
operations run in the order given, on one world (the last one deletes eve).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

FEED_QUERY = """query Feed($id: ID!) { family(id: $id) { feed(first: 20) { edges { node {
  id author { givenName } reactions { emoji count } viewerReactions commentCount tags { value }
  comments(first: 3) { edges { node { body author { givenName } } } } } } } } }"""
# The first screen a frontend writes: the viewer, their families with members
# and a feed of 20 (reactions, tags, authors, first comments), notifications.
HOME_QUERY = """query Home {
  me { id givenName familyName profileImageUrl }
  myFamilies { role family { id name viewerRole
    members(first: 10) { edges { node { role user { id givenName profileImageUrl } } } }
    feed(first: 20) { edges { cursor node {
      id type status title thumbnailUrl createdAt
      author { id givenName profileImageUrl }
      reactions { emoji count } viewerReactions commentCount tags { value }
      comments(first: 3) { edges { node { id body author { givenName } } } } } }
      pageInfo { hasNextPage endCursor } } } }
  notifications(first: 20) { edges { node { id type read createdAt family { id name } content { id title } } } }
}"""
CREATE_FAMILY = """mutation($input: CreateFamilyInput!) {
  createFamily(input: $input) { id inviteCode } }"""
JOIN = "mutation($code: String!) { joinFamily(inviteCode: $code) { role } }"
CREATE_UPLOAD = """mutation($input: CreateUploadInput!) {
  createUpload(input: $input) { uploadUrl content { id } } }"""
COMPLETE = "mutation($id: ID!) { completeUpload(contentId: $id) { id status } }"
REACT = "mutation($id: ID!, $e: String!) { addReaction(contentId: $id, emoji: $e) { id } }"
COMMENT = "mutation($id: ID!, $b: String!) { addComment(contentId: $id, body: $b) { id } }"
SET_TAGS = """mutation($id: ID!, $v: [String!]!, $s: String, $p: Boolean) {
  setTags(contentId: $id, values: $v, setName: $s, private: $p) { value } }"""
REGISTER_DEVICE = """mutation($i: RegisterPushDeviceInput!) {
  registerPushDevice(input: $i) { id platform name createdAt } }"""
# Push endpoints of the typical calls: an origin the tests and the bench admit,
# where nothing listens (a push there is refused at once, and retried later).
PUSH_ORIGIN = "http://127.0.0.1:9"
VIEWERS = ("ana", "ben", "cy", "dee", "eve", "gus", "pia", "quim")


class Client(Protocol):
    """What the bench's and the tests' in-process clients both offer."""

    @property
    def services(self) -> Any: ...

    @property
    def client(self) -> Any: ...

    async def post(
        self, query: str, variables: dict[str, Any] | None = None, *, as_: str
    ) -> dict[str, Any]: ...

    async def ok(self, query: str, variables: dict[str, Any] | None = None, *, as_: str) -> Any: ...


async def make_family(
    api: Client, admin: str, name: str, trust: str = "OPEN", threshold: int = 2
) -> dict[str, str]:
    variables = {"input": {"name": name, "trustLevel": trust, "vouchThreshold": threshold}}
    family: dict[str, str] = (await api.ok(CREATE_FAMILY, variables, as_=admin))["createFamily"]
    return family


async def upload_text(
    api: Client,
    user: str,
    family_id: str,
    body: bytes,
    *,
    title: str | None = None,
    kind: str = "TEXT",
    mime: str = "text/plain",
    capsule_id: str | None = None,
) -> str:
    variables = {
        "input": {
            "familyId": family_id,
            "type": kind,
            "mimeType": mime,
            "sizeBytes": len(body),
            "title": title,
            "capsuleId": capsule_id,
        }
    }
    started = (await api.ok(CREATE_UPLOAD, variables, as_=user))["createUpload"]
    url = str(started["uploadUrl"])
    response = await api.client.put(
        url[url.index("/", len("http://")) :], content=body, headers={"Content-Type": mime}
    )
    if response.status_code != 200:
        raise RuntimeError(f"upload PUT answered {response.status_code}")
    content_id = str(started["content"]["id"])
    await api.ok(COMPLETE, {"id": content_id}, as_=user)
    return content_id


async def settle(api: Client) -> None:
    await api.services.pipeline.queue.join()  # every queued content processed


@contextlib.asynccontextmanager
async def only_the_request(api: Client) -> AsyncIterator[None]:
    """The media pipeline and the push worker work beside the requests, on the
    same table: held while a call is counted, the count is the call's own
    (content a call hands to the pipeline is processed once it is released,
    and a note left to push is found by the next recovery scan)."""
    await settle(api)
    await api.services.pipeline.stop()
    pusher = api.services.pusher
    await pusher.stop()
    try:
        yield
    finally:
        await api.services.pipeline.start()
        await pusher.start()


Setup = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class Op:
    field: str
    document: str
    viewer: str
    setup: Setup | None = None  # variables, prepared outside the count
    label: str = ""


def operations(api: Client, world: dict[str, Any]) -> list[Op]:
    clock = world["clock"]
    f, v = world["family"], world["vouched"]

    async def fresh_capsule(schedule: bool = False) -> str:
        unlock = (clock.moment + timedelta(days=1)).isoformat()
        data = await api.ok(
            "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
            {"i": {"familyId": f, "title": "Para ti", "unlockDate": unlock, "recipientIds": ["ben"]}},
            as_="ana",
        )
        capsule_id = str(data["createCapsule"]["id"])
        if schedule:
            await api.ok(
                "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { id } }", {"id": capsule_id}, as_="ana"
            )
        return capsule_id

    async def upload_started() -> dict[str, Any]:
        return {"i": {"familyId": f, "type": "TEXT", "mimeType": "text/plain", "sizeBytes": 4}}

    async def upload_sent() -> dict[str, Any]:
        created = await api.ok(
            "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
            await upload_started(),
            as_="ben",
        )
        url = created["createUpload"]["uploadUrl"]
        await api.client.put(
            url[url.index("/", 7) :], content=b"hola", headers={"Content-Type": "text/plain"}
        )
        return {"id": created["createUpload"]["content"]["id"]}

    async def failed_content() -> dict[str, Any]:
        content_id = await upload_text(api, "ben", f, b"not a photo", kind="PHOTO", mime="image/jpeg")
        await settle(api)
        return {"id": content_id}

    async def archived_content() -> dict[str, Any]:
        content_id = await upload_text(api, "ben", f, b"old memory")
        await settle(api)
        clock.advance(days=91)
        await api.services.pipeline.archive_due(90)
        return {"id": content_id}

    async def own_content() -> dict[str, Any]:
        content_id = await upload_text(api, "ben", f, b"to delete")
        await settle(api)
        return {"id": content_id}

    async def comment() -> dict[str, Any]:
        data = await api.ok(COMMENT, {"id": world["post"], "b": "para borrar"}, as_="ben")
        return {"id": world["post"], "c": data["addComment"]["id"]}

    async def reacted() -> dict[str, Any]:
        await api.ok(REACT, {"id": world["post"], "e": "🎉"}, as_="ben")
        return {"id": world["post"]}

    async def opened() -> dict[str, Any]:
        capsule_id = await fresh_capsule(schedule=True)
        await upload_text(api, "ana", f, b"te quiero", capsule_id=capsule_id)
        await settle(api)
        clock.advance(days=1, seconds=1)
        await api.services.scheduler.run_once()
        return {"id": capsule_id}

    async def draft() -> dict[str, Any]:
        return {"id": await fresh_capsule()}

    async def scheduled() -> dict[str, Any]:
        return {"id": await fresh_capsule(schedule=True)}

    async def new_capsule() -> dict[str, Any]:
        unlock = (clock.moment + timedelta(days=1)).isoformat()
        return {"i": {"familyId": f, "title": "Para ti", "unlockDate": unlock, "recipientIds": ["ben", "cy"]}}

    async def invite() -> dict[str, Any]:
        data = await api.ok("query($f: ID!) { family(id: $f) { inviteCode } }", {"f": f}, as_="ana")
        return {"code": data["family"]["inviteCode"]}

    async def uploading() -> dict[str, Any]:
        data = await api.ok(
            "mutation($i: CreateUploadInput!) { createUpload(input: $i) { content { id } } }",
            {"i": {"familyId": f, "type": "TEXT", "mimeType": "text/plain", "sizeBytes": 5}},
            as_="ben",
        )
        return {"id": data["createUpload"]["content"]["id"]}

    async def requested_export() -> dict[str, Any]:
        data = await api.ok("mutation { requestDataExport { id } }", as_="cy")
        return {"id": data["requestDataExport"]["id"]}

    async def device() -> dict[str, Any]:
        data = await api.ok(REGISTER_DEVICE, {"i": web_subscription("ben-laptop")}, as_="ben")
        return {"id": data["registerPushDevice"]["id"]}

    async def invite_made() -> dict[str, Any]:
        data = await api.ok(
            "mutation($f: ID!) { createInvite(input: {familyId: $f}) { id } }", {"f": f}, as_="ana"
        )
        return {"id": data["createInvite"]["id"]}

    async def admins_posting() -> dict[str, Any]:
        await api.ok(
            "mutation($f: ID!) { updateFamilySettings(input: {familyId: $f, postingPolicy: ADMINS}) { id } }",
            {"f": v},
            as_="ana",
        )
        return {"f": v}

    def fixed(**variables: Any) -> Setup:
        async def given() -> dict[str, Any]:
            return variables

        return given

    capsule_q = "query($id: ID!) { capsule(id: $id) { id status title creator { givenName } recipients { user { givenName } } content { id } } }"
    content_fields = (
        "id status author { givenName } reactions { emoji count } viewerReactions commentCount tags { value }"
    )
    return [
        Op("me", "{ me { id givenName } }", "ben"),
        Op("user", "query($id: ID!) { user(id: $id) { id givenName } }", "ben", fixed(id="ana")),
        Op("myFamilies", "{ myFamilies { role family { name admin { givenName } } } }", "ben"),
        Op(
            "family",
            "query($f: ID!) { family(id: $f) { name viewerRole members { edges { node { role user { givenName } } } } } }",
            "ben",
            fixed(f=f),
            "members",
        ),
        Op("family", FEED_QUERY, "ben", fixed(id=f), "the feed query of sections 1–2"),
        Op(
            "content",
            f"query($id: ID!) {{ content(id: $id) {{ {content_fields} }} }}",
            "ben",
            fixed(id=world["post"]),
        ),
        Op("capsule", capsule_q, "ben", fixed(id=world["open_capsule"])),
        Op("myCapsules", "{ myCapsules { edges { node { id status title } } } }", "ana"),
        Op("receivedCapsules", "{ receivedCapsules { edges { node { id status title } } } }", "ben"),
        Op(
            "searchTags",
            'query($f: ID!) { searchTags(familyId: $f, prefix: "ab") { edges { node { value content { id } } } } }',
            "ben",
            fixed(f=f),
        ),
        Op(
            "searchContent",
            'query($f: ID!) { searchContent(familyId: $f, text: "playa recu", first: 3) { edges { node { id title } } } }',
            "ben",
            fixed(f=f),
        ),
        Op("myTags", "{ myTags { edges { node { value } } } }", "ben"),
        Op(
            "tagStatus",
            'query($f: ID!) { tagStatus(familyId: $f, setName: "album") { taggedByAnyone taggedByViewer } }',
            "ben",
            fixed(f=f),
        ),
        Op("notifications", "{ notifications { edges { node { id type read content { id } } } } }", "ben"),
        Op(
            "updateProfile",
            'mutation { updateProfile(input: {givenName: "Benito"}) { id givenName } }',
            "ben",
        ),
        Op("completeOnboarding", "mutation { completeOnboarding { id onboardingComplete } }", "ben"),
        Op(
            "createFamily",
            'mutation { createFamily(input: {name: "Los Pérez"}) { id inviteCode } }',
            "ben",
        ),
        Op(
            "rotateInviteCode",
            "mutation($f: ID!) { rotateInviteCode(familyId: $f) { inviteCode } }",
            "ana",
            fixed(f=f),
        ),
        Op("joinFamily", JOIN, "gus", invite),
        Op(
            "vouch",
            "mutation($f: ID!, $u: ID!) { vouch(familyId: $f, userId: $u) { role vouchScore } }",
            "ana",
            fixed(f=v, u="pia"),
        ),
        Op(
            "approveMember",
            "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
            "ana",
            fixed(f=v, u="quim"),
        ),
        Op(
            "removeMember",
            "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }",
            "ana",
            fixed(f=f, u="gus"),
        ),
        Op("leaveFamily", "mutation($f: ID!) { leaveFamily(familyId: $f) }", "eve", fixed(f=f)),
        Op(
            "setMemberRole",
            "mutation($f: ID!, $u: ID!) { setMemberRole(familyId: $f, userId: $u, role: ADMIN) { role } }",
            "ana",
            fixed(f=f, u="dee"),
        ),
        Op(
            "createInvite",
            "mutation($f: ID!) { createInvite(input: {familyId: $f, maxUses: 3}) { id code uses } }",
            "ana",
            fixed(f=f),
        ),
        Op("revokeInvite", "mutation($id: ID!) { revokeInvite(id: $id) }", "ana", invite_made),
        Op(
            "updateFamilySettings",
            "mutation($f: ID!) { updateFamilySettings(input: {familyId: $f, postingPolicy: EVERYONE}) "
            "{ postingPolicy } }",
            "ana",
            admins_posting,
        ),
        Op(
            "family",
            "query($f: ID!) { family(id: $f) { admin { givenName } admins { givenName } invites { code uses } "
            "activity(first: 20) { edges { node { type actor { givenName } subject { givenName } createdAt } } } } }",
            "ana",
            fixed(f=f),
            "the admins' view",
        ),
        Op(
            "createUpload",
            "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id status } } }",
            "ben",
            upload_started,
        ),
        Op(
            "completeUpload",
            "mutation($id: ID!) { completeUpload(contentId: $id) { id status } }",
            "ben",
            upload_sent,
        ),
        Op(
            "retryContent",
            "mutation($id: ID!) { retryContent(contentId: $id) { id status } }",
            "ben",
            failed_content,
        ),
        Op(
            "markContentViewed",
            "mutation($id: ID!) { markContentViewed(contentId: $id) { id status } }",
            "ben",
            fixed(id=world["ana_post"]),
        ),
        Op("deleteContent", "mutation($id: ID!) { deleteContent(contentId: $id) }", "ben", own_content),
        Op(
            "addComment",
            COMMENT.replace("{ id }", "{ id body author { givenName } }"),
            "ben",
            fixed(id=world["post"], b="¡Qué bonito!"),
        ),
        Op(
            "deleteComment",
            "mutation($id: ID!, $c: ID!) { deleteComment(contentId: $id, commentId: $c) }",
            "ben",
            comment,
        ),
        Op(
            "addReaction",
            "mutation($id: ID!, $e: String!) { addReaction(contentId: $id, emoji: $e) { reactions { emoji count } viewerReactions } }",
            "ben",
            fixed(id=world["post"], e="😂"),
        ),
        Op(
            "removeReaction",
            'mutation($id: ID!) { removeReaction(contentId: $id, emoji: "🎉") { reactions { emoji count } viewerReactions } }',
            "ben",
            reacted,
        ),
        Op(
            "createCapsule",
            "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id status recipients { user { id } } } }",
            "ana",
            new_capsule,
        ),
        Op(
            "scheduleCapsule",
            "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { id status } }",
            "ana",
            draft,
        ),
        Op(
            "cancelCapsule",
            "mutation($id: ID!) { cancelCapsule(capsuleId: $id) { id status } }",
            "ana",
            scheduled,
        ),
        Op(
            "openCapsule",
            "mutation($id: ID!) { openCapsule(capsuleId: $id) { id status content { id } } }",
            "ben",
            opened,
        ),
        Op(
            "setTags",
            SET_TAGS.replace("{ value }", "{ value setName }"),
            "ben",
            fixed(id=world["post"], v=["playa", "abuelo"], s="album", p=False),
        ),
        Op("markNotificationsRead", "mutation { markNotificationsRead }", "ben"),
        Op(
            "restoreContent",
            "mutation($id: ID!) { restoreContent(contentId: $id) { id status } }",
            "ben",
            archived_content,
        ),
        Op(
            "resumeUpload",
            "mutation($id: ID!) { resumeUpload(contentId: $id) { uploadUrl receivedParts } }",
            "ben",
            uploading,
        ),
        Op("requestDataExport", "mutation { requestDataExport { id status } }", "dee"),
        Op(
            "dataExport",
            "query($id: ID!) { dataExport(id: $id) { id status expiresAt } }",
            "cy",
            requested_export,
        ),
        Op("rateLimit", "{ rateLimit { cost remaining resetAt } }", "ben"),
        Op("webPushPublicKey", "{ webPushPublicKey }", "ben"),
        Op(
            "registerPushDevice",
            REGISTER_DEVICE,
            "ben",
            fixed(i={**web_subscription("ben-phone"), "name": "Teléfono"}),
        ),
        Op("myPushDevices", "{ myPushDevices { id platform name lastPushedAt } }", "ben"),
        Op("unregisterPushDevice", "mutation($id: ID!) { unregisterPushDevice(id: $id) }", "ben", device),
        Op(
            "muteFamily",
            "mutation($f: ID!, $u: DateTime) { muteFamily(familyId: $f, until: $u) }",
            "ben",
            fixed(f=f, u=(clock.moment + timedelta(days=7)).isoformat()),
        ),
        # Last: it takes eve out of the world.
        Op("deleteMyAccount", "mutation { deleteMyAccount }", "eve"),
    ]


def web_subscription(name: str) -> dict[str, str]:
    """What a browser's PushSubscription.toJSON() gives, with fresh keys."""
    import base64
    import os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    point = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return {
        "platform": "WEB",
        "endpoint": f"{PUSH_ORIGIN}/push/{name}",
        "p256dh": b64(point),
        "auth": b64(os.urandom(16)),
    }


async def build_world(api: Client, clock: Any) -> dict[str, Any]:
    family = await make_family(api, "ana", "Los García")
    for user in ("ben", "cy", "dee", "eve"):
        await api.ok(JOIN, {"code": family["inviteCode"]}, as_=user)
    vouched = await make_family(api, "ana", "Los Vouch", trust="VOUCHED", threshold=2)
    await api.ok(JOIN, {"code": vouched["inviteCode"]}, as_="ben")
    for user in ("pia", "quim"):
        await api.ok(JOIN, {"code": vouched["inviteCode"]}, as_=user)
    posts = [
        await upload_text(
            api, ["ana", "ben"][n % 2], family["id"], f"post {n}".encode(), title=f"Recuerdo de la playa {n}"
        )
        for n in range(6)
    ]
    await settle(api)
    for n, post in enumerate(posts):
        await api.ok(REACT, {"id": post, "e": "❤️"}, as_="cy")
        for k in range(n % 3 + 1):
            await api.ok(COMMENT, {"id": post, "b": f"comentario {k}"}, as_=["cy", "dee"][k % 2])
        await api.ok(SET_TAGS, {"id": post, "v": ["abuela"], "s": "album"}, as_="ana")
    world: dict[str, Any] = {
        "clock": clock,
        "family": family["id"],
        "vouched": vouched["id"],
        "post": posts[1],
        "ana_post": posts[0],
    }
    # An open capsule for ben, and notifications for him.
    unlock = (clock.moment + timedelta(days=1)).isoformat()
    data = await api.ok(
        "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
        {
            "i": {
                "familyId": family["id"],
                "title": "Para ti",
                "unlockDate": unlock,
                "recipientIds": ["ben", "cy"],
            }
        },
        as_="ana",
    )
    capsule_id = data["createCapsule"]["id"]
    await api.ok(
        "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { id } }", {"id": capsule_id}, as_="ana"
    )
    await upload_text(api, "ana", family["id"], b"te quiero", capsule_id=capsule_id)
    await settle(api)
    clock.advance(days=1, seconds=1)
    await api.services.scheduler.run_once()
    world["open_capsule"] = capsule_id
    # The export builder works beside the requests, on the same table: stopped,
    # each count is the request's own. The exports the calls request stay PENDING.
    await api.services.exports.stop()
    return world


def label(op: Op) -> str:
    """How a row names the operation: `query user`, `query family (members)`."""
    kind = "mutation" if op.document.lstrip().startswith("mutation") else "query"
    return f"{kind} `{op.field}`" + (f" ({op.label})" if op.label else "")


def schema_operations(schema: Any) -> set[tuple[str, str]]:
    """(kind, field) of every query and mutation the schema has."""
    from graphql import GraphQLObjectType

    from schema.strawberry_internals import core_schema

    found: set[tuple[str, str]] = set()
    for kind, type_name in (("query", "Query"), ("mutation", "Mutation")):
        graphql_type = core_schema(schema).get_type(type_name)
        found |= {
            (kind, name)
            for name in (graphql_type.fields if isinstance(graphql_type, GraphQLObjectType) else {})
        }
    return found
