#!/bin/bash
# Kernel-lab checks of ucrypt's dm-integrity (issue 28): Linux opens images ucrypt formatted
# and wrote, and reads what ucrypt wrote. Runs as root in the guest of the project's VM
# harness tests/lab/run.sh (whose default modules include hmac, sha256 and sha512; the test
# adds crc32c_generic with LAB_MODULES), started by
# crates/integrity/tests/lab_kernel.rs:
#   integrity.sh DIR
# DIR (shared with the host) holds IMAGE.img, IMAGE.sha256 (the device's expected sha256),
# IMAGE.args (integritysetup open's options, one line) and, for the tamper check,
# IMAGE.data (then IMAGE.img is its metadata device: integritysetup's --data-device),
# IMAGE.bad (a copy with one byte flipped) and IMAGE.badblock (the block number and size:
# the kernel must fail exactly that block with EILSEQ). Prints "ok - ..." per check and
# "N passed, M failed"; exits 1 on any failure.
set -u
DIR=$1
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
W=/dev/shm/ucrypt-integrity
rm -rf "$W"; mkdir -p "$W"
modprobe crc32c_generic 2>/dev/null || true
# --journal-crypt: the skcipher templates and chacha20
for m in ctr cbc xts chacha_generic; do modprobe "$m" 2>/dev/null || true; done

for img in "$DIR"/*.img; do
  name=$(basename "$img" .img)
  read -r -a args < "$DIR/$name.args"
  # integritysetup refuses images on the shared directory; the kernel writes on replay.
  cp --sparse=never "$img" "$W/$name.img"
  # IMAGE.data: IMAGE.img is the metadata device of a separate data device.
  if [ -f "$DIR/$name.data" ]; then
    cp --sparse=never "$DIR/$name.data" "$W/$name.data"
    args+=(--data-device "$W/$name.data")
  fi
  if integritysetup open "${args[@]}" "$W/$name.img" "u$name" 2> "$W/err"; then
    dmsetup mknodes
    got=$(sha256sum < "/dev/mapper/u$name" | cut -d' ' -f1)
    if [ "$got" = "$(cat "$DIR/$name.sha256")" ]; then
      ok "$name: the kernel reads what ucrypt wrote"
    else
      bad "$name: the kernel read sha256 $got"
    fi
    integritysetup close "u$name"
  else
    bad "$name: integritysetup open failed: $(cat "$W/err")"
  fi
  if [ -f "$DIR/$name.bad" ]; then
    read -r block bs < "$DIR/$name.badblock"
    cp --sparse=never "$DIR/$name.bad" "$W/$name.bad"
    if integritysetup open "${args[@]}" "$W/$name.bad" "b$name" 2> "$W/err"; then
      dmsetup mknodes
      dev=/dev/mapper/b$name
      blocks=$(( $(blockdev --getsize64 "$dev") / bs ))
      # The blocks around the damaged one one by one, then everything before and after it
      # in two reads (one dd per block of the device takes too long under TCG).
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
      integritysetup close "b$name"
    else
      bad "$name: open of the tampered copy failed: $(cat "$W/err")"
    fi
  fi
  rm -f "$W/$name.img" "$W/$name.bad" "$W/$name.data"
done
echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
