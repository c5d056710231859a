#!/bin/bash
# Fails if any of the given binaries loads LibTorch (libtorch*, libc10*): the clients and the
# load generator are built without it (client/CMakeLists.txt). ctest client_no_libtorch.
set -euo pipefail
status=0
for bin in "$@"; do
  if [ ! -x "$bin" ]; then
    echo "$bin: not built" >&2
    status=1
    continue
  fi
  if found=$(ldd "$bin" | grep -E 'lib(torch|c10)[^ ]*\.so'); then
    echo "$bin loads LibTorch:" >&2
    echo "$found" >&2
    status=1
  else
    echo "$bin: no LibTorch"
  fi
done
exit $status
