"""CLI: python -m services.trainer --config configs/default.yaml --evaluator-url URL --implementer-url URL [...]"""

from __future__ import annotations

import logging
import sys

from services.trainer.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config, args = load_config(argv)
        config.require_services()
    except ConfigError as exc:
        logging.getLogger("services.trainer").error("%s", exc)
        return 2
    from services.trainer.grpo import train  # heavy imports (torch, transformers) after the config is valid

    try:
        train(config, resume=args.resume)
    except ConfigError as exc:
        logging.getLogger("services.trainer").error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
