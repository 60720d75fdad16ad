"""`python -m services.implementer --host 127.0.0.1 --port 8002`."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from services.implementer.app import create_app
from services.implementer.config import Settings
from shared.serving import is_loopback

log = logging.getLogger("services.implementer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.implementer", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (non-loopback needs IMPLEMENTER_TOKEN)")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--log-level", default="info")
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
