"""Server-side pieces both HTTP services share: the loopback rule for binding and the bearer-token check."""

from __future__ import annotations

import hmac
import ipaddress

from fastapi import HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a service on this machine (a token is required otherwise)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bearer(expected: str | None, credentials: HTTPAuthorizationCredentials | None) -> None:
    """Raise 401 unless `expected` is None (no token configured) or the request carries exactly that token."""
    if expected is None:
        return
    given = credentials.credentials if credentials else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
