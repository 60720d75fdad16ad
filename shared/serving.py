"""Server-side pieces both HTTP services share: the loopback rule for binding, the bearer-token check, the 422
answer and the environment section of --help."""

from __future__ import annotations

import hmac
import ipaddress
import math
from typing import Any

from fastapi import HTTPException, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a service on this machine (a token is required otherwise)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def environment_help(settings: type[BaseSettings]) -> str:
    """The environment variables `settings` reads, with defaults and descriptions: the epilog of a service's --help."""
    prefix = str(settings.model_config.get("env_prefix", "")).upper()
    lines = ["environment (settings):"]
    for name, info in settings.model_fields.items():
        alias = info.validation_alias
        names = [f"{prefix}{name.upper()}"] if alias is None else [str(c) for c in getattr(alias, "choices", [alias])]
        if info.default_factory is not None:
            default = "computed at start"
        else:
            default = "unset" if info.default in (None, PydanticUndefined) else info.default
        lines.append(f"  {' or '.join(names)} (default: {default})")
        if info.description:
            lines.append(f"      {info.description}")
    return "\n".join(lines)


def check_bearer(expected: str | None, credentials: HTTPAuthorizationCredentials | None) -> None:
    """Raise 401 unless `expected` is None (no token configured) or the request carries exactly that token."""
    if expected is None:
        return
    given = credentials.credentials if credentials else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
        )


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as text: JSON has no such numbers, and a 422 echoes what was sent."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 listing the fields, also for a body carrying NaN or Infinity (which the default handler cannot encode)."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": _finite(jsonable_encoder(exc.errors()))}, 422)
