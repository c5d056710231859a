#!/bin/bash
# Protobuf stays at the edge of the server: under server/, only the krause.v1 front end
# (server/v1/), the Open Inference Protocol's gRPC front end (oip/oip_service.*, oip/oip_proto.*),
# the status mapping (edge/status.cc) and the errors' google.rpc details (core/errors.cc, inside
# its .cc only) may include a generated .pb.h. ctest server_proto_edge.
set -euo pipefail
cd "$(dirname "$0")/.."
allowed='^server/(v1/[a-z_]+|oip/oip_service|oip/oip_proto|edge/status|core/errors)\.(h|cc)$'
bad=0
for f in $(grep -l '\.pb\.h"' server/*.h server/*.cc server/*/*.h server/*/*.cc || true); do
  if [[ ! "$f" =~ $allowed ]] || [[ "$f" == server/core/errors.h ]]; then
    echo "$f includes a .pb.h (only the front ends' wire code and the conversion files may):" >&2
    grep -n '\.pb\.h"' "$f" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "server/: protobuf only in the front ends' wire code and the conversion files"
exit $bad
