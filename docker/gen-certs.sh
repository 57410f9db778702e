#!/usr/bin/env bash
# Generate the TLS certificates and SuperNode keys of an mmfl-flwr deployment.
#
#   docker/gen-certs.sh [-o DIR] [-n N] [-H HOST]... [-k NAME]... [-d DAYS] [-f]
#
#   -o DIR   output folder (default: ./certs)
#   -n N     create SuperNode key pairs supernode-0 ... supernode-(N-1) (default: 3)
#   -H HOST  a hostname or IP address the SuperNodes and the flwr CLI use to reach
#            the SuperLink; repeat for several. Always included: localhost,
#            127.0.0.1, ::1 and "superlink" (the compose service name).
#   -k NAME  also create the key pair NAME / NAME.pub (repeat for several)
#   -d DAYS  validity of the certificates (default: 365)
#   -f       overwrite files that already exist (default: keep them, so the
#            script can be re-run to add keys without replacing the CA)
#
# Output (DIR/):
#   ca.crt, ca.key             a private certificate authority (keep ca.key offline)
#   server.pem, server.key     the SuperLink's TLS certificate (signed by the CA,
#                              subjectAltName = the hosts above) and its key
#   supernode-<i>, -<i>.pub    one EC P-384 key pair per SuperNode, OpenSSH format:
#                              the private key stays on the device
#                              (flower-supernode --auth-supernode-private-key),
#                              the .pub file is registered on the SuperLink
#                              (flwr supernode register)
#
# Needs openssl (1.1.1 or newer) and ssh-keygen (OpenSSH).
# The certificates satisfy Python's strict X.509 checks (Python >= 3.13 default).
set -euo pipefail

out="certs"
num=3
days=365
force=0
hosts=()
names=()

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while getopts ":o:n:H:k:d:fh" opt; do
  case "$opt" in
    o) out="$OPTARG" ;;
    n) num="$OPTARG" ;;
    H) hosts+=("$OPTARG") ;;
    k) names+=("$OPTARG") ;;
    d) days="$OPTARG" ;;
    f) force=1 ;;
    h) usage 0 ;;
    :) echo "gen-certs.sh: -$OPTARG needs a value" >&2; usage 2 ;;
    *) echo "gen-certs.sh: unknown option -$OPTARG" >&2; usage 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || { echo "gen-certs.sh: unexpected argument '$1'" >&2; usage 2; }
case "$num" in ''|*[!0-9]*) echo "gen-certs.sh: -n needs a number" >&2; exit 2 ;; esac
case "$days" in ''|*[!0-9]*) echo "gen-certs.sh: -d needs a number" >&2; exit 2 ;; esac

key_names=()
for ((i = 0; i < num; i++)); do key_names+=("supernode-$i"); done
key_names+=("${names[@]+"${names[@]}"}")
for name in "${key_names[@]+"${key_names[@]}"}"; do
  case "$name" in ''|*/*|.*) echo "gen-certs.sh: bad key name '$name'" >&2; exit 2 ;; esac
done

for tool in openssl ssh-keygen; do
  command -v "$tool" >/dev/null 2>&1 || { echo "gen-certs.sh: $tool not found" >&2; exit 1; }
done

mkdir -p "$out"
umask 077  # private keys readable by their owner only

new_ca=0
exists() { [ "$force" -eq 0 ] && [ -e "$1" ]; }

# ------------------------------------------------------------------ the CA
if exists "$out/ca.crt" && exists "$out/ca.key"; then
  echo "keeping   $out/ca.crt (use -f to replace)"
else
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -nodes \
    -sha384 -days "$days" -subj "/O=mmfl-flwr/CN=mmfl-flwr deployment CA" \
    -keyout "$out/ca.key" -out "$out/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" 2>/dev/null
  chmod 644 "$out/ca.crt"
  echo "created   $out/ca.crt, $out/ca.key"
  new_ca=1  # a new CA invalidates the old server certificate
fi

# ------------------------------------------------ the SuperLink certificate
san="DNS:localhost,DNS:superlink,IP:127.0.0.1,IP:::1"
for h in "${hosts[@]+"${hosts[@]}"}"; do
  if [[ "$h" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || "$h" == *:* ]]; then
    entry="IP:$h"
  else
    entry="DNS:$h"
  fi
  case ",$san," in *",$entry,"*) ;; *) san="$san,$entry" ;; esac
done

if [ "$new_ca" -eq 0 ] && exists "$out/server.pem" && exists "$out/server.key"; then
  echo "keeping   $out/server.pem (use -f to replace; its names: $(
    openssl x509 -in "$out/server.pem" -noout -ext subjectAltName 2>/dev/null \
      | tail -n +2 | tr -d ' '))"
  if [ "${#hosts[@]}" -gt 0 ]; then
    echo "warning: -H is ignored for the kept server.pem; to change its names, delete" \
      "$out/server.pem and $out/server.key and run this script again" >&2
  fi
else
  ext="$(mktemp)"
  csr="$(mktemp)"
  trap 'rm -f "$ext" "$csr"' EXIT
  cat >"$ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyAgreement
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
subjectAltName=$san
EOF
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/O=mmfl-flwr/CN=superlink" -keyout "$out/server.key" -out "$csr" 2>/dev/null
  openssl x509 -req -in "$csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -CAserial "$out/ca.srl" -sha256 -days "$days" \
    -extfile "$ext" -out "$out/server.pem" 2>/dev/null
  chmod 644 "$out/server.pem"
  echo "created   $out/server.pem, $out/server.key for $san"
fi

# ------------------------------------------------------- the SuperNode keys
for name in "${key_names[@]+"${key_names[@]}"}"; do
  key="$out/$name"
  if exists "$key" && exists "$key.pub"; then
    echo "keeping   $key"
    continue
  fi
  rm -f "$key" "$key.pub"
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "mmfl-flwr $name" -f "$key"
  chmod 644 "$key.pub"
  echo "created   $key, $key.pub"
done
