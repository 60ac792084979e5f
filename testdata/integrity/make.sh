#!/bin/bash
# Makes the dm-integrity images of testdata/integrity/ with the kernel's own dm-integrity
# (integritysetup format + writes through the mapped device). Runs as root inside a kernel
# guest of the project's VM harness, whose default modules include the hash modules
# dm-integrity needs (crc32c, hmac, sha256, sha512), from the repository root:
#   tests/lab/run.sh testdata/integrity/make.sh OUTDIR [GLOB]
# With GLOB, only the images whose names match it are made (e.g. '*-jc-*').
# Images are formatted on the guest's /dev/shm (tmpfs) and copied to OUTDIR (a directory
# shared with the host), uncompressed; xz them on the host.
#
# The pattern: the device's bytes at offset 16*i are the 16 ASCII bytes of
# printf '%015x\n' i (so every 16 bytes name their own place). The second pattern, written
# over some blocks of a few images, is printf 'j%014x\n' i at the same places.
set -eu
OUT=$1
ONLY=${2:-*}
mkdir -p "$OUT"
W=/dev/shm/integrity
rm -rf "$W"; mkdir -p "$W"
modprobe crc32_generic 2>/dev/null || modprobe crc32-pclmul 2>/dev/null || true
modprobe sha1_generic 2>/dev/null || true
# Journal encryption (--journal-crypt): the kernel's skcipher templates and chacha20.
for m in ctr cbc xts chacha_generic chacha20_generic; do modprobe "$m" 2>/dev/null || true; done

# key FIRST COUNT FILE: COUNT bytes FIRST, FIRST+1, ... Keys: 0x00.. (32 bytes for
# hmac-sha256, 64 for hmac-sha512); the journal-mac key 0x80.. (32 bytes).
key() {
  local i
  for ((i = $1; i < $1 + $2; i++)); do printf "\\$(printf '%03o' "$i")"; done > "$3"
}
key 0 32 "$W/key32"
key 0 64 "$W/key64"
key 128 32 "$W/jkey32"
# The --journal-crypt-key-file keys: 0x40.. (32 bytes; 64 for xts).
key 64 32 "$W/jckey32"
key 64 64 "$W/jckey64"
cp "$W/key32" "$OUT/key32.bin"
cp "$W/jckey32" "$OUT/jckey32.bin"
cp "$W/jckey64" "$OUT/jckey64.bin"
cp "$W/key64" "$OUT/key64.bin"
cp "$W/jkey32" "$OUT/jkey32.bin"

# pattern FIRST_INDEX COUNT PREFIX: COUNT 16-byte lines from index FIRST_INDEX.
pattern() {
  LC_ALL=C awk -v a="$1" -v n="$2" -v p="$3" \
    'BEGIN { w = (p == "") ? 15 : 14; for (i = a; i < a + n; i++) printf "%s%0" w "x\n", p, i }'
}

# write_range DEV OFFSET LEN PREFIX: the pattern over [OFFSET, OFFSET+LEN), O_DIRECT, fsync.
write_range() {
  pattern $(($2 / 16)) $(($3 / 16)) "$4" > "$W/chunk"
  dd if="$W/chunk" of="$1" bs="$3" seek="$2" oflag=direct,seek_bytes conv=fsync,notrunc \
    status=none
}

# make NAME SIZE_MIB MODE FORMAT_ARGS... -- OPEN_ARGS...
#   MODE: J (journal), D (direct: --integrity-no-journal), B (bitmap),
#         Junflushed / Bdirty: a second write, then a copy of the backing file taken while
#         the device is still active (what the disk holds if the power failed right then).
make() {
  local name=$1 mib=$2 mode=$3; shift 3
  # shellcheck disable=SC2053 # a glob on purpose
  [[ $name == $ONLY ]] || return 0
  local fmt=() opn=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do fmt+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  opn=("$@")
  local img=$W/$name.img
  truncate -s "${mib}M" "$img"
  integritysetup format -q --batch-mode "${fmt[@]}" "$img"
  case $mode in
    D*) opn+=(--integrity-no-journal) ;;
    B*) opn+=(--integrity-bitmap-mode) ;;
  esac
  integritysetup open "${opn[@]}" "$img" "$name"
  local dev=/dev/mapper/$name
  dmsetup mknodes
  local size
  size=$(blockdev --getsize64 "$dev")
  write_range "$dev" 0 "$size" ""
  case $mode in
    Junflushed|Bdirty)
      # The kernel closes the first pattern cleanly, then the second write stays in the
      # journal (or under a dirty bitmap): copy before any close or suspend.
      integritysetup close "$name"
      integritysetup open "${opn[@]}" "$img" "$name"
      dmsetup mknodes
      write_range "$dev" 4096 4096 j
      write_range "$dev" 65536 12288 j
      write_range "$dev" $((size - 8192)) 8192 j
      cp --sparse=never "$img" "$OUT/$name.img"
      ;;
  esac
  dmsetup table "$name" | sed -E 's/(internal_hash|journal_mac|journal_crypt):([^: ]+):[0-9a-f]+/\1:\2:KEY/g' \
    > "$OUT/$name.table"
  sha256sum < "$dev" | cut -d' ' -f1 > "$OUT/$name.sha256"
  echo "$size" > "$OUT/$name.size"
  integritysetup close "$name"
  case $mode in
    Junflushed|Bdirty) ;;
    *) cp --sparse=never "$img" "$OUT/$name.img" ;;
  esac
  # The kernel reads the copy back (replaying a left-over journal): same bytes. On a copy
  # in tmpfs: a replay writes, and integritysetup refuses images on the shared directory.
  cp --sparse=never "$OUT/$name.img" "$W/check.img"
  integritysetup dump "$W/check.img" > "$OUT/$name.dump"
  integritysetup open "${opn[@]}" "$W/check.img" "${name}-check"
  dmsetup mknodes
  local again
  again=$(sha256sum < "/dev/mapper/${name}-check" | cut -d' ' -f1)
  integritysetup close "${name}-check"
  if [ "$again" != "$(cat "$OUT/$name.sha256")" ]; then
    echo "not ok - $name: the copy reads back differently"; exit 1
  fi
  rm -f "$img" "$W/check.img"
  echo "ok - $name: $size bytes, sha256 $(cat "$OUT/$name.sha256")"
}

K32=(--integrity-key-file "$W/key32" --integrity-key-size 32)
K64=(--integrity-key-file "$W/key64" --integrity-key-size 64)
JM=(--journal-integrity hmac-sha256 --journal-integrity-key-file "$W/jkey32"
  --journal-integrity-key-size 32)

make crc32c-512-J 4 J
make crc32c-4096-J 4 J --sector-size 4096
make crc32-512-J 4 J --integrity crc32 -- --integrity crc32
make sha1-512-J 4 J --integrity sha1 -- --integrity sha1
make sha256-512-J 4 J --integrity sha256 -- --integrity sha256
make sha256-4096-i256-J 8 J --integrity sha256 --sector-size 4096 --interleave-sectors 256 \
  -- --integrity sha256
make hmac-sha256-4096-J 4 J --integrity hmac-sha256 "${K32[@]}" --sector-size 4096 \
  -- --integrity hmac-sha256 "${K32[@]}"
make hmac-sha512-512-J 4 J --integrity hmac-sha512 "${K64[@]}" \
  -- --integrity hmac-sha512 "${K64[@]}"
make crc32c-512-D 4 D --integrity-no-journal -- --integrity-no-journal
make crc32c-4096-B 4 B --sector-size 4096
# A 1 MiB journal: several sections, so that the three committed writes (one padded section
# each) stay under the 50 % watermark and are not yet copied to their places.
make crc32c-512-Junflushed 4 Junflushed --journal-size 1048576
make hmac-sha256-4096-Junflushed 4 Junflushed --integrity hmac-sha256 "${K32[@]}" \
  --sector-size 4096 --journal-size 1048576 -- --integrity hmac-sha256 "${K32[@]}"
make crc32c-512-Bdirty 4 Bdirty
make hmac-sha256-512-jmac-J 4 J --integrity hmac-sha256 "${K32[@]}" "${JM[@]}" \
  -- --integrity hmac-sha256 "${K32[@]}" "${JM[@]}"

# Journal encryption. integritysetup's man page names the ciphers "ctr-aes", "cbc-aes",
# "chacha20"; which spelling reaches the kernel shows in each image's .table.
JCK32=(--journal-crypt-key-file "$W/jckey32" --journal-crypt-key-size 32)
JCK64=(--journal-crypt-key-file "$W/jckey64" --journal-crypt-key-size 64)
jc() {
  local name=$1 mib=$2 mode=$3 alg=$4 sector=$5; shift 5
  local k=("${JCK32[@]}")
  [ "$alg" = xts-aes ] && k=("${JCK64[@]}")
  make "$name" "$mib" "$mode" --sector-size "$sector" --journal-crypt "$alg" "${k[@]}" "$@" \
    -- --journal-crypt "$alg" "${k[@]}" "${OPEN_EXTRA[@]}"
}
OPEN_EXTRA=()
jc crc32c-512-jc-ctr-aes-J 4 J ctr-aes 512
jc crc32c-512-jc-ctr-aes-Junflushed 4 Junflushed ctr-aes 512 --journal-size 1048576
jc crc32c-4096-jc-cbc-aes-Junflushed 4 Junflushed cbc-aes 4096 --journal-size 1048576
jc crc32c-512-jc-xts-aes-Junflushed 4 Junflushed xts-aes 512 --journal-size 1048576
jc crc32c-512-jc-chacha20-Junflushed 4 Junflushed chacha20 512 --journal-size 1048576
OPEN_EXTRA=(--integrity hmac-sha256 "${K32[@]}" "${JM[@]}")
jc hmac-sha256-512-jmac-jc-cbc-aes-Junflushed 4 Junflushed cbc-aes 512 --journal-size 1048576 \
  --integrity hmac-sha256 "${K32[@]}" "${JM[@]}"
echo "all images made"
