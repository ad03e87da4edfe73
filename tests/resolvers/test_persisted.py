"""Trusted-documents manifests (both formats, and what is refused) and the
settings that turn trusted documents and introspection on and off."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from resolvers.core.config import Settings
from resolvers.core.errors import BadInput, PersistedQueryNotInList
from resolvers.core.persisted import ManifestEntry, ManifestError, TrustedDocuments, parse_manifest

ME = "{ me { id } }"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_both_manifest_formats_are_read() -> None:
    apollo = {
        "format": "apollo-persisted-query-manifest",
        "version": 1,
        "operations": [{"id": "abc", "body": ME, "name": "Me", "type": "query"}],
    }
    assert parse_manifest(apollo) == [ManifestEntry("abc", ME, "Me")]
    assert parse_manifest({"abc": ME}) == [ManifestEntry("abc", ME)]


@pytest.mark.parametrize(
    ("manifest", "says"),
    [
        ({"format": "apollo-persisted-query-manifest", "version": 2, "operations": []}, "version 2"),
        ({"format": "apollo-persisted-query-manifest", "version": 1}, "operations"),
        (
            {"format": "apollo-persisted-query-manifest", "version": 1, "operations": [{"id": "a"}]},
            "operations[0]",
        ),
        ({"a": 1}, "Relay"),
        ([ME], "Relay"),
        (
            {
                "format": "apollo-persisted-query-manifest",
                "version": 1,
                "operations": [{"id": "a", "body": ME}, {"id": "a", "body": "{ __typename }"}],
            },
            "listed twice",
        ),
    ],
)
def test_a_manifest_the_server_cannot_use_is_refused_with_the_reason(manifest: object, says: str) -> None:
    with pytest.raises(ManifestError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_manifest(manifest)


def test_trusted_documents_run_by_id_by_sha_or_by_text_and_nothing_else() -> None:
    md5 = hashlib.md5(ME.encode()).hexdigest()
    trusted = TrustedDocuments([ManifestEntry(md5, ME)])
    never = lambda query: False  # noqa: E731
    assert trusted.resolve(None, md5, never).query == ME
    assert trusted.resolve(None, sha(ME), never).query == ME
    assert trusted.resolve(ME, None, never).query == ME
    assert trusted.resolve(ME, md5, never).query == ME
    with pytest.raises(PersistedQueryNotInList):
        trusted.resolve("{ __typename }", None, never)
    with pytest.raises(PersistedQueryNotInList):
        trusted.resolve(None, sha("{ __typename }"), never)
    with pytest.raises(BadInput, match="provided sha does not match query"):
        trusted.resolve(ME, sha("{ __typename }"), never)
    assert trusted.resolve("{ __typename }", None, lambda query: True).query == "{ __typename }"
    assert trusted.resolve(ME, None, never).register is None


def test_introspection_follows_trusted_documents_unless_set() -> None:
    assert Settings().introspection_allowed
    assert not Settings(trusted_documents=Path("m.json")).introspection_allowed
    assert Settings(trusted_documents=Path("m.json"), allow_introspection=True).introspection_allowed
    assert not Settings(allow_introspection=False).introspection_allowed
    read = Settings.from_env(
        {"MIFAMILIAS_TRUSTED_DOCUMENTS": "m.json", "MIFAMILIAS_ALLOW_INTROSPECTION": "1"}
    )
    assert read.trusted_documents == Path("m.json") and read.allow_introspection is True
