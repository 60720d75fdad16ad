"""`kernel-agent serve evaluator --host 127.0.0.1 --port 8001` (or `python -m services.evaluator ...`)."""

from __future__ import annotations

import argparse
import ctypes
import logging
import sys

from services.evaluator.config import Settings
from shared.serving import environment_help, is_loopback

PR_SET_DUMPABLE = 4


def main(argv: list[str] | None = None, prog: str = "python -m services.evaluator") -> None:
    settings = Settings()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve the evaluator: compile, check and time candidate kernels in sandboxed workers.",
        epilog=environment_help(Settings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--host", default=settings.host, help="bind address; non-loopback needs EVALUATOR_TOKEN (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=settings.port, help="(default: %(default)s)")
    parser.add_argument(
        "--workers", type=int, default=settings.workers, help="evaluations run at once (default: %(default)s)"
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"), help="(default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if not is_loopback(args.host) and settings.token_value is None:
        sys.exit(f"refusing to bind {args.host}: set EVALUATOR_TOKEN to serve beyond loopback")
    settings = settings.model_copy(update={"host": args.host, "port": args.port, "workers": args.workers})
    # Not dumpable: /proc/<service>/environ (the token) and ptrace are then root's alone, also for a candidate that
    # runs under the service's own uid (`process` isolation).
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # Imported only now: refusing a bad bind should not wait for torch to load.
    import uvicorn

    from services.evaluator.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # asyncio's own loop, never uvloop (which uvicorn picks when it is installed): uvloop's connect_read_pipe, which
    # reads each worker's events, closes the pipe's descriptor twice (MagicStack/uvloop#763), and the second close
    # hits whatever the service opened with that number meanwhile in another thread. On the GPU machine, whose image
    # has uvloop, evaluations ended evaluator_error with EBADF in write_bytes and ENOTDIR from scandir("/proc").
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level, loop="asyncio")


if __name__ == "__main__":
    main()
