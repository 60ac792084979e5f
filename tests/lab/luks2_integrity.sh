#!/bin/bash
# Kernel-lab checks of ucrypt's LUKS2 authenticated encryption (dm-crypt over dm-integrity
# with external tags): Linux opens images ucrypt wrote and reads what ucrypt wrote. Runs as
# root in the guest of the project's VM harness tests/lab/run.sh (whose default modules
# include authenc, gcm, chacha20poly1305, hmac, sha256 and sha512), started by
# crates/cli/tests/lab_luks2_integrity.rs:
#   luks2_integrity.sh DIR
# DIR (shared with the host) holds pass.txt (the passphrase), IMAGE.img, IMAGE.sha256 (the
# opened device's expected sha256) and, for the tamper check, IMAGE.bad (a copy with one
# byte flipped) and IMAGE.badblock (the block number and size: the kernel must fail exactly
# that block with EILSEQ). Prints "ok - ..." per check and "N passed, M failed"; exits 1 on
# any failure.
set -u
DIR=$1
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
# cryptsetup's keyslot I/O fails on the shared directory: work on the guest's tmpfs.
W=/dev/shm/ucrypt-luks2-integrity
rm -rf "$W"; mkdir -p "$W"
cp "$DIR/pass.txt" "$W/pass"

for img in "$DIR"/*.img; do
  name=$(basename "$img" .img)
  cp --sparse=never "$img" "$W/$name.img"
  if cryptsetup open --key-file "$W/pass" "$W/$name.img" "u$name" 2> "$W/err"; then
    dmsetup mknodes
    got=$(sha256sum < "/dev/mapper/u$name" | cut -d' ' -f1)
    if [ "$got" = "$(cat "$DIR/$name.sha256")" ]; then
      ok "$name: the kernel reads what ucrypt wrote"
    else
      bad "$name: the kernel read sha256 $got"
    fi
    cryptsetup close "u$name"
  else
    bad "$name: cryptsetup open failed: $(cat "$W/err")"
  fi
  if [ -f "$DIR/$name.bad" ]; then
    read -r block bs < "$DIR/$name.badblock"
    cp --sparse=never "$DIR/$name.bad" "$W/$name.bad"
    if cryptsetup open --key-file "$W/pass" "$W/$name.bad" "b$name" 2> "$W/err"; then
      dmsetup mknodes
      dev=/dev/mapper/b$name
      blocks=$(( $(blockdev --getsize64 "$dev") / bs ))
      failed=""
      for ((b = block - 2; b <= block + 2; b++)); do
        if ! dd if="$dev" of=/dev/null bs="$bs" skip="$b" count=1 iflag=direct status=none \
          2> "$W/dd"; then
          # strerror(EILSEQ); any other error does not count as the right answer
          if grep -q "Invalid or incomplete multibyte or wide character" "$W/dd"; then
            failed="$failed $b"
          else
            failed="$failed $b(other:$(tr '\n' ' ' < "$W/dd"))"
          fi
        fi
      done
      dd if="$dev" of=/dev/null bs="$bs" count="$block" iflag=direct status=none ||
        failed="$failed before"
      dd if="$dev" of=/dev/null bs="$bs" skip=$((block + 1)) count=$((blocks - block - 1)) \
        iflag=direct status=none || failed="$failed after"
      if [ "$failed" = " $block" ]; then
        ok "$name: one flipped byte fails exactly block $block of $blocks (EILSEQ)"
      else
        bad "$name: failed blocks:$failed (expected $block)"
      fi
      cryptsetup close "b$name"
    else
      bad "$name: open of the tampered copy failed: $(cat "$W/err")"
    fi
  fi
  rm -f "$W/$name.img" "$W/$name.bad"
done
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
