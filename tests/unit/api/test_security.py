"""API key format, hashing and scope implication."""

from __future__ import annotations

from dpsynth_api.tenants.security import (
    Principal,
    Scope,
    generate_key,
    hash_secret,
    looks_like_key_in_query,
    parse_token,
    secret_matches,
)


def test_key_round_trip() -> None:
    key = generate_key()
    assert key.token.startswith("dps_key_")
    assert len(key.secret) == 64  # 256 bits of hex
    assert parse_token(key.token) == (key.key_id, key.secret)
    assert secret_matches(key.secret, hash_secret(key.secret))
    assert not secret_matches(key.secret[:-1] + "0", hash_secret(key.secret + "x"))


def test_malformed_tokens() -> None:
    for token in ["", "dps_", "dps_nokey_abc", "Bearer x", "dps_key_123_abc"]:
        assert parse_token(token) is None


def test_scopes_imply_weaker_ones() -> None:
    owner = Principal("ten_x", "key_x", frozenset({Scope.OWNER}))
    reader = Principal("ten_x", "key_x", frozenset({Scope.READ}))
    assert owner.has(Scope.READ) and owner.has(Scope.SUBMIT) and not owner.has(Scope.ADMIN)
    assert reader.has(Scope.READ) and not reader.has(Scope.SUBMIT)


def test_query_credentials_are_spotted() -> None:
    assert looks_like_key_in_query({"api_key": "x"})
    assert looks_like_key_in_query({"Access_Token": "x"})
    assert looks_like_key_in_query({"q": "dps_key_abc_def"})
    assert not looks_like_key_in_query({"limit": "5", "cursor": "abc"})
