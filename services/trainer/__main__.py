"""CLI: kernel-agent train --config configs/default.yaml --evaluator-url URL --implementer-url URL [...]

Also `python -m services.trainer ...`. A bad config or flag is one error line and exit status 2.
"""

from __future__ import annotations

import logging
import sys

from services.trainer.config import ConfigError, load_config, token_hint

log = logging.getLogger("services.trainer")


def configure_logging(level: str) -> None:
    """Plain lines at `level`; httpx's line per request only at DEBUG."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    if level != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    configure_logging("INFO")
    try:
        config, args = load_config(argv)
        config.require_services()
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    configure_logging(args.log_level)
    from services.trainer.episodes import FatalServiceError, ServicesUnavailable
    from services.trainer.grpo import NothingLearned, train  # heavy imports (torch, transformers) after the config

    try:
        train(config, resume=args.resume)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except FatalServiceError as exc:
        log.error("%s; %s", exc, token_hint(config))
        return 1
    except (ServicesUnavailable, NothingLearned) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
