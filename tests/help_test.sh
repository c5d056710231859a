#!/usr/bin/env bash
# Every binary's --help lists its own flags with their defaults (Abseil lists only the flags of
# a file named like the program unless told otherwise: model/util/help.h).
#   tests/help_test.sh BINARY FLAG [BINARY FLAG ...]   FLAG: one flag the binary must list
set -uo pipefail
status=0
while [ $# -ge 2 ]; do
  bin=$1 flag=$2
  shift 2
  out=$("$bin" --help 2>&1)
  name=$(basename "$bin")
  if grep -q "No flags matched" <<<"$out"; then
    echo "help_test: $name --help says \"No flags matched\""
    status=1
  elif ! grep -q -- "--$flag (" <<<"$out" || ! grep -q "default:" <<<"$out"; then
    echo "help_test: $name --help does not list --$flag with a default"
    status=1
  else
    echo "help_test: $name --help lists $(grep -c -- '^    --' <<<"$out") flags, --$flag among them"
  fi
done
exit $status
