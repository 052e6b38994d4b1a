#!/bin/sh
# Make the certificates of the etcd in etcd.yaml, elasticd's client certificate and the etcd
# passwords, with openssl.
#
#   packaging/k8s/gen-certs.sh DIR [NAMESPACE]     (default namespace: elasticd)
#
# Writes into DIR (created 0700; existing files are never overwritten):
#   ca.crt ca.key            a CA for this etcd cluster only (keep ca.key offline)
#   server.crt server.key    etcd members' serving certificate (clients -> etcd)
#   peer.crt peer.key        etcd members' peer certificate (etcd <-> etcd, both directions)
#   elasticd.crt elasticd.key  elasticd's client certificate: mutual TLS only, so its subject has
#                            no CN (with etcd auth on, etcd's JSON gateway, which elasticd speaks,
#                            refuses a certificate with a CN)
#   elasticd.password        the password of the etcd user "elasticd", elasticd's identity
#   root.password            the password of etcd's "root" user (for etcdctl; keep it offline)
# The server and peer certificates name every member (etcd-N.etcd.NAMESPACE.svc and
# .svc.cluster.local), the Service, localhost and 127.0.0.1. Then, as docs/kubernetes.md says:
#   kubectl -n elasticd create secret generic etcd-tls --from-file=DIR/ca.crt \
#       --from-file=DIR/server.crt --from-file=DIR/server.key --from-file=DIR/peer.crt --from-file=DIR/peer.key
#   kubectl -n elasticd create secret generic elasticd-etcd-client --from-file=DIR/ca.crt \
#       --from-file=tls.crt=DIR/elasticd.crt --from-file=tls.key=DIR/elasticd.key \
#       --from-file=password=DIR/elasticd.password
# Environment: DAYS (validity, default 825), MEMBERS (default 3), CLUSTER_DOMAIN (default cluster.local).
set -eu

usage() { sed -n '2,/^set -eu/{/^set -eu/d;s/^# \{0,1\}//;p}' "$0"; }
die() { printf 'gen-certs.sh: error: %s\n' "$*" >&2; exit 1; }

case ${1:-} in
    -h | --help) usage; exit 0 ;;
    '') usage >&2; exit 2 ;;
esac
DIR=$1
NS=${2:-elasticd}
DAYS=${DAYS:-825}
MEMBERS=${MEMBERS:-3}
DOMAIN=${CLUSTER_DOMAIN:-cluster.local}
command -v openssl >/dev/null 2>&1 || die "openssl not found"
case $NS in *[!a-z0-9-]* | '') die "not a namespace name: $NS" ;; esac
case $MEMBERS in *[!0-9]* | '' | 0) die "MEMBERS must be a positive number: $MEMBERS" ;; esac

umask 077
mkdir -p -- "$DIR"
for f in ca.crt ca.key server.crt server.key peer.crt peer.key elasticd.crt elasticd.key \
    elasticd.password root.password; do
    [ ! -e "$DIR/$f" ] || die "$DIR/$f exists; not overwriting (use an empty directory)"
done

sans="DNS:localhost,IP:127.0.0.1,DNS:etcd,DNS:etcd.$NS.svc,DNS:etcd.$NS.svc.$DOMAIN"
i=0
while [ "$i" -lt "$MEMBERS" ]; do
    sans="$sans,DNS:etcd-$i.etcd.$NS.svc,DNS:etcd-$i.etcd.$NS.svc.$DOMAIN"
    i=$((i + 1))
done

# key NAME: an EC P-256 private key (small, fast, supported by etcd and gRPC).
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$DIR/$1.key" 2>/dev/null; }

# sign NAME SUBJECT EXTENSIONS: a certificate for NAME.key signed by the CA.
sign() {
    key "$1"
    openssl req -new -key "$DIR/$1.key" -subj "$2" -out "$DIR/$1.csr"
    printf '%s\n' "$3" >"$DIR/$1.ext"
    openssl x509 -req -in "$DIR/$1.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" -CAcreateserial \
        -days "$DAYS" -sha256 -extfile "$DIR/$1.ext" -out "$DIR/$1.crt" 2>/dev/null
    rm -f -- "$DIR/$1.csr" "$DIR/$1.ext"
}

key ca
openssl req -x509 -new -key "$DIR/ca.key" -subj "/CN=elasticd etcd CA ($NS)" -days "$DAYS" -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$DIR/ca.crt"

leaf="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment"
sign server "/CN=etcd" "$leaf
extendedKeyUsage=serverAuth
subjectAltName=$sans"
# Members dial each other with this one too: it is a client and a server certificate.
sign peer "/CN=etcd-peer" "$leaf
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans"
sign elasticd "/O=elasticd" "$leaf
extendedKeyUsage=clientAuth"
rm -f -- "$DIR/ca.srl"
for user in elasticd root; do
    openssl rand -base64 24 >"$DIR/$user.password"
done

printf 'certificates and passwords for %s etcd members in namespace %s written to %s\n' "$MEMBERS" "$NS" "$DIR"
