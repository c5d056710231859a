#!/usr/bin/env bash
# Syntax-checks every C++ source of the build against LibTorch 2.x headers, so code written
# against Debian 12's LibTorch 1.13 does not use an API that 2.x (the GPU machines' PyTorch)
# removed. A developer's check, not part of .ci/run: it downloads Debian trixie's libtorch-dev
# (headers only, from Debian's archive) into a cache folder once.
#   scripts/check-torch2-headers.sh [BUILD_DIR [FILE_REGEX]]
# (default build, which needs compile_commands.json; FILE_REGEX picks files, e.g. 'model/engine')
# Each file is checked as the build compiles it (same flags, without the precompiled header, so
# a file that leans on the PCH for an include fails too); then scripts/check-cuda-compile.sh
# checks the files with KRAUSE_WITH_CUDA branches against the same headers.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ONLY=${2:-.}
CACHE=${TORCH2_CACHE:-$HOME/.cache/krause-torch2}
DEB_URL=${TORCH2_DEB_URL:-http://deb.debian.org/debian/pool/main/p/pytorch/libtorch-dev_2.6.0+dfsg-7_amd64.deb}
[ -f "$BUILD/compile_commands.json" ] || { echo "check-torch2-headers: no $BUILD/compile_commands.json (configure first)"; exit 1; }
if [ ! -f "$CACHE/root/usr/include/ATen/ATen.h" ]; then
  mkdir -p "$CACHE"
  echo "check-torch2-headers: fetching $(basename "$DEB_URL")"
  curl -fsSL -o "$CACHE/libtorch-dev.deb" "$DEB_URL"
  dpkg -x "$CACHE/libtorch-dev.deb" "$CACHE/root"
fi
INC=$CACHE/root/usr/include
version=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\) \([0-9]*\)/\2/p' "$INC/torch/csrc/api/include/torch/version.h" | paste -sd.)

python3 - "$BUILD/compile_commands.json" "$PWD" > "$CACHE/commands.txt" <<'EOF'
import json, shlex, sys
root = sys.argv[2] + "/"
for e in json.load(open(sys.argv[1])):
    f = e["file"]
    if not f.endswith((".cc", ".cpp")) or "/build" in f.replace(root, "/", 1) or "pch_anchor" in f:
        continue
    args = shlex.split(e["command"])
    out, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c", "-include", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-Winvalid-pch", "-MD", "-MMD") or a == f or a.startswith("-isystem/usr/include/torch"):
            continue
        out.append(a)
    print(f.replace(root, "", 1) + "\t" + e["directory"] + "\t" + shlex.join(out))
EOF
fail=0
n=0
while IFS=$'\t' read -r file dir flags; do
  [[ $file =~ $ONLY ]] || continue
  eval "set -- $flags"
  # The 1.13 API include folder is replaced by 2.x's; 2.x's include folders come first.
  args=()
  while [ $# -gt 0 ]; do
    if [ "$1" = -isystem ] && [ "${2:-}" = /usr/include/torch/csrc/api/include ]; then shift 2; continue; fi
    args+=("$1"); shift
  done
  n=$((n + 1))
  if ! (cd "$dir" && "${CXX:-c++}" -fsyntax-only -isystem "$INC/torch/csrc/api/include" -isystem "$INC" \
      "${args[@]}" "$OLDPWD/$file") > "$CACHE/last.log" 2>&1; then
    echo "check-torch2-headers: FAILED $file"
    grep -E "error" "$CACHE/last.log" | head -8
    fail=$((fail + 1))
  fi
done < "$CACHE/commands.txt"
echo "check-torch2-headers: $n file(s) against LibTorch $version headers, $fail failed"
cuda_rc=0
TORCH_INCLUDE=$INC scripts/check-cuda-compile.sh || cuda_rc=$?
[ $fail -eq 0 ] && { [ $cuda_rc -eq 0 ] || [ $cuda_rc -eq 77 ]; }
