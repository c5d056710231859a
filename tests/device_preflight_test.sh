#!/usr/bin/env bash
# ctest device_preflight (label build): scripts/device-preflight.sh in its CPU rehearsal mode on
# this machine passes and prints no architecture pin; an architecture list it must refuse (older
# than 7.5, or not a version) fails it, naming the entry; a good list is passed through as the
# export line device-check.sh evaluates.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
fails=0
check() {
  if eval "$2"; then echo "ok: $1"; else
    echo "FAILED: $1"
    fails=$((fails + 1))
  fi
}
out=$(CPU_REHEARSAL=1 TORCH_CUDA_ARCH_LIST= scripts/device-preflight.sh 2> /tmp/preflight.$$)
rc=$?
check "rehearsal passes" '[ $rc -eq 0 ] && grep -q "preflight: passed" /tmp/preflight.$$'
check "no arch list, no export line" '[ -z "$out" ]'
out=$(CPU_REHEARSAL=1 TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX" scripts/device-preflight.sh 2> /tmp/preflight.$$)
rc=$?
check "a good list is exported" '[ $rc -eq 0 ] && [ "$out" = "export TORCH_CUDA_ARCH_LIST='"'"'8.0;9.0+PTX'"'"'" ]'
CPU_REHEARSAL=1 TORCH_CUDA_ARCH_LIST="6.1;9.0" scripts/device-preflight.sh > /dev/null 2> /tmp/preflight.$$
rc=$?
check "6.1 refused by name" '[ $rc -eq 1 ] && grep -q "FAIL .*6.1 is older than 7.5" /tmp/preflight.$$ && grep -q "nothing built" /tmp/preflight.$$'
CPU_REHEARSAL=1 TORCH_CUDA_ARCH_LIST="sm90" scripts/device-preflight.sh > /dev/null 2> /tmp/preflight.$$
rc=$?
check "a malformed entry refused" '[ $rc -eq 1 ] && grep -q "sm90. is not an architecture" /tmp/preflight.$$'
rm -f /tmp/preflight.$$
[ $fails -eq 0 ]
