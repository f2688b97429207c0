"""Opaque, authenticated reasoning tokens for Responses `encrypted_content` (docs/serving.md,
"Reasoning round-trip").

A Responses client that keeps no server state (store false, no previous_response_id; Codex CLI
works this way) asks for `include: ["reasoning.encrypted_content"]`; each reasoning output Item
then carries `encrypted_content`, a token that ninfer accepts back in a later turn's input and
turns into the reasoning text the chat template renders.

Token: ``"nrs1." + base64url(nonce[16] || ciphertext || tag[32])`` (no padding).

- Encryption: a keystream of HMAC-SHA256(k_enc, nonce || counter) blocks XORed with the UTF-8
  reasoning text (a PRF in counter mode: only the standard library is needed; no AES package is
  installed). Encrypt-then-MAC.
- Authentication: tag = HMAC-SHA256(k_mac, "nrs1" || len(model) || model || nonce ||
  ciphertext). A token made under another key, for another served model id, of another
  version, or changed in any byte fails as a whole.
- Keys: k_enc and k_mac are derived from one master key (HMAC-SHA256(master, label)). The master
  key is random per process unless `--reasoning-key-file FILE` (or the environment variable
  NINFER_REASONING_KEY_FILE) names a file of at least 32 bytes; with a file, tokens survive a
  restart and are accepted by every server that shares it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from ninfer.api.wire.errors import ApiError
from ninfer.errors import ConfigError

VERSION = b"nrs1"
PREFIX = VERSION.decode() + "."
KEY_ENV = "NINFER_REASONING_KEY_FILE"
MIN_KEY_BYTES = 32
_NONCE = 16
_TAG = 32


def load_key(path: str, flag: str = "--reasoning-key-file") -> bytes:
    """The master key in the file `path` (its bytes, a trailing newline removed). Raises
    ConfigError naming `flag` when the file cannot be read or holds fewer than 32 bytes."""
    try:
        key = Path(path).read_bytes().rstrip(b"\r\n")
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read the key file ({e.strerror})") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"{flag} {path}: the key must be at least {MIN_KEY_BYTES} bytes, the file holds "
            f"{len(key)} (e.g. `head -c 32 /dev/urandom > {path}`)"
        )
    return key


def configured_key(key_file: str | None) -> bytes:
    """The master key of the server: `key_file`, else the file named by NINFER_REASONING_KEY_FILE,
    else a fresh random key for this process."""
    if key_file is not None:
        return load_key(key_file)
    env = os.environ.get(KEY_ENV)
    if env:
        return load_key(env, flag=KEY_ENV)
    return secrets.token_bytes(MIN_KEY_BYTES)


class ReasoningSeal:
    """Seals reasoning text into tokens and opens them again, for one master key and one
    served model id (see the module docstring)."""

    def __init__(self, key: bytes, model_id: str) -> None:
        self._enc = hmac.new(key, b"ninfer reasoning encryption", hashlib.sha256).digest()
        self._mac = hmac.new(key, b"ninfer reasoning authentication", hashlib.sha256).digest()
        model = model_id.encode()
        self._header = VERSION + len(model).to_bytes(4, "big") + model

    def _keystream_xor(self, nonce: bytes, data: bytes) -> bytes:
        out = bytearray(len(data))
        for block in range(0, len(data), 32):
            pad = hmac.new(
                self._enc, nonce + (block // 32).to_bytes(8, "big"), hashlib.sha256
            ).digest()
            chunk = data[block : block + 32]
            out[block : block + len(chunk)] = bytes(a ^ b for a, b in zip(chunk, pad, strict=False))
        return bytes(out)

    def _tag(self, nonce: bytes, ciphertext: bytes) -> bytes:
        return hmac.new(self._mac, self._header + nonce + ciphertext, hashlib.sha256).digest()

    def seal(self, text: str) -> str:
        """The token of `text` (a fresh nonce each call)."""
        nonce = secrets.token_bytes(_NONCE)
        ciphertext = self._keystream_xor(nonce, text.encode("utf-8"))
        raw = nonce + ciphertext + self._tag(nonce, ciphertext)
        return PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def open(self, token: str, param: str) -> str:
        """The reasoning text sealed in `token`. Raises ApiError 400 `invalid_encrypted_content`
        naming `param` for a malformed, tampered or foreign token (one message for all: which
        check failed tells an attacker nothing useful)."""
        if not token.startswith(PREFIX):
            raise _invalid(param)
        body = token[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise _invalid(param) from None
        if len(raw) < _NONCE + _TAG:
            raise _invalid(param)
        nonce, ciphertext, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(nonce, ciphertext)):
            raise _invalid(param)
        try:
            return self._keystream_xor(nonce, ciphertext).decode("utf-8")
        except UnicodeDecodeError:  # authentic but not ours: cannot happen without the key
            raise _invalid(param) from None


def _invalid(param: str) -> ApiError:
    return ApiError(
        400,
        "encrypted_content is not a reasoning token issued by this server for this model "
        "(it was changed, made under another --reasoning-key-file, or by another server)",
        code="invalid_encrypted_content",
        param=param,
    )
