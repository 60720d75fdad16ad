"""`kernel-agent serve implementer --host 127.0.0.1 --port 8002` (or `python -m services.implementer ...`)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from services.implementer.app import create_app
from services.implementer.config import Settings
from shared.serving import is_loopback

log = logging.getLogger("services.implementer")


def environment_help() -> str:
    """The settings' environment variables with their defaults, for --help."""
    lines = ["environment (settings):"]
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        names = [f"IMPLEMENTER_{name.upper()}"] if alias is None else [str(c) for c in getattr(alias, "choices", [])]
        default = "unset" if info.default is None else info.default
        lines.append(f"  {' or '.join(names)} (default: {default})")
        lines.append(f"      {info.description}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Serve the implementer: suggestion + kernel -> new kernel, from an OpenAI-compatible model.",
        epilog=environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address; non-loopback needs IMPLEMENTER_TOKEN (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=8002, help="(default: %(default)s)")
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"), help="(default: %(default)s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    if not is_loopback(args.host) and not settings.token:
        log.error("refusing to bind %s without a bearer token: set IMPLEMENTER_TOKEN", args.host)
        return 2
    try:
        app = create_app(settings)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
