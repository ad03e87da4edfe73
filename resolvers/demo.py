"""A demo world for `./dev demo`, seeded in process through the domain services.

One family of five (an ADMIN, three MEMBERs let in by approval and by vouching,
one PENDING), a video with sound, a photo, an audio clip and a note made on the
spot with ffmpeg and Pillow, each uploaded through the real upload flow (the
upload URL is PUT through the app's own media route) and walked through the real
pipeline to READY; comments, reactions, public and private tags; a capsule the
real scheduler has opened, and one that opens `demo_unlock_seconds` after the
seeding, for a `capsuleUnlocked` subscription to watch live.

Every operation runs as its member, through a `Context` of its own built on the
services `runtime.compose` builds for the server, so every rule applies. A
`demo-world.json` written last marks the data directory as seeded; a second run
only prints the links again (`load_world`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

import imageio_ffmpeg
from PIL import Image, ImageDraw
from starlette.routing import Router
from starlette.types import Message

from resolvers.adapters import media
from resolvers.adapters.media_http import media_routes
from resolvers.core.auth import mint_token
from resolvers.core.config import Settings
from resolvers.core.context import Context
from resolvers.domain import capsules, content, families, tags
from resolvers.runtime import compose, local_blob_store
from resolvers.services import Services
from store import keys
from store.blobs import LocalBlobStore
from store.enums import CapsuleStatus, ContentStatus, ContentType, Role, TrustLevel
from store.items import Membership, User
from store.port import SortKey, all_items
from store.sqlite import SqliteTable

WORLD_FILE = "demo-world.json"
TOKEN_DAYS = 30
# What each printed link runs first.
LINK_QUERY = "query Me {\n  me { id givenName }\n  myFamilies { role family { id name } }\n}\n"
WATCH_QUERY = (
    "subscription WatchCapsules {\n  capsuleUnlocked {\n    unlockedAt\n"
    "    capsule { title status content { type title mediaUrl } }\n  }\n}\n"
)
# The first capsule is due this soon after it is made; the seeding waits for it.
OPENED_CAPSULE_SECONDS = 4.0
PIPELINE_DEADLINE_SECONDS = 180.0
UNLOCK_DEADLINE_SECONDS = 60.0
FFMPEG_TIMEOUT_SECONDS = 60.0


class DemoError(RuntimeError):
    """The demo cannot be seeded here, or a step of the seeding did not end as it should."""


@dataclass(frozen=True)
class Person:
    id: str
    given_name: str
    family_name: str
    role: str

    @property
    def name(self) -> str:
        return f"{self.given_name} {self.family_name}"

    @property
    def email(self) -> str:
        return f"{self.id}@example.org"


@dataclass(frozen=True)
class CapsuleInfo:
    id: str
    title: str
    unlock_date: str
    recipient_ids: tuple[str, ...]


@dataclass(frozen=True)
class World:
    family_id: str
    family_name: str
    people: tuple[Person, ...]
    content_ids: tuple[str, ...]
    opened_capsule: CapsuleInfo
    live_capsule: CapsuleInfo
    seeded_at: str
    seed_seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> World:
        def capsule(raw: dict[str, Any]) -> CapsuleInfo:
            return CapsuleInfo(**{**raw, "recipient_ids": tuple(raw["recipient_ids"])})

        return cls(
            family_id=data["family_id"],
            family_name=data["family_name"],
            people=tuple(Person(**person) for person in data["people"]),
            content_ids=tuple(data["content_ids"]),
            opened_capsule=capsule(data["opened_capsule"]),
            live_capsule=capsule(data["live_capsule"]),
            seeded_at=data["seeded_at"],
            seed_seconds=float(data["seed_seconds"]),
        )


ANA = Person("ana", "Ana", "García", Role.ADMIN)
BEN = Person("ben", "Ben", "García", Role.MEMBER)
CARLA = Person("carla", "Carla", "Ruiz", Role.MEMBER)
DIEGO = Person("diego", "Diego", "García", Role.MEMBER)
ELENA = Person("elena", "Elena", "Ruiz", Role.PENDING)
PEOPLE = (ANA, BEN, CARLA, DIEGO, ELENA)
FAMILY_NAME = "Los García"


# Where the demo may run -----------------------------------------------------------------


def world_path(settings: Settings) -> Path:
    return settings.data_dir / WORLD_FILE


def refusal(settings: Settings) -> str | None:
    """Why the demo cannot run with these settings, or None."""
    if settings.uses_dynamodb or settings.s3_bucket:
        return (
            "./dev demo seeds the embedded store (SQLite and local media files): unset "
            "MIFAMILIAS_DYNAMODB_ENDPOINT, MIFAMILIAS_AWS_REGION and MIFAMILIAS_S3_BUCKET"
        )
    if settings.jwks_url:
        return "./dev demo mints HS256 development tokens: unset MIFAMILIAS_JWKS_URL"
    if load_world(settings) is None and settings.sqlite_path.exists():
        return (
            f"{settings.data_dir} already holds a store that ./dev demo did not seed (or a seeding that "
            "did not finish); point MIFAMILIAS_DATA_DIR at an empty directory, e.g. "
            "MIFAMILIAS_DATA_DIR=demo-data ./dev demo, or remove it"
        )
    return None


def load_world(settings: Settings) -> World | None:
    """The world a past run seeded here, or None."""
    path = world_path(settings)
    if not path.exists():
        return None
    return World.from_json(json.loads(path.read_text(encoding="utf-8")))


async def as_it_is_now(settings: Settings, world: World) -> World:
    """The seeded world with its family's members as they are now: roles
    changed since (a co-admin named in GraphiQL, say), who joined since, and
    not who left or was removed."""
    table = SqliteTable(settings.sqlite_path)
    try:
        found = await all_items(
            table, keys.family_pk(world.family_id), SortKey.begins_with(keys.MEMBER_PREFIX)
        )
        members = [Membership.from_item(item) for item in found]
        profiles = await table.batch_get([keys.user(m.user_id) for m in members])
    finally:
        await table.close()
    seeded = {person.id: person for person in world.people}
    people = []
    for membership in members:
        known = seeded.get(membership.user_id)
        profile = profiles.get(keys.user(membership.user_id))
        user = User.from_item(profile) if profile is not None else None
        people.append(
            Person(
                membership.user_id,
                (user.given_name if user else None) or (known.given_name if known else membership.user_id),
                (user.family_name if user else None) or (known.family_name if known else ""),
                membership.role,
            )
        )
    # The seeded ones first, in their order; then those who came since.
    order = {person_id: n for n, person_id in enumerate(seeded)}
    people.sort(key=lambda person: (order.get(person.id, len(order)), person.id))
    return replace(world, people=tuple(people))


def _save_world(settings: Settings, world: World) -> None:
    path = world_path(settings)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(world.to_json(), ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(temporary, path)


# Media made on the spot ---------------------------------------------------------------


async def _ffmpeg(*args: str) -> None:
    process = await asyncio.create_subprocess_exec(
        imageio_ffmpeg.get_ffmpeg_exe(),
        *("-hide_banner", "-nostdin", "-loglevel", "error", "-y", *args),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), FFMPEG_TIMEOUT_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise DemoError("ffmpeg took too long to make the demo media") from None
    if process.returncode != 0:
        raise DemoError(f"ffmpeg could not make the demo media: {stderr.decode(errors='replace')[-500:]}")


# Speech for the demo's video (English) and voice message (Spanish): made once with
# espeak-ng and kept as data (docs/decisions.md says how), so the first `./dev demo`
# shows transcripts, captions and search with no synthesiser on the machine.
DEMO_MEDIA = Path(__file__).resolve().parent / "demo_media"
FIRST_STEPS_SPEECH = DEMO_MEDIA / "first-steps-en.m4a"
LULLABY_SPEECH = DEMO_MEDIA / "lullaby-es.m4a"
FIRST_STEPS_WORDS = "Look at her, she is taking her first steps. Come on, walk to grandma!"
LULLABY_WORDS = "Duérmete, mi niño, duérmete ya. Mañana vamos todos a casa de la abuela."


async def make_video(folder: Path) -> bytes:
    """ffmpeg's test pattern with someone speaking over it (English), H.264/AAC in
    MP4, as long as the speech."""
    out = folder / "video.mp4"
    await _ffmpeg(
        "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25", "-i", str(FIRST_STEPS_SPEECH),
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
        "-c:a", "aac", "-b:a", "64k", "-shortest", str(out),
    )  # fmt: skip
    return out.read_bytes()


async def make_audio(folder: Path) -> bytes:
    """A voice message in Spanish, AAC in M4A."""
    return await asyncio.to_thread(LULLABY_SPEECH.read_bytes)


def make_photo(size: tuple[int, int] = (960, 640), *, sun: tuple[int, int, int] = (255, 200, 40)) -> bytes:
    """A JPEG drawn with Pillow: a sky, a sun, the sea and the sand."""
    width, height = size
    gradient = Image.linear_gradient("L").resize(size)
    image = Image.merge(
        "RGB",
        (
            gradient.point(lambda v: 110 + v // 4),
            gradient.point(lambda v: 160 + v // 4),
            Image.new("L", size, 235),
        ),
    )
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, height * 3 // 5, width, height * 4 // 5), fill=(20, 110, 170))
    draw.rectangle((0, height * 4 // 5, width, height), fill=(230, 205, 150))
    r = height // 8
    draw.ellipse((width * 3 // 4 - r, height // 5 - r, width * 3 // 4 + r, height // 5 + r), fill=sun)
    draw.text((24, height - 40), "MiFamilias demo", fill=(60, 40, 20))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=85)
    return out.getvalue()


def token_for(settings: Settings, person: Person, *, ttl_seconds: int) -> str:
    """A development token for `person`, from the same settings (secret, issuer,
    audience) the server verifies with."""
    return mint_token(
        settings.resolved_auth_secret(),
        person.id,
        email=person.email,
        given_name=person.given_name,
        family_name=person.family_name,
        ttl_seconds=ttl_seconds,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
    )


# Seeding ---------------------------------------------------------------------------------


class _Seeder:
    def __init__(self, services: Services, blobs: LocalBlobStore) -> None:
        self.services = services
        self.settings = services.settings
        # The app's own PUT route for local media, called in process.
        self.media = Router(routes=media_routes(blobs))

    async def as_(self, person: Person) -> Context:
        """A fresh context signed in as `person`, as a request of theirs would be."""
        ctx = Context(services=self.services)
        await ctx.authenticate(f"Bearer {token_for(self.settings, person, ttl_seconds=3600)}")
        if ctx.claims is None:
            raise DemoError(f"the server's verifier refused {person.id}'s token: {ctx.auth_error}")
        return ctx

    async def put(self, url: str, body: bytes, mime: str) -> None:
        """PUTs the bytes to an upload URL through the app's media route."""
        parts = urlsplit(url)
        path = "/media/" + parts.path.split("/media/", 1)[1]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "PUT",
            "scheme": parts.scheme or "http",
            "path": unquote(path),
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": parts.query.encode(),
            "headers": [(b"content-type", mime.encode()), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", self.settings.port),
        }
        sent = False
        status = 0

        async def receive() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await self.media(scope, receive, send)
        if status != 200:
            raise DemoError(f"the upload URL answered {status}")

    async def upload(
        self,
        person: Person,
        family_id: str,
        kind: str,
        body: bytes,
        mime: str,
        title: str,
        capsule_id: str | None = None,
    ) -> str:
        """createUpload, the bytes to its URL, completeUpload: the content id, now in the pipeline."""
        target = await content.create_upload(
            await self.as_(person),
            family_id=family_id,
            content_type=kind,
            mime_type=mime,
            size_bytes=len(body),
            title=title,
            capsule_id=capsule_id,
        )
        # The demo's files are small: always one PUT, never parts.
        await self.put(target.url, body, mime)
        await content.complete_upload(await self.as_(person), target.content.id)
        return target.content.id

    async def settle(self, content_ids: Sequence[str]) -> None:
        """Waits until the pipeline has walked every content; each must be READY."""
        try:
            await asyncio.wait_for(self.services.pipeline.queue.join(), PIPELINE_DEADLINE_SECONDS)
        except TimeoutError:
            raise DemoError(
                f"the media pipeline did not finish in {PIPELINE_DEADLINE_SECONDS:.0f} s"
            ) from None
        for content_id in content_ids:
            item = await self.services.table.get(keys.content(content_id))
            if item is None or item["status"] != ContentStatus.READY:
                status = item and item["status"]
                reason = item and item.get("failureReason")
                raise DemoError(f"content {content_id} ended {status}, not READY: {reason}")

    async def capsule(
        self, creator: Person, family_id: str, title: str, unlock: datetime, recipients: Sequence[Person]
    ) -> CapsuleInfo:
        made = await capsules.create_capsule(
            await self.as_(creator), family_id, title, unlock, [person.id for person in recipients]
        )
        await capsules.schedule_capsule(await self.as_(creator), made.id)
        return CapsuleInfo(made.id, made.title, made.unlock_date, made.recipient_ids)

    async def until_open(self, capsule: CapsuleInfo) -> None:
        """Waits for the capsule's date, then lets the scheduler open it."""
        due = datetime.fromisoformat(capsule.unlock_date)
        await asyncio.sleep(max(0.0, (due - self.services.now()).total_seconds()))
        deadline = time.monotonic() + UNLOCK_DEADLINE_SECONDS
        while True:
            await self.services.scheduler.run_once()
            item = await self.services.table.get(keys.capsule(capsule.id))
            if item is not None and item["status"] == CapsuleStatus.AVAILABLE:
                return
            if time.monotonic() > deadline:
                status = item and item["status"]
                raise DemoError(f"the scheduler did not open capsule {capsule.id} (status {status})")
            await asyncio.sleep(0.2)

    async def run(self, folder: Path, live_after: float) -> World:
        started = time.monotonic()
        # The family: Ana creates it; Ben and Diego are approved, Carla is
        # vouched in by Ana and Ben, Elena has one vouch of the two she needs.
        family = await families.create_family(await self.as_(ANA), FAMILY_NAME, TrustLevel.VOUCHED, 2)
        for person in (BEN, CARLA, DIEGO, ELENA):
            await families.join_family(await self.as_(person), family.invite_code)
        await families.approve_member(await self.as_(ANA), family.id, BEN.id)
        await families.approve_member(await self.as_(ANA), family.id, DIEGO.id)
        for voucher in (ANA, BEN):
            await families.vouch(await self.as_(voucher), family.id, CARLA.id)
        await families.vouch(await self.as_(CARLA), family.id, ELENA.id)

        # A capsule due in a few seconds, wrapping a note: the scheduler opens it below.
        opened = await self.capsule(
            ANA,
            family.id,
            "La receta de la abuela",
            self.services.now() + timedelta(seconds=OPENED_CAPSULE_SECONDS),
            [BEN, CARLA],
        )
        recipe = "Tortilla de la abuela: 6 huevos, 4 patatas, 1 cebolla, aceite de oliva y paciencia.\n"
        sealed = await self.upload(
            ANA, family.id, ContentType.TEXT, recipe.encode(), "text/plain", "La receta", opened.id
        )

        # Four media, one per member.
        video, audio = await asyncio.gather(make_video(folder), make_audio(folder))
        note = "¡Nos vemos todos en casa de la abuela el domingo! Traed postre.\n"
        shared = [
            await self.upload(ANA, family.id, ContentType.VIDEO, video, "video/mp4", "Primeros pasos"),
            await self.upload(BEN, family.id, ContentType.PHOTO, make_photo(), "image/jpeg", "La playa"),
            await self.upload(CARLA, family.id, ContentType.AUDIO, audio, "audio/mp4", "Canción de cuna"),
            await self.upload(DIEGO, family.id, ContentType.TEXT, note.encode(), "text/plain", "El domingo"),
        ]
        await self.settle([sealed, *shared])
        first_steps, beach, lullaby, sunday = shared

        # What the family says about it.
        for person, on, body in (
            (BEN, first_steps, "¡Qué bonito! 😍"),
            (CARLA, first_steps, "Mira cómo camina, ya no hay quien lo pare."),
            (ANA, beach, "Qué envidia de playa."),
            (DIEGO, lullaby, "Con esta se duerme seguro."),
            (CARLA, sunday, "Yo llevo el flan."),
        ):
            await content.add_comment(await self.as_(person), on, body)
        for person, on, emoji in (
            (BEN, first_steps, "❤️"),
            (CARLA, first_steps, "❤️"),
            (DIEGO, first_steps, "👏"),
            (ANA, beach, "😍"),
            (ANA, lullaby, "❤️"),
            (BEN, sunday, "😂"),
        ):
            await content.add_reaction(await self.as_(person), on, emoji)
        for person, on, values, set_name, private in (
            (ANA, first_steps, ["primeros pasos", "Mateo"], "Hitos", False),
            (BEN, beach, ["playa", "verano"], None, False),
            (CARLA, lullaby, ["canciones", "Mateo"], None, False),
            (ANA, beach, ["favoritas"], None, True),
            (CARLA, sunday, ["recordar"], None, True),
        ):
            await tags.set_tags(await self.as_(person), on, values, set_name, private)

        await self.until_open(opened)

        # Last, so that it opens `live_after` seconds after the server starts, more or less.
        live = await self.capsule(
            ANA,
            family.id,
            "Un mensaje para dentro de un rato",
            self.services.now() + timedelta(seconds=live_after),
            [BEN, CARLA, DIEGO],
        )
        postcard = make_photo((640, 480), sun=(255, 120, 60))
        sealed_photo = await self.upload(
            ANA, family.id, ContentType.PHOTO, postcard, "image/jpeg", "Una postal para el futuro", live.id
        )
        await self.settle([sealed_photo])
        return World(
            family_id=family.id,
            family_name=family.name,
            people=PEOPLE,
            content_ids=(*shared, sealed, sealed_photo),
            opened_capsule=opened,
            live_capsule=live,
            seeded_at=self.services.now_iso(),
            seed_seconds=round(time.monotonic() - started, 1),
        )


async def seed(settings: Settings) -> World:
    """Seeds the demo world in the settings' data directory and marks it seeded."""
    problem = refusal(settings)
    if problem is not None:
        raise DemoError(problem)
    if load_world(settings) is not None:
        raise DemoError(f"{settings.data_dir} already holds the demo world")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        table = SqliteTable(settings.sqlite_path)
        stack.push_async_callback(table.close)
        blobs = local_blob_store(settings)
        stack.callback(media.close_photo_pool)  # after the pipeline's workers stop
        services = await compose(settings, table, stack, local_blobs=blobs)
        # The pipeline's workers; the scheduler is run by hand, when a capsule is due.
        await services.pipeline.start()
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mifamilias-demo-")))
        world = await _Seeder(services, blobs).run(folder, settings.demo_unlock_seconds)
    _save_world(settings, world)
    return world


# What the demo prints ---------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    person: Person
    token: str
    url: str


def graphiql_url(settings: Settings, token: str, query: str) -> str:
    headers = json.dumps({"Authorization": f"Bearer {token}"})
    return f"{settings.base_url}/graphql?" + urlencode({"headers": headers, "query": query}, quote_via=quote)


def links(settings: Settings, world: World, days: int = TOKEN_DAYS) -> list[Link]:
    """A token and a GraphiQL link per member, minted from the server's own settings."""
    found = []
    for person in world.people:
        token = token_for(settings, person, ttl_seconds=days * 24 * 3600)
        found.append(Link(person, token, graphiql_url(settings, token, LINK_QUERY)))
    return found


def _when(moment: str) -> str:
    return datetime.fromisoformat(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


def _names(people: Sequence[Person]) -> str:
    names = [person.given_name for person in people]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def describe(
    settings: Settings,
    world: World,
    *,
    seeded_now: bool,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> str:
    """What `./dev demo` prints before it serves."""
    by_id = {person.id: person for person in world.people}
    if seeded_now:
        head = f"Seeded a demo world in {settings.data_dir} in {world.seed_seconds:.1f} s"
    else:
        seeded = _when(world.seeded_at)
        head = f"{settings.data_dir} already holds the demo world seeded at {seeded}; nothing seeded"
    lines = [
        head + f': the family "{world.family_name}" of {len(world.people)}, {len(world.content_ids)} media'
        " (two of them sealed in capsules).",
        "",
        "Open GraphiQL as one of them: each link fills in their Authorization header and a first query;",
        "press the run button. The other tabs hold example operations.",
        "",
    ]
    minted = links(settings, world)
    for link in minted:
        lines += [
            f"  {link.person.name} ({link.person.role}, id {link.person.id})",
            f"    token:    {link.token}",
            f"    GraphiQL: {link.url}",
        ]
    secret = "MIFAMILIAS_AUTH_SECRET" if settings.auth_secret else str(settings.data_dir / "auth-secret")
    lines += [
        "",
        f"The tokens are development tokens (HS256, signed with {secret}), valid for {TOKEN_DAYS} days;",
        "./dev app token <id> mints more.",
        "",
    ]
    live = world.live_capsule
    due = datetime.fromisoformat(live.unlock_date)
    recipients = [by_id[user] for user in live.recipient_ids if user in by_id]
    opened = world.opened_capsule
    opened_for = [by_id[user] for user in opened.recipient_ids if user in by_id]
    lines.append(f'Capsule "{opened.title}" opened at {_when(opened.unlock_date)} for {_names(opened_for)}.')
    if due > now():
        watcher = recipients[0]
        token = next(link.token for link in minted if link.person.id == watcher.id)
        wait = (due - now()).total_seconds()
        lines += [
            f'Capsule "{live.title}" unlocks at {_when(live.unlock_date)} ({wait:.0f} s from now)'
            f" for {_names(recipients)}. Watch it open live, as {watcher.given_name}:",
            f"    {graphiql_url(settings, token, WATCH_QUERY)}",
        ]
    else:
        lines.append(
            f'Capsule "{live.title}" unlocked at {_when(live.unlock_date)} for {_names(recipients)}.'
        )
    lines += [
        "",
        f"Serving on {settings.base_url} (GraphiQL at {settings.base_url}/graphql); Ctrl-C stops it.",
        "",
    ]
    return "\n".join(lines)
