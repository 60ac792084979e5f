#!/bin/bash
# Makes the LUKS2 images with authenticated encryption of testdata/luks2-integrity/ with the
# kernel's own dm-crypt over dm-integrity (cryptsetup luksFormat --integrity, then writes
# through /dev/mapper/NAME). Runs as root inside a kernel guest of the project's VM harness
# (its default modules include authenc, gcm, chacha20poly1305, hmac, sha256, sha512), from
# the repository root:
#   tests/lab/run.sh testdata/luks2-integrity/make.sh OUTDIR
# Images are formatted on the guest's /dev/shm (cryptsetup's keyslot write fails on the
# shared directory) and copied to OUTDIR uncompressed; xz them on the host.
#
# Every image: passphrase "ucrypt-aead" (pass.txt), PBKDF2 with 1000 iterations (fast under
# TCG), a small header (16 KiB metadata, 512 KiB keyslots) so the image stays small. Its
# volume key comes from vk.bin (0x40, 0x41, ... ; the first VK_BYTES bytes) and is recorded
# as NAME.vk (hex, from luksDump --dump-volume-key).
#
# The pattern (as testdata/integrity's): the decrypted device's bytes at offset 16*i are the
# 16 ASCII bytes of printf '%015x\n' i.
set -eu
OUT=$1
mkdir -p "$OUT"
W=/dev/shm/luks2-integrity
rm -rf "$W"; mkdir -p "$W"

printf 'ucrypt-aead' > "$W/pass"
cp "$W/pass" "$OUT/pass.txt"
for ((i = 64; i < 64 + 128; i++)); do printf "\\$(printf '%03o' "$i")"; done > "$W/vk.bin"

pattern() {
  LC_ALL=C awk -v a="$1" -v n="$2" 'BEGIN { for (i = a; i < a + n; i++) printf "%015x\n", i }'
}

# make NAME SIZE_MIB LUKSFORMAT_ARGS...
make() {
  local name=$1 mib=$2; shift 2
  local img=$W/$name.img
  truncate -s "${mib}M" "$img"
  cryptsetup luksFormat -q --batch-mode --type luks2 --pbkdf pbkdf2 \
    --pbkdf-force-iterations 1000 --luks2-metadata-size 16k --luks2-keyslots-size 512k \
    --key-file "$W/pass" --volume-key-file "$W/vk.bin" "$@" "$img"
  cryptsetup open --key-file "$W/pass" "$img" "$name"
  dmsetup mknodes
  local dev=/dev/mapper/$name size
  size=$(blockdev --getsize64 "$dev")
  pattern 0 $((size / 16)) > "$W/plain"
  dd if="$W/plain" of="$dev" bs=64k oflag=direct conv=fsync status=none
  # Both lines as the kernel holds them (keys masked: NAME.vk has the volume key).
  {
    dmsetup table "${name}_dif" | sed 's/^/dif: /'
    dmsetup table "$name"
  } | sed -E 's/(internal_hash|journal_mac):([^: ]+):[0-9a-f]+/\1:\2:KEY/g' > "$OUT/$name.table"
  sha256sum < "$dev" | cut -d' ' -f1 > "$OUT/$name.sha256"
  echo "$size" > "$OUT/$name.size"
  cryptsetup status "$name" > "$OUT/$name.status"
  cryptsetup close "$name"
  cryptsetup luksDump "$img" > "$OUT/$name.dump"
  cryptsetup luksDump --dump-volume-key -q --key-file "$W/pass" "$img" |
    sed -n '/^MK dump:/,$p' | sed 's/^MK dump://' | tr -d ' \t\n' > "$OUT/$name.vk"
  echo >> "$OUT/$name.vk"
  cp --sparse=never "$img" "$OUT/$name.img"
  # The kernel reads its copy back: same bytes.
  cryptsetup open --key-file "$W/pass" "$img" "${name}-check"
  dmsetup mknodes
  local again
  again=$(sha256sum < "/dev/mapper/${name}-check" | cut -d' ' -f1)
  cryptsetup close "${name}-check"
  if [ "$again" != "$(cat "$OUT/$name.sha256")" ]; then
    echo "not ok - $name: the image reads back differently"; exit 1
  fi
  rm -f "$img"
  echo "ok - $name: $size bytes, sha256 $(cat "$OUT/$name.sha256")"
}

make hmac-sha256-xts-4096 4 --cipher aes-xts-plain64 --key-size 512 --integrity hmac-sha256 \
  --sector-size 4096
make hmac-sha512-xts-512 4 --cipher aes-xts-plain64 --key-size 256 --integrity hmac-sha512 \
  --sector-size 512
make aes-gcm-random-4096 4 --cipher aes-gcm-random --key-size 256 --integrity aead \
  --sector-size 4096
make chacha20-poly1305-4096 4 --cipher chacha20-random --key-size 256 --integrity poly1305 \
  --sector-size 4096
echo "all images made"
