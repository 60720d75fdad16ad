"""`kernel-agent serve implementer --host 127.0.0.1 --port 8002` (or `python -m services.implementer ...`)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from services.implementer.app import create_app
from services.implementer.config import Settings
from shared.serving import environment_help, is_loopback

log = logging.getLogger("services.implementer")


def main(argv: list[str] | None = None, prog: str = "python -m services.implementer") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve the implementer: suggestion + kernel -> new kernel, from an OpenAI-compatible model.",
        epilog=environment_help(Settings),
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
