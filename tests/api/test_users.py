"""Sign-in, the first request of a new user, and profiles."""

from __future__ import annotations

import time

import jwt
import pytest

from tests.api.conftest import Api
from tests.factories import family_with_members
from tests.servers import SECRET

pytestmark = pytest.mark.usefixtures("turns_without_time")

ME = "{ me { id email givenName familyName profileImageUrl onboardingComplete createdAt } }"


async def test_first_request_creates_the_user_from_claims(api: Api) -> None:
    token = api.token(
        "ana",
        email="ana@example.org",
        given_name="Ana",
        family_name="García",
        picture="https://example.org/ana.png",
    )
    body = await api.post(ME, headers={"Authorization": f"Bearer {token}"})
    me = body["data"]["me"]
    assert me["id"] == "ana"
    assert me["email"] == "ana@example.org"
    assert (me["givenName"], me["familyName"]) == ("Ana", "García")
    assert me["profileImageUrl"] == "https://example.org/ana.png"
    assert me["onboardingComplete"] is False
    assert me["createdAt"].endswith("+00:00")
    assert ("USER#ana", "PROFILE") in await api.snapshot()


async def test_no_token_bad_signature_and_expired_token_are_unauthenticated_and_write_nothing(
    api: Api,
) -> None:
    before = await api.snapshot()
    assert await api.error(ME, as_=None) == ("UNAUTHENTICATED", "sign in: send a Bearer token")
    forged = jwt.encode({"sub": "eve", "exp": 2_000_000_000}, "another-secret-" + "y" * 32, algorithm="HS256")
    body = await api.post(ME, headers={"Authorization": f"Bearer {forged}"})
    assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    expired = jwt.encode({"sub": "eve", "exp": 1_000_000}, SECRET, algorithm="HS256")
    body = await api.post(ME, headers={"Authorization": f"Bearer {expired}"})
    assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert body["errors"][0]["message"] == "the token has expired"
    body = await api.post(ME, headers={"Authorization": "Basic abc"})
    assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert await api.snapshot() == before


async def test_update_profile_and_onboarding(api: Api) -> None:
    data = await api.ok(
        'mutation { updateProfile(input: {givenName: " Ana María ", profileImageUrl: "https://x.org/a.png"})'
        " { givenName familyName profileImageUrl } }",
        as_="ana",
    )
    assert data["updateProfile"] == {
        "givenName": "Ana María",
        "familyName": None,
        "profileImageUrl": "https://x.org/a.png",
    }
    data = await api.ok("mutation { completeOnboarding { onboardingComplete } }", as_="ana")
    assert data["completeOnboarding"]["onboardingComplete"] is True
    assert (await api.ok(ME, as_="ana"))["me"]["onboardingComplete"] is True


async def test_update_profile_refuses_bad_input_and_changes_nothing(api: Api) -> None:
    await api.ok(ME, as_="ana")
    before = await api.snapshot()
    for profile in (
        '{givenName: ""}',
        '{givenName: "   "}',
        '{familyName: "' + "x" * 101 + '"}',
        '{profileImageUrl: "javascript:alert(1)"}',
    ):
        code, message = await api.error(f"mutation {{ updateProfile(input: {profile}) {{ id }} }}", as_="ana")
        assert code == "BAD_USER_INPUT", message
    assert await api.snapshot() == before


async def test_user_is_visible_only_to_relatives_and_email_only_to_oneself(api: Api) -> None:
    await family_with_members(api, "ana", ["ben"])
    await api.ok(ME, as_="zoe")
    data = await api.ok('{ user(id: "ben") { id givenName email } }', as_="ana")
    assert data["user"] == {"id": "ben", "givenName": "Ben", "email": None}
    assert (await api.error('{ user(id: "ben") { id } }', as_="zoe"))[0] == "NOT_FOUND"
    assert (await api.error('{ user(id: "nobody") { id } }', as_="ana"))[0] == "NOT_FOUND"
    assert (await api.ok('{ user(id: "ana") { email } }', as_="ana"))["user"]["email"] == "ana@example.org"


async def test_without_a_token_nothing_touches_the_store(api: Api) -> None:
    await api.sign_in("ana")
    api.table.reset()  # type: ignore[attr-defined]
    for query in (
        '{ content(id: "abc") { id } }',
        '{ user(id: "x#USER") { id } }',
        '{ family(id: "f") { name feed { edges { node { id } } } } }',
        'mutation { joinFamily(inviteCode: "AAAAA-BBBBB") { role } }',
        'mutation { updateProfile(input: {givenName: "X"}) { id } }',
    ):
        code, _ = await api.error(query, as_=None)
        assert code == "UNAUTHENTICATED", query
    assert dict(api.table.calls) == {}  # type: ignore[attr-defined]


async def test_an_operation_on_a_connection_whose_token_expired_is_refused(api: Api) -> None:
    """A WebSocket keeps its context for hours: an operation that arrives after
    the token's expiry runs nothing, whatever the socket's state."""
    from resolvers.core.context import Context
    from schema import schema

    await api.sign_in("ana")
    context = Context(services=api.services)
    await context.authenticate(f"Bearer {api.token('ana', ttl_seconds=3600)}")
    assert context.claims is not None
    first = await schema.execute(
        'mutation { updateProfile(input: {givenName: "Antes"}) { givenName } }', context_value=context
    )
    assert first.errors is None
    # The same connection, an hour later: the token has expired.
    object.__setattr__(context.claims, "expires_at", time.time() - 1)
    later = await schema.execute(
        'mutation { updateProfile(input: {givenName: "Después"}) { givenName } }', context_value=context
    )
    assert later.errors and later.errors[0].extensions == {"code": "UNAUTHENTICATED"}
    assert later.errors[0].message == "the token has expired"
    me = await api.ok("{ me { givenName } }", as_="ana")
    assert me["me"]["givenName"] == "Antes"
