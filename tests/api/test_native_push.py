"""Native push through Amazon SNS mobile push, on moto_server: platform
applications for APNs and FCM, one SNS endpoint per device, each push
published to it and read back from moto, and a disabled endpoint removing its
device."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aioboto3
import httpx
import pytest

from tests.api.conftest import Api, running_api
from tests.factories import family_with_members, settle, upload
from tests.servers import moto_server_process

REGISTER = "mutation($i: RegisterPushDeviceInput!) { registerPushDevice(input: $i) { id platform } }"
DEVICES = "{ myPushDevices { id platform } }"
GONE = "{ myPushDevices { platform gone lastDelivery { status error } } }"
NOTES = "{ notifications { edges { node { id type } } } }"


@pytest.fixture(scope="module")
def sns_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto_server for SNS alone: the pushes are read back from its whole model
    data, which must hold nothing of other tests (an S3 object whose bucket another
    test deleted makes moto fail the dump)."""
    with moto_server_process(tmp_path_factory.mktemp("sns-moto")) as (url, _):
        yield url


@pytest.fixture(params=["sqlite", "dynamodb"])
async def native(
    request: pytest.FixtureRequest, tmp_path: Path, sns_moto: str
) -> AsyncIterator[tuple[Api, Any, str]]:
    moto_url = sns_moto
    async with aioboto3.Session().client("sns", endpoint_url=moto_url, region_name="us-east-1") as sns:
        suffix = uuid.uuid4().hex[:8]
        apns = await sns.create_platform_application(
            Name=f"ios-{suffix}",
            Platform="APNS",
            Attributes={"PlatformCredential": "k", "PlatformPrincipal": "c"},
        )
        fcm = await sns.create_platform_application(
            Name=f"android-{suffix}", Platform="GCM", Attributes={"PlatformCredential": "k"}
        )
        async with running_api(
            request.param,
            "local",
            tmp_path,
            request,
            sns_apns_arn=apns["PlatformApplicationArn"],
            sns_fcm_arn=fcm["PlatformApplicationArn"],
            sns_endpoint=moto_url,
        ) as api:
            yield api, sns, moto_url


async def pushed(api: Api) -> None:
    await api.services.pusher.recover()
    await api.services.pusher.queue.join()


async def endpoints(sns: Any, application: str) -> list[dict[str, Any]]:
    found = await sns.list_endpoints_by_platform_application(PlatformApplicationArn=application)
    return list(found["Endpoints"])


async def messages(moto_url: str, arn: str) -> list[dict[str, str]]:
    """What moto holds as published to the endpoint (its model data)."""
    # The whole server's model data: this module's server holds SNS alone.
    async with httpx.AsyncClient(timeout=120) as client:
        data = (await client.get(f"{moto_url}/moto-api/data.json")).json()
    for endpoint in data["sns"]["PlatformEndpoint"]:
        if endpoint["arn"] == arn:
            return [json.loads(body) for body in endpoint["messages"].values()]
    raise AssertionError(f"no endpoint {arn} in moto")


async def test_one_endpoint_per_device_a_push_each_and_a_disabled_endpoint_removes_its_device(
    native: tuple[Api, Any, str],
) -> None:
    api, sns, moto_url = native
    # Tokens of this run's own: moto finds an endpoint by its token alone,
    # across the platform applications of the session's server.
    apns_token, fcm_token = uuid.uuid4().hex * 2, f"fcm:{uuid.uuid4().hex}"
    settings = api.services.settings
    family_id = await family_with_members(api, "ana", ["ben"])
    phone = {"platform": "APNS", "token": apns_token, "name": "iPhone"}
    tablet = {"platform": "FCM", "token": fcm_token, "name": "Tablet"}
    first = (await api.ok(REGISTER, {"i": phone}, as_="ben"))["registerPushDevice"]
    again = (await api.ok(REGISTER, {"i": phone}, as_="ben"))["registerPushDevice"]
    assert again["id"] == first["id"]
    await api.ok(REGISTER, {"i": tablet}, as_="ben")
    [ios] = await endpoints(sns, settings.sns_apns_arn)
    [android] = await endpoints(sns, settings.sns_fcm_arn)
    assert ios["Attributes"]["Token"] == apns_token and android["Attributes"]["Token"] == fcm_token

    await upload(api, "ana", family_id, "TEXT", b"una foto privada", "text/plain", title="Secreto")
    await settle(api)
    await pushed(api)
    [note] = [e["node"] for e in (await api.ok(NOTES, as_="ben"))["notifications"]["edges"]]
    [to_ios] = await messages(moto_url, ios["EndpointArn"])
    document = json.loads(to_ios["APNS"])
    assert document["id"] == note["id"] and document["type"] == "NEW_CONTENT"
    assert document["aps"]["alert"]["title"] and "Secreto" not in to_ios["APNS"]
    [to_android] = await messages(moto_url, android["EndpointArn"])
    gcm = json.loads(to_android["GCM"])
    assert gcm["data"]["id"] == note["id"] and "privada" not in to_android["GCM"]

    # SNS disables an endpoint its platform refused: the next push marks the device gone.
    await sns.set_endpoint_attributes(EndpointArn=android["EndpointArn"], Attributes={"Enabled": "false"})
    await upload(api, "ana", family_id, "TEXT", b"otra", "text/plain")
    await settle(api)
    await pushed(api)
    listed = (await api.ok(GONE, as_="ben"))["myPushDevices"]
    assert sorted((d["platform"], d["gone"]) for d in listed) == [("APNS", False), ("FCM", True)]
    (fcm_device,) = [d for d in listed if d["platform"] == "FCM"]
    assert "SNS disabled" in fcm_device["lastDelivery"]["error"]
    assert len(await messages(moto_url, ios["EndpointArn"])) == 2
    assert await endpoints(sns, settings.sns_fcm_arn) == []  # its SNS endpoint went
    # The app registers its token again: a new endpoint, pushed to again.
    await api.ok(REGISTER, {"i": tablet}, as_="ben")
    assert len(await endpoints(sns, settings.sns_fcm_arn)) == 1
    listed = (await api.ok(GONE, as_="ben"))["myPushDevices"]
    assert [d["gone"] for d in listed] == [False, False]


async def test_a_deleted_account_takes_its_sns_endpoints_with_it(native: tuple[Api, Any, str]) -> None:
    api, sns, _ = native
    settings = api.services.settings
    await family_with_members(api, "ana", ["ben"])
    phone = {"platform": "APNS", "token": uuid.uuid4().hex * 2, "name": "iPhone"}
    tablet = {"platform": "FCM", "token": f"fcm:{uuid.uuid4().hex}", "name": "Tablet"}
    for device in (phone, tablet):
        await api.ok(REGISTER, {"i": device}, as_="ben")
    assert len(await endpoints(sns, settings.sns_apns_arn)) == 1
    assert (await api.ok("mutation { deleteMyAccount }", as_="ben"))["deleteMyAccount"] is True
    assert await endpoints(sns, settings.sns_apns_arn) == []
    assert await endpoints(sns, settings.sns_fcm_arn) == []
