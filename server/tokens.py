"""Device and enrolment tokens: made, stored as hashes, compared in constant time.

A token is ``secrets.token_urlsafe(32)``: 256 random bits.  The database keeps
only its SHA-256 (hex), so a copy of the database does not let anyone act as a
device.  A fast hash is enough here, unlike for passwords: a password is
guessable, so its hash must be slow (argon2) to make trying candidates costly,
but a 256-bit random token cannot be found by trying, however fast each try
is.  A fast, unsalted hash also lets the server find a device by its token's
hash with one indexed lookup.

The stored hash is compared with :func:`hmac.compare_digest` after the lookup,
so no comparison the server makes in Python leaks, by its timing, how much of
a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

TOKEN_BYTES = 32
MAX_TOKEN_LENGTH = 256  # a longer bearer value is refused before it is hashed


def new_token() -> str:
    """A fresh random token (43 URL-safe characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str) -> str:
    """The SHA-256 of ``token`` as 64 hex digits: what the database stores."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def hashes_match(stored: str, token: str) -> bool:
    """Whether ``token`` hashes to ``stored``, compared in constant time."""
    return hmac.compare_digest(stored.encode("ascii"), token_hash(token).encode("ascii"))
