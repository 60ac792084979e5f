#!/bin/bash
# Makes the LUKS2 images with authenticated encryption of testdata/luks2-integrity/ with the
# kernel's own dm-crypt over dm-integrity (cryptsetup luksFormat --integrity, then writes
# through /dev/mapper/NAME). Runs as root inside a kernel guest of the project's VM harness
# (its default modules include authenc, gcm, chacha20poly1305, hmac, sha256, sha512), from
# the repository root:
#   tests/lab/run.sh testdata/luks2-integrity/make.sh OUTDIR [NAME...]
# With NAMEs, only those images are made.
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
shift
ONLY=" $* "
mkdir -p "$OUT"
W=/dev/shm/luks2-integrity
rm -rf "$W"; mkdir -p "$W"

printf 'ucrypt-aead' > "$W/pass"
cp "$W/pass" "$OUT/pass.txt"
for ((i = 64; i < 64 + 128; i++)); do printf "\\$(printf '%03o' "$i")"; done > "$W/vk.bin"

# pattern FIRST COUNT [PREFIX]: lines FIRST.. ; with PREFIX "j", 'j%014x' (the second pattern).
pattern() {
  if [ "${3:-}" = j ]; then
    LC_ALL=C awk -v a="$1" -v n="$2" 'BEGIN { for (i = a; i < a + n; i++) printf "j%014x\n", i }'
  else
    LC_ALL=C awk -v a="$1" -v n="$2" 'BEGIN { for (i = a; i < a + n; i++) printf "%015x\n", i }'
  fi
}

wanted() { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]]; }

# make NAME SIZE_MIB LUKSFORMAT_ARGS...
make() {
  local name=$1 mib=$2; shift 2
  wanted "$name" || return 0
  local unflushed=0
  [[ "$name" == *-Junflushed ]] && unflushed=1
  local img=$W/$name.img
  truncate -s "${mib}M" "$img"
  local nowipe=()
  [ "$unflushed" = 1 ] && nowipe=(--integrity-no-wipe) # the whole device is written below
  cryptsetup luksFormat -q --batch-mode --type luks2 --pbkdf pbkdf2 \
    --pbkdf-force-iterations 1000 --luks2-metadata-size 16k --luks2-keyslots-size 512k \
    --key-file "$W/pass" --volume-key-file "$W/vk.bin" "${nowipe[@]}" "$@" "$img"
  if [ "$unflushed" = 1 ]; then
    # cryptsetup's default journal on a device this small is one section, which the kernel
    # copies to its places at every commit. The dm-integrity superblock at the data
    # segment (1 MiB) is formatted again by the kernel (integritysetup) as cryptsetup
    # formats it (the tag size, the block size, no internal hash of its own: the
    # superblock does not record one, fix_padding), with a 1 MiB journal.
    local tag sector loop
    case "$*" in
      *hmac-sha256*) tag=32 ;;
      *hmac-sha512*) tag=64 ;;
      *) tag=28 ;; # aes-gcm-random, chacha20-random: a 12-byte IV and a 16-byte tag
    esac
    case "$*" in
      *"--sector-size 512"*) sector=512 ;;
      *) sector=4096 ;;
    esac
    loop=$(losetup -f --show -o 1048576 "$img")
    integritysetup format -q --batch-mode --tag-size "$tag" --sector-size "$sector" \
      --journal-size 1048576 --no-wipe "$loop"
    losetup -d "$loop"
  fi
  cryptsetup open --key-file "$W/pass" "$img" "$name"
  dmsetup mknodes
  local dev=/dev/mapper/$name size
  size=$(blockdev --getsize64 "$dev")
  pattern 0 $((size / 16)) > "$W/plain"
  dd if="$W/plain" of="$dev" bs=64k oflag=direct conv=fsync status=none
  if [ "$unflushed" = 1 ]; then
    # A journal the kernel left behind: the first pattern closed cleanly, then the second
    # pattern's three ranges (4 KiB at 4 KiB, 12 KiB at 64 KiB, the last 8 KiB), each
    # written with O_DIRECT and fsync (committed: one padded journal section each, under
    # the 50 % watermark of the 1 MiB journal, so not yet copied to their places), and the
    # image copied while the device is still active (what the disk holds if the power
    # failed right then). (dmsetup suspend --noflush does not leave it: the kernel's
    # postsuspend copies the journal to its places.)
    cryptsetup close "$name"
    cryptsetup open --key-file "$W/pass" "$img" "$name"
    dmsetup mknodes
    local from len
    echo "# $name: $size bytes"
    for r in "4096 4096" "65536 12288" "$((size - 8192)) 8192"; do
      read -r from len <<< "$r"
      pattern $((from / 16)) $((len / 16)) j > "$W/chunk"
      dd if="$W/chunk" of="$dev" bs="$len" seek="$from" oflag=direct,seek_bytes \
        conv=fsync,notrunc status=none
    done
    cp --sparse=never "$img" "$W/unflushed.img"
  fi
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
  if [ "$unflushed" = 1 ]; then
    mv "$W/unflushed.img" "$img"
  fi
  cp --sparse=never "$img" "$OUT/$name.img"
  # The kernel reads its copy back (replaying a journal left behind): same bytes.
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
# Journals the kernel left unflushed (the pattern, then the second pattern's ranges in the
# journal only).
make hmac-sha256-xts-4096-Junflushed 4 --cipher aes-xts-plain64 --key-size 512 \
  --integrity hmac-sha256 --sector-size 4096
make aes-gcm-random-4096-Junflushed 4 --cipher aes-gcm-random --key-size 256 --integrity aead \
  --sector-size 4096
make chacha20-poly1305-4096-Junflushed 4 --cipher chacha20-random --key-size 256 \
  --integrity poly1305 --sector-size 4096
make hmac-sha512-xts-512-Junflushed 8 --cipher aes-xts-plain64 --key-size 256 \
  --integrity hmac-sha512 --sector-size 512
echo "all images made"
