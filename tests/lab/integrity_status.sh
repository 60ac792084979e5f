#!/bin/bash
# Kernel-lab capture for `ucrypt integritysetup status` (issue 28, item 5): what the real
# integritysetup 2.6.1 prints for devices of each mode on Linux's dm-integrity, beside what
# `ucrypt integritysetup open IMG NAME --device ublk` then `status NAME` print for the same
# image, and a ublk read of a block whose tag was flipped (EILSEQ for that block only,
# counted in `failures`). Runs as root in the guest of tests/lab/run.sh:
#   tests/lab/run.sh tests/lab/integrity_status.sh OUTDIR [UCRYPT]
# (crates/cli/tests/lab_integritysetup.rs runs it so.) Writes OUTDIR/MODE.kernel (status,
# then dmsetup table with the keys replaced), OUTDIR/MODE.ucrypt and OUTDIR/tamper.ucrypt;
# prints "ok - ..." / "not ok - ..." and "N passed, M failed"; exits 1 on any failure.
set -u
OUT=$1
U=${2:-$PWD/target/debug/ucrypt}
mkdir -p "$OUT"
W=/dev/shm/istatus
rm -rf "$W"; mkdir -p "$W"
export UCRYPT_RUNTIME_DIR=$W/run
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
modprobe crc32c_generic 2>/dev/null || true
for m in ctr cbc; do modprobe "$m" 2>/dev/null || true; done
head -c 32 /dev/zero | tr '\0' '\101' > "$W/key"
head -c 32 /dev/zero | tr '\0' '\102' > "$W/jkey"

# mode: format options | open options
run_mode() {
  local mode=$1 fmt=$2 opn=$3
  local img=$W/$mode.img
  truncate -s 8M "$img"
  # shellcheck disable=SC2086
  integritysetup format -q $fmt "$img" || { bad "$mode: format"; return; }
  # shellcheck disable=SC2086
  integritysetup open $opn "$img" "k$mode" || { bad "$mode: kernel open"; return; }
  integritysetup status "k$mode" > "$OUT/$mode.kernel" 2>&1
  dmsetup table "k$mode" | sed 's/:[0-9a-f]\{32,\}/:KEY/g' >> "$OUT/$mode.kernel"
  integritysetup close "k$mode"
  # shellcheck disable=SC2086
  if "$U" integritysetup open "$img" "u$mode" $opn --device ublk > "$W/uri" 2>&1; then
    "$U" integritysetup status "u$mode" > "$OUT/$mode.ucrypt" 2>&1
    ok "$mode: ucrypt opened it over ublk ($(cat "$W/uri"))"
    "$U" integritysetup close "u$mode"
  else
    bad "$mode: ucrypt open: $(cat "$W/uri")"
  fi
}
run_mode J "" ""
run_mode D "-D" "-D"
run_mode B "-B" "-B"
run_mode hmac-jmac "-I hmac-sha256 --integrity-key-file $W/key --integrity-key-size 32 --journal-integrity hmac-sha256 --journal-integrity-key-file $W/jkey --journal-integrity-key-size 32 -s 4096" \
  "-I hmac-sha256 --integrity-key-file $W/key --integrity-key-size 32 --journal-integrity hmac-sha256 --journal-integrity-key-file $W/jkey --journal-integrity-key-size 32"
run_mode jc "--journal-crypt ctr-aes --journal-crypt-key-file $W/jkey --journal-crypt-key-size 32" \
  "--journal-crypt ctr-aes --journal-crypt-key-file $W/jkey --journal-crypt-key-size 32 --journal-watermark 30 --journal-commit-time 5000"

# A flipped tag through ublk: block 100 of the J image (crc32c, 4-byte tags, 512-byte
# blocks); its tag is after the superblock and the journal (dmsetup table's journal_sectors).
js=$(sed -n 's/.*journal_sectors:\([0-9]*\).*/\1/p' "$OUT/J.kernel")
if [ -n "$js" ]; then
  printf '\xff' | dd of="$W/J.img" bs=1 seek=$(( (8 + js) * 512 + 100 * 4 )) conv=notrunc 2>/dev/null
  "$U" integritysetup open "$W/J.img" ut --device ublk > "$W/node" 2>&1
  node=$(tail -n 1 "$W/node")
  if [ -b "$node" ]; then
    if dd if="$node" of=/dev/null bs=512 skip=100 count=1 iflag=direct 2> "$W/err"; then
      bad "ublk read of the tampered block succeeded"
    elif grep -q "Invalid or incomplete multibyte\|Input/output error" "$W/err"; then
      ok "ublk: the tampered block fails ($(tail -n 1 "$W/err"))"
    else
      bad "ublk: unexpected error $(cat "$W/err")"
    fi
    if dd if="$node" of=/dev/null bs=512 skip=101 count=1 iflag=direct 2>/dev/null; then
      ok "ublk: the next block reads"
    else
      bad "ublk: the next block failed"
    fi
    "$U" integritysetup status ut > "$OUT/tamper.ucrypt" 2>&1
    grep -q "failures: [1-9]" "$OUT/tamper.ucrypt" && ok "failures counted" || bad "failures not counted"
    "$U" integritysetup close ut
  else
    bad "ublk open for the tamper check: $(cat "$W/node")"
  fi
fi
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
