"""Which address a request comes from, and the rate-limit settings."""

from __future__ import annotations

import pytest

from resolvers.core.ratelimit import Limit, client_address, parse_limits


def test_the_peer_is_the_client_unless_it_is_a_trusted_proxy() -> None:
    assert client_address("198.51.100.1", "203.0.113.7", []) == "198.51.100.1"
    assert client_address("198.51.100.1", "203.0.113.7", ["10.0.0.0/8"]) == "198.51.100.1"
    assert client_address("10.1.2.3", "203.0.113.7", ["10.0.0.0/8"]) == "203.0.113.7"
    # A client cannot choose its address by prepending to the header.
    assert client_address("10.1.2.3", "1.1.1.1, 203.0.113.7", ["10.0.0.0/8"]) == "203.0.113.7"
    assert client_address("10.1.2.3", "203.0.113.7, 10.9.9.9", ["10.0.0.0/8"]) == "203.0.113.7"
    assert client_address("10.1.2.3", "garbage", ["10.0.0.0/8"]) == "10.1.2.3"
    assert client_address(None, None, []) == "unknown"


def test_rate_limits_are_set_per_action_and_a_bad_entry_names_itself() -> None:
    limits = parse_limits("comment=3/60, upload=1/3600")
    assert limits["comment"] == Limit(3, 60) and limits["upload"] == Limit(1, 3600)
    assert limits["reaction"] == parse_limits(None)["reaction"]
    with pytest.raises(ValueError, match="MIFAMILIAS_RATE_LIMITS: 'comment=lots'"):
        parse_limits("comment=lots")
