"""The API's bearer tokens and what each one may do.

Two tokens, both created at the first start in the state directory with mode 0600:

* ``token`` (admin): every route: submit, cancel, delete, read.
* ``metrics_token`` (read-only): ``GET /metrics`` and the pages under ``/ui``
  (:mod:`autotuner.daemon.pages`: read-only, in a browser as the HTTP Basic password). This is
  the one to give Prometheus and people who only look, so whoever holds a copy cannot submit
  SLAs.

Tokens are compared as bytes in constant time; a header that is not ASCII is malformed (401),
never an error of the server. A token file that is not printable ASCII stops the start
(:class:`TokenFileError`, exit 2): no header could ever match it.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from autotuner.core.errors import BadInput

Scope = Literal["admin", "metrics"]
ADMIN_FILE = "token"
METRICS_FILE = "metrics_token"
# What the read-only token may do: (method, path).
METRICS_ROUTES = frozenset({("GET", "/metrics"), ("HEAD", "/metrics")})
PAGES = "/ui"  # the pages' prefix: GET and HEAD under it are read-only too


def read_or_create(path: Path) -> str:
    """Read a token, creating it (mode 0600, never wider) on first start.

    An empty or too short file (a first start that died mid-write) gets a new token: an empty
    one would let ``Authorization: Bearer`` with nothing after it through.
    """
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    raw = path.read_bytes().strip()
    if raw and (not raw.isascii() or not _SHAPE.fullmatch(raw.decode("ascii"))):
        # It could never match a header (those are ASCII): refuse to start instead of
        # answering every request with an error.
        raise TokenFileError(
            f"{path}: the API token must be printable ASCII without spaces (letters, digits, "
            "punctuation); this file holds other bytes: write another token into it, or delete "
            "it and the daemon makes a new one at its next start"
        )
    token = raw.decode("ascii")
    if len(token) < 16:
        token = secrets.token_urlsafe(32)
        tmp = path.with_name(path.name + ".new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.replace(tmp, path)
    return token


_SHAPE = re.compile(r"[!-~]+")  # printable ASCII, no spaces


class TokenFileError(BadInput):
    """A token file holds something no request could ever present."""


class MalformedToken(BadInput, ValueError):
    """The header's token is not ASCII: no token of ours can match it."""


def scope_of(given: str, tokens: Mapping[Scope, str]) -> Scope | None:
    """Which token ``given`` is (None: none of them). Every token is compared, in constant
    time, so the timing says nothing about which one came close."""
    try:
        raw = given.encode("ascii")
    except UnicodeEncodeError:
        raise MalformedToken("the token must be ASCII") from None
    found: Scope | None = None
    for scope, token in tokens.items():
        if hmac.compare_digest(raw, token.encode("ascii")):
            found = scope
    return found


def allows(scope: Scope, method: str, path: str) -> bool:
    if scope == "admin" or (method, path) in METRICS_ROUTES:
        return True
    return method in ("GET", "HEAD") and (path == PAGES or path.startswith(PAGES + "/"))
