"""Native push to apps through Amazon SNS mobile push: one platform
application for APNs and one for FCM (MIFAMILIAS_SNS_APNS_ARN,
MIFAMILIAS_SNS_FCM_ARN), one SNS platform endpoint per device, through aioboto3
like the rest of AWS. Off when neither is set."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from store.enums import PushPlatform


@dataclass(frozen=True)
class NativeMessage:
    title: str
    body: str
    data: dict[str, Any]
    collapse: str | None
    high: bool
    ttl: int


@dataclass(frozen=True)
class NativeOutcome:
    delivered: bool
    gone: bool = False  # the endpoint is disabled or deleted: the device goes
    retryable: bool = False


class SnsPush:
    def __init__(self, client: Any, applications: dict[str, str]) -> None:
        self.client = client
        self.applications = applications  # platform -> platform application ARN

    def configured(self, platform: str) -> bool:
        return platform in self.applications

    async def endpoint_for(self, platform: str, token: str, user_id: str) -> str:
        """The device's platform endpoint (SNS answers the same one for a token
        it already knows, with the same attributes)."""
        created = await self.client.create_platform_endpoint(
            PlatformApplicationArn=self.applications[platform],
            Token=token,
            CustomUserData=user_id,
        )
        arn = str(created["EndpointArn"])
        # A token given again re-enables its endpoint (SNS disables it on a failed delivery).
        await self.client.set_endpoint_attributes(
            EndpointArn=arn, Attributes={"Enabled": "true", "Token": token}
        )
        return arn

    async def forget(self, arn: str) -> None:
        with contextlib.suppress(ClientError):
            await self.client.delete_endpoint(EndpointArn=arn)

    async def publish(self, platform: str, arn: str, message: NativeMessage) -> NativeOutcome:
        try:
            attributes = await self.client.get_endpoint_attributes(EndpointArn=arn)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "NotFound":
                return NativeOutcome(False, gone=True)
            return NativeOutcome(False, retryable=True)
        if attributes.get("Attributes", {}).get("Enabled", "true").lower() != "true":
            return NativeOutcome(False, gone=True)
        try:
            await self.client.publish(
                TargetArn=arn,
                Message=json.dumps(_payload(platform, message)),
                MessageStructure="json",
                MessageAttributes=_attributes(platform, message),
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code in ("EndpointDisabled", "NotFound"):
                return NativeOutcome(False, gone=True)
            return NativeOutcome(False, retryable=code in ("Throttling", "InternalError", "KMSThrottling"))
        return NativeOutcome(True)


def _attributes(platform: str, message: NativeMessage) -> dict[str, Any]:
    """APNs' collapse id, priority and expiry travel as SNS message attributes."""
    if platform != PushPlatform.APNS:
        return {}
    found = {
        "AWS.SNS.MOBILE.APNS.PRIORITY": "10" if message.high else "5",
        "AWS.SNS.MOBILE.APNS.TTL": str(message.ttl),
        "AWS.SNS.MOBILE.APNS.PUSH_TYPE": "alert",
    }
    if message.collapse:
        found["AWS.SNS.MOBILE.APNS.COLLAPSE_ID"] = message.collapse
    return {name: {"DataType": "String", "StringValue": value} for name, value in found.items()}


def _payload(platform: str, message: NativeMessage) -> dict[str, str]:
    """SNS's message structure: one JSON document per platform, as a string."""
    if platform == PushPlatform.APNS:
        aps: dict[str, Any] = {"alert": {"title": message.title, "body": message.body}, "sound": "default"}
        document: dict[str, Any] = {"aps": aps, **message.data}
        return {"default": message.body, "APNS": json.dumps(document), "APNS_SANDBOX": json.dumps(document)}
    fcm = {
        "notification": {"title": message.title, "body": message.body},
        "data": {k: "" if v is None else str(v) for k, v in message.data.items()},
        "priority": "high" if message.high else "normal",
        "time_to_live": message.ttl,
        **({"collapse_key": message.collapse} if message.collapse else {}),
    }
    return {"default": message.body, "GCM": json.dumps(fcm)}


@contextlib.asynccontextmanager
async def open_sns(
    apns_arn: str | None, fcm_arn: str | None, endpoint_url: str | None, region: str
) -> AsyncIterator[SnsPush]:
    import aioboto3

    applications: dict[str, str] = {
        str(platform): arn
        for platform, arn in ((PushPlatform.APNS, apns_arn), (PushPlatform.FCM, fcm_arn))
        if arn
    }
    async with aioboto3.Session().client("sns", endpoint_url=endpoint_url, region_name=region) as client:
        yield SnsPush(client, applications)
