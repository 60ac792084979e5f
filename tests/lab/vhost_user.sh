#!/bin/bash
# The guest's side of ucrypt's vhost-user-blk front end, run by tests/lab/run.sh from
# crates/cli/tests/lab_vhost_user.rs, which started two `ucrypt open --device vhost-user`
# instances on the host before booting this guest (LAB_SHARED_MEM=1, the sockets attached
# as vhost-user-blk-pci devices):
#   vhost_user.sh W RW_NAME RO_NAME RW_BYTES
# W is the shared work directory (rw.img, rw.table: what the RW instance serves; ro.sha:
# sha256 of the RO volume's first MiB, computed by the host), RW_NAME/RO_NAME the
# instances' names (each disk's serial, from VIRTIO_BLK_T_GET_ID), RW_BYTES the RW
# volume's size. Writes guest.sha (sha256 of the file written on the RW disk) into W.
# Prints one "ok - ..." line per check and "N passed, M failed"; exits 1 on any failure.
set -u
W=$1 RW_NAME=$2 RO_NAME=$3 RW_BYTES=$4
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
T=$(mktemp -d /tmp/vu.XXXXXX)
MNT=$T/mnt; mkdir -p "$MNT"
sha() { sha256sum "$1" | cut -d' ' -f1; }
MiB=$((1 << 20))

# The disk whose serial (GET_ID) is $1.
by_serial() {
  local d
  for d in /sys/block/vd*; do
    [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}
finish() {
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" -eq 0 ]
  exit
}

RW=$(by_serial "$RW_NAME") || { bad "a virtio disk with serial $RW_NAME"; ls -l /sys/block; finish; }
ok "the read-write disk is $RW (serial $RW_NAME, from GET_ID)"
Q=/sys/block/${RW#/dev/}
check "logical block 4096 (the LUKS2 sector size)" [ "$(cat "$Q/queue/logical_block_size")" = 4096 ]
check "capacity $RW_BYTES bytes" [ "$(blockdev --getsize64 "$RW")" = "$RW_BYTES" ]
check "2 queues" [ "$(ls "$Q/mq" | wc -l)" = 2 ]
check "writable" [ "$(cat "$Q/ro")" = 0 ]
check "discard offered (allow_discards)" [ "$(cat "$Q/queue/discard_max_bytes")" -gt 0 ]
check "write-zeroes offered" [ "$(cat "$Q/queue/write_zeroes_max_bytes")" -gt 0 ]
check "a volatile write cache (flushes reach the host)" \
  [ "$(cat "$Q/queue/write_cache")" = "write back" ]

# A filesystem on the first 32 MiB; the rest is for raw checks.
FS_BYTES=$((32 * MiB))
check "mkfs.ext4 (discards the device first)" mkfs.ext4 -q -F -b 4096 "$RW" $((FS_BYTES / 1024))k
check "mount" mount -t ext4 "$RW" "$MNT"
head -c $((12 * MiB)) /dev/urandom > "$T/data"
check "write 12 MiB and fsync" dd if="$T/data" of="$MNT/data" bs=1M conv=fsync status=none
sha "$T/data" > "$W/guest.sha"
check "umount" umount "$MNT"
check "mount again" mount -t ext4 -o ro "$RW" "$MNT"
check "the file reads back" cmp "$T/data" "$MNT/data"
umount "$MNT"

# Raw I/O past the filesystem, from both CPUs at once (one queue each).
RAW=$((FS_BYTES / MiB))
head -c $((4 * MiB)) /dev/urandom > "$T/p0"
head -c $((4 * MiB)) /dev/urandom > "$T/p1"
taskset -c 0 dd if="$T/p0" of="$RW" bs=64k seek=$((RAW * MiB)) oflag=direct,seek_bytes status=none &
a=$!
taskset -c 1 dd if="$T/p1" of="$RW" bs=64k seek=$(((RAW + 4) * MiB)) oflag=direct,seek_bytes status=none &
b=$!
wait $a && wait $b; r=$?
check "direct writes from CPU 0 and CPU 1 at once" [ $r = 0 ]
check "both read back" bash -c "cmp <(dd if=$RW bs=1M skip=$RAW count=4 iflag=direct status=none) $T/p0 &&
  cmp <(dd if=$RW bs=1M skip=$((RAW + 4)) count=4 iflag=direct status=none) $T/p1"
check "blkdiscard (VIRTIO_BLK_T_DISCARD)" blkdiscard -o $((RAW * MiB)) -l $((4 * MiB)) "$RW"
check "blkdiscard -z (VIRTIO_BLK_T_WRITE_ZEROES)" blkdiscard -z -o $((RAW * MiB + MiB)) -l $((2 * MiB)) "$RW"
check "the zeroed range reads back as zeroes" \
  cmp -n $((2 * MiB)) <(dd if="$RW" bs=1M skip=$((RAW + 1)) count=2 iflag=direct status=none) /dev/zero
check "the range next to it is untouched" \
  cmp <(dd if="$RW" bs=1M skip=$((RAW + 4)) count=4 iflag=direct status=none) "$T/p1"

# Throughput (TCG: direction only), 1 MiB direct I/O.
t0=$(date +%s%N)
dd if=/dev/zero of="$RW" bs=1M seek=$((RAW + 8)) count=8 oflag=direct status=none
t1=$(date +%s%N)
dd if="$RW" of=/dev/null bs=1M skip=$((RAW + 8)) count=8 iflag=direct status=none
t2=$(date +%s%N)
echo "# dd 1 MiB direct: write $((8 * 1000000000 / (t1 - t0 + 1))) MiB/s, read $((8 * 1000000000 / (t2 - t1 + 1))) MiB/s (TCG)"
check "flush (blockdev --flushbufs)" blockdev --flushbufs "$RW"

# The read-only disk.
RO=$(by_serial "$RO_NAME")
if [ -n "$RO" ]; then
  ok "the read-only disk is $RO (serial $RO_NAME)"
  R=/sys/block/${RO#/dev/}
  check "read-only (VIRTIO_BLK_F_RO)" [ "$(cat "$R/ro")" = 1 ]
  check "logical block 512 (its sector size)" [ "$(cat "$R/queue/logical_block_size")" = 512 ]
  check "1 queue" [ "$(ls "$R/mq" | wc -l)" = 1 ]
  check "reads what the host reads" \
    [ "$(dd if="$RO" bs=1M count=1 iflag=direct status=none | sha256sum | cut -d' ' -f1)" = "$(cat "$W/ro.sha")" ]
  check "a write is refused" bash -c "! dd if=/dev/zero of=$RO bs=4k count=1 oflag=direct status=none 2>/dev/null"
else
  bad "a virtio disk with serial $RO_NAME"
fi

# Writes while the host suspends the volume (luksSuspend), resumes it (luksResume) and
# refreshes it: the host starts once $W/io-running exists and says so in $W/resumed. Whole
# passes of the same 8 MiB, the last one after the resume, so the end state is known.
head -c $((8 * MiB)) /dev/urandom > "$T/p2"
touch "$W/io-running"
passes=0 r=0
while :; do
  dd if="$T/p2" of="$RW" bs=64k seek=$(((RAW + 8) * MiB)) oflag=direct,seek_bytes status=none || { r=1; break; }
  passes=$((passes + 1))
  [ -e "$W/resumed" ] && break
  [ $passes -gt 2000 ] && break
done
check "the host suspended, resumed and refreshed the volume meanwhile" [ -e "$W/resumed" ]
check "writes across luksSuspend/luksResume/refresh ($passes passes of 8 MiB)" [ $r = 0 ]
check "they read back" \
  cmp <(dd if="$RW" bs=1M skip=$((RAW + 8)) count=8 iflag=direct status=none) "$T/p2"

# The kernel's dm-crypt reads what went through the vhost-user disk: same ciphertext.
if LOOP=$(losetup -r -f --show "$W/rw.img"); then
  awk -v d="$LOOP" '{ $7 = d; print }' "$W/rw.table" > "$T/table.dm"
  if dmsetup create --readonly vulab --table "$(cat "$T/table.dm")" && dmsetup mknodes; then
    check "dm-crypt: mount the filesystem" mount -t ext4 -o ro,noload /dev/mapper/vulab "$MNT"
    check "dm-crypt: the file is the one written" [ "$(sha "$MNT/data")" = "$(cat "$W/guest.sha")" ]
    check "dm-crypt: the zeroed range is zeroes" \
      cmp -n $((2 * MiB)) <(dd if=/dev/mapper/vulab bs=1M skip=$((RAW + 1)) count=2 status=none) /dev/zero
    check "dm-crypt: the raw write from CPU 1 is there" \
      cmp <(dd if=/dev/mapper/vulab bs=1M skip=$((RAW + 4)) count=4 status=none) "$T/p1"
    check "dm-crypt: the writes across luksSuspend/luksResume are there" \
      cmp <(dd if=/dev/mapper/vulab bs=1M skip=$((RAW + 8)) count=8 status=none) "$T/p2"
    umount "$MNT" 2>/dev/null
    dmsetup remove vulab
  else
    bad "dmsetup create over $W/rw.img"
  fi
  losetup -d "$LOOP"
else
  bad "losetup $W/rw.img"
fi
finish
