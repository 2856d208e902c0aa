#!/usr/bin/env bash
# Makes a throwaway CA and, signed by it, a server certificate for 127.0.0.1/localhost (which
# replica-set members also show each other as clients) and a
# client certificate, in the directory given: ca.pem (the CA certificate), server.pem and
# client.pem (each certificate and key; the client's subject is
# "CN=ann,OU=clients,O=shoal", an X.509 user's name).
# The Rust, Python and mongosh TLS tests all call this, each with a directory of its own.
set -euo pipefail
dir="$1"
mkdir -p "$dir"
cd "$dir"
# P-256 keys: quick to make, and rustls and every driver take them.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj "/CN=shoal test CA" -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.crt 2>/dev/null
cat server.crt server.key > server.pem
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj "/O=shoal/OU=clients/CN=ann" -keyout client.key -out client.csr 2>/dev/null
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile client.ext -out client.crt 2>/dev/null
cat client.crt client.key > client.pem
rm -f server.csr server.ext client.csr client.ext ca.srl
