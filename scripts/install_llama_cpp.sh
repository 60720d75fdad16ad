#!/usr/bin/env bash
# Installs llama-cpp-python[server] (the real OpenAI-compatible server the implementer tests talk to).
# It builds from source (~6 min on 2 cores), so the wheel is cached outside the checkout and reused.
set -euo pipefail
py=${1:-python3}
cache=${KERNEL_AGENT_WHEEL_CACHE:-$HOME/.cache/kernel-agent/wheels}
"$py" -c "import llama_cpp.server" 2>/dev/null && exit 0
mkdir -p "$cache"
if ! ls "$cache"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python (one time, ~6 min; cached in $cache)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF" "$py" -m pip wheel -q --no-deps -w "$cache" "llama-cpp-python[server]"
fi
"$py" -m pip install -q "$(ls "$cache"/llama_cpp_python-*.whl | head -1)[server]"
