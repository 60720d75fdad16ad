#!/usr/bin/env bash
# Build the CPU base image `kernel-agent-base:bookworm` from Debian packages alone (debootstrap + docker import),
# for machines that cannot pull from a registry. The root filesystem tarball is cached, so a second run only
# re-imports it. Needs root and debootstrap (apt-get install debootstrap).
#
# usage: docker/build_base_image.sh [IMAGE_TAG]
# env:   DEBIAN_MIRROR (default: the first URI in /etc/apt/sources.list*, else http://deb.debian.org/debian)
#        KERNEL_AGENT_CACHE (default: ~/.cache/kernel-agent), DOCKER (default: docker)
#        CA_BUNDLE (default: $PIP_CERT): PEM file appended to the image's trust store, for networks where a proxy
#        re-signs TLS (pip in the image builds must trust it too); unset on ordinary networks.
set -euo pipefail

IMAGE="${1:-kernel-agent-base:bookworm}"
SUITE=bookworm
DOCKER="${DOCKER:-docker}"
CACHE_DIR="${KERNEL_AGENT_CACHE:-$HOME/.cache/kernel-agent}/docker"
TARBALL="$CACHE_DIR/base-$SUITE-rootfs.tar"
# What every service image needs: python 3.11 with venv and headers (torch extension builds include Python.h),
# a C++ compiler for load_inline, and CA certificates for pip.
PACKAGES=python3,python3-dev,python3-venv,python3-pip,g++,ca-certificates

mirror_from_apt() {
    local uri
    uri=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -m1 -oE 'https?://[^ ]+/debian/?( |$)' | tr -d ' ' || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

if "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE already present"
    exit 0
fi

if [[ ! -s "$TARBALL" ]]; then
    command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 1; }
    MIRROR="${DEBIAN_MIRROR:-$(mirror_from_apt)}"
    mkdir -p "$CACHE_DIR"
    ROOTFS=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
    trap 'rm -rf "$ROOTFS"' EXIT
    echo "debootstrap $SUITE from $MIRROR into $ROOTFS"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"
    CA_BUNDLE="${CA_BUNDLE:-${PIP_CERT:-}}"
    if [[ -n "$CA_BUNDLE" ]]; then
        echo "adding the certificates of $CA_BUNDLE to the image's trust store"
        cat "$CA_BUNDLE" >> "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
    fi
    # Keep the image small: package lists and caches are not needed at run time.
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb
    chmod 0755 "$ROOTFS"  # mktemp made it 0700, and it becomes the image's /
    # Write to a temporary name first so an interrupted run never leaves a truncated tarball behind.
    tar -C "$ROOTFS" --numeric-owner -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
fi

"$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    "$TARBALL" "$IMAGE"
echo "imported $IMAGE"
