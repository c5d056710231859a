#!/bin/bash
# Protobuf stays at the edge of the server: under server/, only the krause.v1 front end (the
# handlers service.*, the request checks requests.*, the Generate stream generate_call.*), the
# Open Inference Protocol's gRPC front end (oip_service.*, oip_proto.*) and the
# conversion files (images.*, raw_image.*, model_info_proto.*, and status.cc for the google.rpc
# error details) may include a generated .pb.h.
# ctest server_proto_edge.
set -euo pipefail
cd "$(dirname "$0")/.."
allowed='^server/(service|requests|generate_call|oip_service|oip_proto|images|raw_image|model_info_proto|status)\.(h|cc)$'
bad=0
for f in $(grep -l '\.pb\.h"' server/*.h server/*.cc || true); do
  if [[ ! "$f" =~ $allowed ]]; then
    echo "$f includes a .pb.h (only the krause.v1 front end and the conversion files may):" >&2
    grep -n '\.pb\.h"' "$f" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "server/: protobuf only in the krause.v1 front end and the conversion files"
exit $bad
