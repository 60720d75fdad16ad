#!/bin/sh
# Trainer container entry point: the command line comes from the environment (compose files set it), and any
# arguments given to the container (`docker compose run trainer --updates 1`) are appended; the last value wins.
set -eu
set -- --config "${TRAINER_CONFIG:-configs/default.yaml}" \
    --evaluator-url "${EVALUATOR_URL:-http://evaluator:8001}" \
    --implementer-url "${IMPLEMENTER_URL:-http://implementer:8002}" \
    --output-dir "${TRAINER_OUTPUT_DIR:-/outputs/run-$(date -u +%Y%m%d-%H%M%S)}" \
    ${TRAINER_UPDATES:+--updates "$TRAINER_UPDATES"} ${TRAINER_ARGS:-} "$@"
echo "python -m services.trainer $*"
exec python -m services.trainer "$@"
