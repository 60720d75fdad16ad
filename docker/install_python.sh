#!/bin/sh
# Make sure the base image has python >= 3.11 with venv and headers, and a C++ compiler: the Debian base built by
# build_base_image.sh has them already; CUDA devel images (Ubuntu) get them from apt.
set -eu
if python3 -c 'import sys, ensurepip, sysconfig, os; assert sys.version_info >= (3, 11); assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null \
    && command -v g++ >/dev/null; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-dev python3-venv python3-pip g++ ca-certificates
rm -rf /var/lib/apt/lists/*
python3 -c 'import sys; assert sys.version_info >= (3, 11), f"python {sys.version} is too old: use a base image with python >= 3.11 (e.g. Ubuntu 24.04 or Debian 12)"'
