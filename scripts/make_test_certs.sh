#!/usr/bin/env bash
# Certificates for TLS tests and for trying mutual TLS by hand:
#   scripts/make_test_certs.sh DIR [IP ...]
# writes into DIR:
#   ca.pem ca.key        a throwaway certificate authority (1 day)
#   node.pem node.key    signed by it, for servers and clients alike
#                        (serverAuth + clientAuth), valid for localhost,
#                        127.0.0.1 and every IP given
#   rogue.pem rogue.key  the same kind of certificate from another,
#                        untrusted authority (what a refused client holds)
# Needs openssl. Not for production: the keys are unencrypted.
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR [IP ...]}
shift
mkdir -p "$dir"
san="DNS:localhost,IP:127.0.0.1"
for ip in "$@"; do san="$san,IP:$ip"; done

make_ca() {  # name
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=rlmesh test $1" \
    -keyout "$dir/$1.key" -out "$dir/$1.pem" >/dev/null 2>&1
}
make_leaf() {  # name ca
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$dir/$1.key" -out "$dir/$1.csr" \
    >/dev/null 2>&1
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' "$san" \
    > "$dir/$1.ext"
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/$2.pem" -CAkey "$dir/$2.key" -CAcreateserial -days 1 \
    -extfile "$dir/$1.ext" -out "$dir/$1.pem" >/dev/null 2>&1
  rm -f "$dir/$1.csr" "$dir/$1.ext"
}
make_ca ca
make_leaf node ca
make_ca rogue-ca
make_leaf rogue rogue-ca
rm -f "$dir"/*.srl "$dir/rogue-ca.key"
chmod 600 "$dir"/*.key
echo "make_test_certs: wrote ca, node and rogue certificates to $dir ($san)"
