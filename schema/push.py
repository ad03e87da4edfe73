"""Push devices: the viewer's own browsers and apps."""

from __future__ import annotations

from datetime import datetime

import strawberry

from schema.common import maybe_when, when
from schema.enums import PushPlatform
from store import items


@strawberry.type(description="what became of the last push tried on a device")
class PushDelivery:
    at: datetime = strawberry.field(description="when it was tried")
    status: int | None = strawberry.field(
        description="the push service's HTTP status (Web Push: 201 when it took the push); null through "
        "SNS (APNS, FCM) and when nothing answered"
    )
    error: str | None = strawberry.field(description="why it did not reach the device; null when it did")


@strawberry.type(description="a browser or an app of the viewer's that receives pushes")
class PushDevice:
    item: strawberry.Private[items.PushDevice]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    def platform(self) -> PushPlatform:
        return PushPlatform(self.item.platform)

    @strawberry.field
    def name(self) -> str | None:
        return self.item.name

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)

    @strawberry.field(description="when the last push reached its push service; null until one did")
    def last_pushed_at(self) -> datetime | None:
        return maybe_when(self.item.last_pushed_at)

    @strawberry.field(
        description="the last push tried, whether it reached its push service or not; null until one was"
    )
    def last_delivery(self) -> PushDelivery | None:
        if self.item.last_delivery_at is None:
            return None
        return PushDelivery(
            at=when(self.item.last_delivery_at),
            status=self.item.last_delivery_status,
            error=self.item.last_delivery_error,
        )

    @strawberry.field(
        description="its push service said it is no more (410, or a disabled SNS endpoint): nothing is "
        "pushed to it until it is registered again"
    )
    def gone(self) -> bool:
        return self.item.gone_at is not None


@strawberry.input
class RegisterPushDeviceInput:
    platform: PushPlatform
    endpoint: str | None = strawberry.field(
        default=None, description="WEB: the subscription's endpoint, from PushSubscription.toJSON()"
    )
    p256dh: str | None = strawberry.field(default=None, description="WEB: keys.p256dh, base64url")
    auth: str | None = strawberry.field(default=None, description="WEB: keys.auth, base64url")
    token: str | None = strawberry.field(default=None, description="APNS, FCM: the app's device token")
    name: str | None = strawberry.field(default=None, description="what the person calls the device")
