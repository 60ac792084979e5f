#!/bin/bash
# Makes the loop-AES golden images with the real kernel: cryptsetup 2.6.1's loopaesOpen maps
# each image through dm-crypt (Debian's 6.12 kernel, in the guest of tests/lab/run.sh),
# records the table it loaded (dmsetup table --showkeys) and writes plain.bin through the
# mapping.
#   tests/lab/run.sh testdata/loopaes/make-images.sh "$PWD/testdata/loopaes"   (from the repo root)
set -euo pipefail
cd "${1:-$(dirname "$0")}"
modprobe twofish_generic 2>/dev/null || modprobe twofish || true
: > cases.txt
n=0
while read -r key args; do
  [ -z "$key" ] && continue
  n=$((n + 1))
  img="img.$n"
  rm -f "$img"; truncate -s 192K "$img"
  # shellcheck disable=SC2086  # $args splits into options on purpose
  rc=0
  cryptsetup loopaesOpen --key-file "$key" $args "$img" lae 2>/dev/null || rc=$?
  if [ "$rc" != 0 ]; then
    echo "$n|$key|$args|REFUSED rc=$rc" >> cases.txt
    rm -f "$img"
    continue
  fi
  dmsetup mknodes
  table=$(dmsetup table --showkeys lae)
  dd if=plain.bin of=/dev/mapper/lae bs=4096 oflag=direct conv=fsync status=none
  cryptsetup close lae
  echo "$n|$key|$args|$table" | sed 's/ [0-9]*:[0-9]* / DEV /' >> cases.txt
done <<'CASES'
key_v1
key_v2
key_v3
key_v3 --key-size 128
key_v1 --key-size 192 --offset 8 --skip 16
key_v2 --hash sha1 --key-size 128 --offset 16
key_v3 --cipher twofish
key_v2_crlf --skip 100
key_v3 --keyfile-size 2624
key_v2 --hash sha1
key_v2 --keyfile-offset 41 --keyfile-size 2583
key_v2 --hash ripemd160 --key-size 128 --keyfile-offset 0
CASES
cat cases.txt
