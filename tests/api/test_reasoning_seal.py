"""Reasoning tokens (Responses `encrypted_content`): sealing, opening, and their use in input
Items. The end-to-end round trip through the real server is in
tests/e2e/test_reasoning_roundtrip_e2e.py."""

from __future__ import annotations

import argparse
import base64

import pytest

from ninfer.api.responses.items import parse_input
from ninfer.api.responses.reasoning_seal import PREFIX, ReasoningSeal, configured_key, load_key
from ninfer.api.wire.errors import ApiError
from ninfer.commands import serve
from ninfer.errors import ConfigError

KEY = b"k" * 32
TEXT = "The user wants a 3 day forecast for Paris. Ünïcödé ✓ " * 5


def test_round_trip_hides_the_text_and_uses_a_fresh_nonce():
    seal = ReasoningSeal(KEY, "tiny-agent")
    a, b = seal.seal(TEXT), seal.seal(TEXT)
    assert a.startswith(PREFIX) and a != b
    assert "Paris" not in base64.urlsafe_b64decode(a[len(PREFIX) :] + "==").decode("latin-1")
    assert seal.open(a, "p") == seal.open(b, "p") == TEXT
    assert seal.open(seal.seal(""), "p") == ""


def test_same_key_file_opens_across_instances(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(KEY + b"\n")
    token = ReasoningSeal(load_key(str(path)), "m").seal(TEXT)
    assert ReasoningSeal(configured_key(str(path)), "m").open(token, "p") == TEXT


def flip(token: str, index: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(token[len(PREFIX) :] + "=="))
    raw[index] ^= 1
    return PREFIX + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "make",
    [
        lambda t: flip(t, 0),  # nonce
        lambda t: flip(t, 20),  # ciphertext
        lambda t: flip(t, -1),  # tag
        lambda t: t[:-4],  # truncated
        lambda t: "nrs2." + t[len(PREFIX) :],  # another version
        lambda t: t + "!",  # not base64
        lambda t: "abc",
        lambda t: ReasoningSeal(b"x" * 32, "m").seal(TEXT),  # another key
        lambda t: ReasoningSeal(KEY, "other-model").seal(TEXT),  # another served model
    ],
)
def test_tampered_or_foreign_tokens_fail_naming_the_field(make):
    seal = ReasoningSeal(KEY, "m")
    with pytest.raises(ApiError) as e:
        seal.open(make(seal.seal(TEXT)), "input[3].encrypted_content")
    assert e.value.status == 400
    assert e.value.code == "invalid_encrypted_content"
    assert e.value.param == "input[3].encrypted_content"


def test_key_file_errors_name_the_flag(tmp_path, monkeypatch):
    short = tmp_path / "short"
    short.write_bytes(b"x" * 31)
    with pytest.raises(ConfigError, match="--reasoning-key-file .*at least 32 bytes"):
        load_key(str(short))
    with pytest.raises(ConfigError, match="--reasoning-key-file .*cannot read"):
        load_key(str(tmp_path / "missing"))
    monkeypatch.setenv("NINFER_REASONING_KEY_FILE", str(short))
    with pytest.raises(ConfigError, match="NINFER_REASONING_KEY_FILE"):
        configured_key(None)


def test_default_key_is_random_per_seal(monkeypatch):
    monkeypatch.delenv("NINFER_REASONING_KEY_FILE", raising=False)
    token = ReasoningSeal(configured_key(None), "m").seal(TEXT)
    with pytest.raises(ApiError):
        ReasoningSeal(configured_key(None), "m").open(token, "p")


# -- input Items --------------------------------------------------------------------------------


def reasoning(**kw) -> dict:
    return {"type": "reasoning", "summary": [], **kw}


def test_token_restores_reasoning_content():
    seal = ReasoningSeal(KEY, "m")
    token = seal.seal(TEXT)
    user = {"role": "user", "content": "q"}
    (_, item) = parse_input(
        [user, reasoning(encrypted_content=token)], "input", vision=False, seal=seal
    )
    assert item["content"] == [{"type": "reasoning_text", "text": TEXT}]
    assert item["encrypted_content"] == token
    # raw content that agrees with the token is accepted as it is
    same = reasoning(encrypted_content=token, content=[{"type": "reasoning_text", "text": TEXT}])
    (item2,) = parse_input([same], "input", vision=False, seal=seal)
    assert item2["content"] == item["content"]


def test_token_errors_in_input_name_the_item():
    seal = ReasoningSeal(KEY, "m")
    user = {"role": "user", "content": "q"}
    with pytest.raises(ApiError) as e:
        parse_input(
            [user, reasoning(encrypted_content=flip(seal.seal(TEXT), 20))],
            "input",
            vision=False,
            seal=seal,
        )
    assert (e.value.code, e.value.param) == (
        "invalid_encrypted_content",
        "input[1].encrypted_content",
    )
    edited = reasoning(
        encrypted_content=seal.seal(TEXT), content=[{"type": "reasoning_text", "text": "edited"}]
    )
    with pytest.raises(ApiError) as e:
        parse_input([edited], "input", vision=False, seal=seal)
    assert (e.value.code, e.value.param) == ("invalid_value", "input[0].encrypted_content")


def test_serve_checks_the_key_file_at_startup(tmp_path, monkeypatch):
    monkeypatch.delenv("NINFER_REASONING_KEY_FILE", raising=False)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)

    def check(*argv: str) -> None:
        config = serve.config_from_args(parser.parse_args(argv), cuda_available=False)
        serve.check_files(config, tmp_path / "m.ninfer")

    check()  # no key file: a random key, nothing to check
    with pytest.raises(ConfigError, match="--reasoning-key-file .*cannot read"):
        check("--reasoning-key-file", str(tmp_path / "missing"))
    good = tmp_path / "key"
    good.write_bytes(KEY)
    check("--reasoning-key-file", str(good))
    monkeypatch.setenv("NINFER_REASONING_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="NINFER_REASONING_KEY_FILE .*cannot read"):
        check()
