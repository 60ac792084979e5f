#!/bin/bash
# Makes the dm-integrity images of testdata/integrity/ that have a separate metadata device
# (`integritysetup format META --data-device DATA`), with the kernel's own dm-integrity,
# and records what integritysetup 2.6.1 answers around it: `status` of each mode, `dump`,
# the table, and its errors and exit codes for bad input. Runs as root inside a guest of
# the project's VM harness, from the repository root:
#   tests/lab/run.sh testdata/integrity/datadev/make.sh OUTDIR
# The images are made on the guest's /dev/shm and copied to OUTDIR uncompressed (xz them
# on the host). The pattern is make.sh's: the data's bytes at 16*i are
# printf '%015x\n' i; the `Junflushed` pair then has printf 'j%014x\n' i over
# [4096, 8192), [65536, 77824) and [size - 8192, size), left in the journal.
set -u
OUT=$1
mkdir -p "$OUT/status"
W=/dev/shm/datadev
rm -rf "$W"; mkdir -p "$W"
modprobe crc32c_generic 2>/dev/null || true

key() {
  local i
  for ((i = $1; i < $1 + $2; i++)); do printf "\\$(printf '%03o' "$i")"; done > "$3"
}
key 0 32 "$W/key32"
K32=(--integrity-key-file "$W/key32" --integrity-key-size 32)

pattern() {
  LC_ALL=C awk -v a="$1" -v n="$2" -v p="$3" \
    'BEGIN { w = (p == "") ? 15 : 14; for (i = a; i < a + n; i++) printf "%s%0" w "x\n", p, i }'
}
write_range() {
  pattern $(($2 / 16)) $(($3 / 16)) "$4" > "$W/chunk"
  dd if="$W/chunk" of="$1" bs="$3" seek="$2" oflag=direct,seek_bytes conv=fsync,notrunc \
    status=none
}
keys() { sed -E 's/(internal_hash|journal_mac|journal_crypt):([^: ]+):[0-9a-f]+/\1:\2:KEY/g'; }

# make NAME META_KIB DATA_KIB MODE FORMAT_ARGS... -- OPEN_ARGS...
make() {
  local name=$1 mkib=$2 dkib=$3 mode=$4; shift 4
  local fmt=() opn=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do fmt+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  opn=("$@")
  local meta=$W/$name.meta.img data=$W/$name.data.img
  truncate -s "${mkib}K" "$meta"
  truncate -s "${dkib}K" "$data"
  if ! integritysetup format -q --batch-mode "${fmt[@]}" "$meta" --data-device "$data"; then
    echo "not ok - $name: format"; return
  fi
  case $mode in
    D*) opn+=(--integrity-no-journal) ;;
    B*) opn+=(--integrity-bitmap-mode) ;;
  esac
  integritysetup open "${opn[@]}" "$meta" "$name" --data-device "$data" || {
    echo "not ok - $name: open"; return; }
  local dev=/dev/mapper/$name
  dmsetup mknodes
  local size
  size=$(blockdev --getsize64 "$dev")
  write_range "$dev" 0 "$size" ""
  case $mode in
    Junflushed|Bdirty)
      integritysetup close "$name"
      integritysetup open "${opn[@]}" "$meta" "$name" --data-device "$data"
      dmsetup mknodes
      write_range "$dev" 4096 4096 j
      write_range "$dev" 65536 12288 j
      write_range "$dev" $((size - 8192)) 8192 j
      cp --sparse=never "$meta" "$OUT/$name.meta.img"
      cp --sparse=never "$data" "$OUT/$name.data.img"
      ;;
  esac
  dmsetup table "$name" | keys > "$OUT/$name.table"
  sha256sum < "$dev" | cut -d' ' -f1 > "$OUT/$name.sha256"
  echo "$size" > "$OUT/$name.size"
  integritysetup close "$name"
  case $mode in
    Junflushed|Bdirty) ;;
    *) cp --sparse=never "$meta" "$OUT/$name.meta.img"
       cp --sparse=never "$data" "$OUT/$name.data.img" ;;
  esac
  cp --sparse=never "$OUT/$name.meta.img" "$W/check.meta"
  cp --sparse=never "$OUT/$name.data.img" "$W/check.data"
  integritysetup dump "$W/check.meta" > "$OUT/$name.dump"
  integritysetup open "${opn[@]}" "$W/check.meta" "${name}-check" --data-device "$W/check.data"
  dmsetup mknodes
  local again
  again=$(sha256sum < "/dev/mapper/${name}-check" | cut -d' ' -f1)
  integritysetup close "${name}-check"
  if [ "$again" != "$(cat "$OUT/$name.sha256")" ]; then
    echo "not ok - $name: the copy reads back differently"
  else
    echo "ok - $name: $size bytes, sha256 $again"
  fi
  rm -f "$meta" "$data" "$W/check.meta" "$W/check.data"
}

make crc32c-4096-datadev-J 1024 4096 J --sector-size 4096
make hmac-sha256-512-datadev-D 1024 4096 D --integrity hmac-sha256 "${K32[@]}" \
  --integrity-no-journal -- --integrity hmac-sha256 "${K32[@]}"
make crc32c-512-datadev-Junflushed 2048 4096 Junflushed --journal-size 1048576
make crc32c-512-datadev-Bdirty 1024 4096 Bdirty

# integritysetup status with a data device, each mode (8 MiB of data, 1 MiB of metadata).
status_of() {
  local mode=$1; shift
  truncate -s 1M "$W/s.meta"; truncate -s 8M "$W/s.data"
  integritysetup format -q --batch-mode "$W/s.meta" --data-device "$W/s.data"
  integritysetup open "$@" "$W/s.meta" "s$mode" --data-device "$W/s.data"
  integritysetup status "s$mode" > "$OUT/status/datadev-$mode.txt" 2>&1
  dmsetup table "s$mode" | keys >> "$OUT/status/datadev-$mode.txt"
  integritysetup close "s$mode"
  rm -f "$W/s.meta" "$W/s.data"
}
status_of J
status_of D -D
status_of B -B
status_of R -R

# Bad input: the exit code and what integritysetup says (stdout and stderr together).
E=$OUT/errors.txt
: > "$E"
try() {
  local what=$1; shift
  { echo "== $what"; echo "\$ integritysetup $*"; } >> "$E"
  integritysetup "$@" >> "$E" 2>&1
  echo "exit $?" >> "$E"
  dmsetup remove_all 2>/dev/null
}
truncate -s 1M "$W/m"; truncate -s 4M "$W/d"; truncate -s 4K "$W/tiny"; truncate -s 64K "$W/m64"
truncate -s 0 "$W/empty"
try "data device too small (4 KiB)" format -q --batch-mode "$W/m" --data-device "$W/tiny"
try "data device empty" format -q --batch-mode "$W/m" --data-device "$W/empty"
try "metadata device too small (4 KiB)" format -q --batch-mode "$W/tiny" --data-device "$W/d"
try "metadata device 64 KiB, 4 MiB of data" format -q --batch-mode "$W/m64" --data-device "$W/d"
dump_if() { [ -s "$1" ] && integritysetup dump "$1" >> "$E" 2>&1; }
dump_if "$W/m64"
try "--interleave-sectors with a data device" format -q --batch-mode --interleave-sectors 64 \
  "$W/m" --data-device "$W/d"
dump_if "$W/m"
try "--integrity-legacy-padding with a data device" format -q --batch-mode \
  --integrity-legacy-padding "$W/m" --data-device "$W/d"
dump_if "$W/m"
try "--integrity-bitmap-mode format with a data device" format -q --batch-mode -B "$W/m" \
  --data-device "$W/d"
dump_if "$W/m"
try "the data device is the metadata device" format -q --batch-mode "$W/m" --data-device "$W/m"
try "--journal-crypt format with a data device" format -q --batch-mode --journal-crypt ctr-aes \
  --journal-crypt-key-file "$W/key32" --journal-crypt-key-size 32 "$W/m" --data-device "$W/d"
try "a data-device format opened without --data-device" open "$W/m" x1
truncate -s 1M "$W/m"; truncate -s 4M "$W/d"
integritysetup format -q --batch-mode "$W/m" --data-device "$W/d"
try "a data-device format opened without --data-device (plain format)" open "$W/m" x2
truncate -s 4M "$W/p"; integritysetup format -q --batch-mode "$W/p"
try "a plain format opened with --data-device" open "$W/p" x3 --data-device "$W/d"
truncate -s 2M "$W/d2"
try "opened with a smaller data device (2 MiB of 4)" open "$W/m" x4 --data-device "$W/d2"
integritysetup status x4 >> "$E" 2>&1; dmsetup table x4 >> "$E" 2>&1
integritysetup close x4 2>/dev/null
integritysetup dump "$W/m" >> "$E" 2>&1
truncate -s 8M "$W/d8"
try "opened with a larger data device (8 MiB of 4)" open "$W/m" x5 --data-device "$W/d8"
integritysetup status x5 >> "$E" 2>&1; dmsetup table x5 >> "$E" 2>&1
integritysetup close x5 2>/dev/null
integritysetup dump "$W/m" >> "$E" 2>&1
try "--data-device on close" close x6 --data-device "$W/d"
try "--data-device on dump" dump "$W/m" --data-device "$W/d"
echo "all made"
