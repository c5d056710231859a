#!/bin/sh
# Writes a throw-away CA, a server certificate for localhost/127.0.0.1 and a client certificate
# (all signed by the CA, valid 2 days) into the folder $1. Used by the TLS tests.
set -eu
d="$1"
cd "$d"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -days 2 -subj /CN=krause-test-ca -out ca.pem
key server.key
openssl req -new -key server.key -subj /CN=localhost -out server.csr
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.pem 2>/dev/null
key client.key
openssl req -new -key client.key -subj /CN=krause-test-client -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -out client.pem 2>/dev/null
