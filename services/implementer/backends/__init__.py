"""Backends by name; adding one means one file here and one entry in BACKENDS."""

from __future__ import annotations

from collections.abc import Callable

from services.implementer.backends.base import ImplementerBackend
from services.implementer.backends.builtin import BuiltinBackend
from services.implementer.backends.openai_compat import OpenAICompatBackend
from services.implementer.config import Settings

BACKENDS: dict[str, Callable[[Settings], ImplementerBackend]] = {
    "openai": OpenAICompatBackend.from_settings,
    "builtin": BuiltinBackend.from_settings,
}


def build_backend(settings: Settings) -> ImplementerBackend:
    return BACKENDS[settings.backend](settings)


__all__ = ["BACKENDS", "ImplementerBackend", "build_backend"]
