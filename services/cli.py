"""`kernel-agent`: one command for the services, the trainer and the evaluator's client.

    kernel-agent serve evaluator [--host H --port P]     (= python -m services.evaluator)
    kernel-agent serve implementer [--host H --port P]   (= python -m services.implementer)
    kernel-agent train --config configs/default.yaml ... (= python -m services.trainer)
    kernel-agent score | batch | problems ...            (= python -m services.evaluator.cli)

Each subcommand has its own --help with its defaults and the environment variables it reads. Each service's
modules are imported only when its subcommand runs, so `kernel-agent score` needs no torch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

CLIENT_COMMANDS = ("score", "batch", "problems")
USAGE = "usage: kernel-agent {serve evaluator|serve implementer|train|score|batch|problems} [--help]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    if command in CLIENT_COMMANDS:
        from services.evaluator.cli import main as client_main

        return client_main(args)
    if command == "train":
        from services.trainer.__main__ import main as train_main

        return train_main(args[1:])
    if command == "serve" and len(args) > 1 and args[1] in ("evaluator", "implementer"):
        prog = f"kernel-agent serve {args[1]}"
        if args[1] == "evaluator":
            from services.evaluator.__main__ import main as evaluator_main

            evaluator_main(args[2:], prog)
            return 0
        from services.implementer.__main__ import main as implementer_main

        return implementer_main(args[2:], prog)
    if command in ("-h", "--help"):
        sys.stdout.write(f"{USAGE}\n\n{__doc__}")
        return 0
    sys.stderr.write(f"{USAGE}\nkernel-agent: error: unknown command {' '.join(args[:2])!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
