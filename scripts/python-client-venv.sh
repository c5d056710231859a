#!/usr/bin/env bash
# A virtual environment with the Python client (client/python) installed offline from this
# checkout: it sees Debian's python3-grpcio, -protobuf, -numpy and -pil, and the package's gRPC
# modules are generated from proto/ as it is built (from a copy: the checkout gains no build/).
#   scripts/python-client-venv.sh DIR     then DIR/bin/python has `import krause_serve`
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: python-client-venv.sh DIR}
copy=$(mktemp -d /tmp/krause-python-package.XXXXXX)
trap 'rm -rf "$copy"' EXIT
cp -r "$src/client/python/." "$copy"
/usr/bin/python3 -m venv --system-site-packages "$venv"
KRAUSE_PROTO_DIR="$src/proto" "$venv/bin/pip" install --quiet --no-index --no-build-isolation \
  "$copy"
