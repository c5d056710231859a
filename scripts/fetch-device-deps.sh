#!/usr/bin/env bash
# Prepares the libraries model/ and its tests need on the GPU machine, which has PyTorch, nvcc,
# cmake and ninja but maybe not Abseil, GoogleTest, nlohmann-json or libpng, and no network:
# downloads Debian 12's packages (apt-get download, no install) and unpacks them into .devdeps/
# (ignored by git). Run here, before the device call, and name .devdeps in the call's carry;
# scripts/device-check.sh uses .devdeps/usr when the machine lacks a header.
#   scripts/fetch-device-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEVDEPS_DIR:-.devdeps}
PACKAGES=(libabsl-dev libabsl20220623 libgtest-dev libgmock-dev nlohmann-json3-dev libpng-dev
  libpng16-16 zlib1g-dev)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # apt-get download runs as _apt
(cd "$tmp" && apt-get download "${PACKAGES[@]}" > /dev/null) ||
  { apt-get update -qq && (cd "$tmp" && apt-get download "${PACKAGES[@]}" > /dev/null); }
rm -rf "$DEST"
mkdir -p "$DEST"
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$DEST"; done
# Only what a build reads: headers, libraries, CMake/pkg-config files.
rm -rf "$DEST/usr/src" "$DEST/usr/share/doc" "$DEST/usr/share/man" "$DEST/usr/share/lintian"
echo "fetch-device-deps: ${#PACKAGES[@]} packages into $DEST ($(du -sh "$DEST" | cut -f1))"
