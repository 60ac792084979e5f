#!/bin/bash
# `ucrypt open IMAGE NAME --device vduse`: the volume as the guest kernel's own /dev/vdX
# (VDUSE + virtio_vdpa + virtio_blk). Runs as root in the guest of tests/lab/run.sh, started
# by crates/cli/tests/lab_vduse.rs:
#   vduse.sh UCRYPT
# Checks: the refusal while the vduse module is not loaded, and for a caller who is not
# root; then (modprobe vduse virtio_vdpa) a LUKS2 volume of 4096-byte sectors with
# --allow-discards and 2 queues as /dev/vdX: logical block, capacity, mkfs.ext4 / mount /
# write / fsync, direct writes from both CPUs at once, close refused (exit 5) while mounted,
# blkdiscard and blkdiscard -z, close; the kernel's dm-crypt (cryptsetup) over the same image
# then finds the file, the raw writes and the zeroes. Then read-only, resize, and close of a
# server killed with SIGKILL. Prints "ok - ..." per check and "N passed, M failed".
set -u
UCRYPT=$1
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
W=$(mktemp -d /tmp/ucrypt-lab.XXXXXX)
MNT=$W/mnt; mkdir -p "$MNT"
IMG=$W/disk.img
truncate -s 64M "$IMG"
printf 'lab passphrase' > "$W/pass"
"$UCRYPT" luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --sector-size 4096 \
  -d "$W/pass" "$IMG" || { echo "luksFormat failed"; exit 1; }

node_of() { "$UCRYPT" status --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["node"])'; }
pid_of() { "$UCRYPT" status --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])'; }

# 1. Refusals.
lsmod | grep -q '^vduse ' && rmmod vduse 2>/dev/null
"$UCRYPT" open "$IMG" nomod --device vduse -d "$W/pass" > "$W/o" 2> "$W/e"
rc=$?
echo "# without the module (exit $rc): $(cat "$W/e")"
check "refused without the vduse module, naming it" \
  bash -c "[ $rc -ne 0 ] && grep -q 'modprobe vduse' '$W/e'"
modprobe vduse || echo "# modprobe vduse failed"
"$UCRYPT" open "$IMG" novdpa --device vduse -d "$W/pass" > "$W/o" 2> "$W/e"
rc=$?
echo "# without virtio_vdpa (exit $rc): $(cat "$W/e")"
check "refused without virtio_vdpa, naming it" \
  bash -c "[ $rc -ne 0 ] && grep -q 'modprobe virtio_vdpa' '$W/e'"
modprobe virtio_vdpa || echo "# modprobe virtio_vdpa failed"
echo "# modules: $(lsmod | awk '/vduse|vdpa|virtio/ {print $1}' | tr '\n' ' ')"
mkdir -p "$W/nobody"; chmod 777 "$W/nobody"
setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$W/nobody" XDG_RUNTIME_DIR="$W/nobody" \
  "$UCRYPT" open "$IMG" nonroot --device vduse -d "$W/pass" > "$W/o" 2> "$W/e"
rc=$?
echo "# not root (exit $rc): $(cat "$W/e")"
check "refused for a caller who is not root" \
  bash -c "[ $rc -ne 0 ] && grep -q 'needs root' '$W/e'"

# 2. Read-write, two queues, discards.
if ! "$UCRYPT" open "$IMG" vd1 --device vduse --queues 2 --allow-discards -d "$W/pass" \
    > "$W/open.out" 2> "$W/open.err"; then
  bad "open --device vduse: $(cat "$W/open.err")"
  dmesg | tail -20 | sed 's/^/# /'
  echo "$PASS passed, $FAIL failed"
  exit 1
fi
ok "open --device vduse"
DEV=$(node_of vd1)
echo "# node: $DEV; $(cat "$W/open.out")"
check "the node is a block device named vdX" bash -c "[ -b '$DEV' ] && [[ '$DEV' == /dev/vd* ]]"
B=$(basename "$DEV")
check "logical block 4096" [ "$(blockdev --getss "$DEV")" = 4096 ]
SIZE=$(blockdev --getsize64 "$DEV")
check "capacity is the volume's ($SIZE bytes)" [ "$SIZE" -eq $((64 * 1048576 - 16777216)) ]
check "2 hardware queues" [ "$(ls /sys/block/$B/mq | wc -l)" = 2 ]
check "discard offered" [ "$(cat /sys/block/$B/queue/discard_max_bytes)" -gt 0 ]
check "write-zeroes offered" [ "$(cat /sys/block/$B/queue/write_zeroes_max_bytes)" -gt 0 ]
check "status names the front end vduse" bash -c "'$UCRYPT' status vd1 | grep -qi vduse"
check "mkfs.ext4" mkfs.ext4 -q -F "$DEV"
check "mount" mount "$DEV" "$MNT"
head -c 3M /dev/urandom > "$W/file"
check "write and fsync a file" dd if="$W/file" of="$MNT/file" bs=1M conv=fsync status=none
"$UCRYPT" close vd1 > "$W/o" 2> "$W/e"
rc=$?
check "close refused while mounted (exit 5, got $rc)" [ $rc = 5 ]
check "still served after the refusal" cmp -s "$W/file" "$MNT/file"
umount "$MNT"
# Raw writes at the end of the device, from both CPUs at once (both queues busy).
END=$((SIZE / 1048576))
head -c 4M /dev/urandom > "$W/raw"
taskset -c 0 dd if="$W/raw" of="$DEV" bs=1M count=2 seek=$((END - 8)) oflag=direct status=none &
p0=$!
taskset -c 1 dd if="$W/raw" of="$DEV" bs=1M skip=2 count=2 seek=$((END - 6)) oflag=direct status=none &
p1=$!
wait $p0 && wait $p1
check "direct writes from both CPUs" [ $? = 0 ]
check "they read back" bash -c "dd if='$DEV' bs=1M skip=$((END - 8)) count=4 iflag=direct status=none | cmp -s - '$W/raw'"
check "blkdiscard (allow_discards)" blkdiscard -o $(((END - 2) * 1048576)) -l 1048576 "$DEV"
check "blkdiscard -z" blkdiscard -z -o $(((END - 1) * 1048576)) -l 1048576 "$DEV"
check "the zeroed range reads zeroes" bash -c "dd if='$DEV' bs=1M skip=$((END - 1)) count=1 iflag=direct status=none | cmp -s - <(head -c 1M /dev/zero)"
check "close" "$UCRYPT" close vd1
check "the vdX device is gone" bash -c "! [ -e /sys/block/$B ]"
check "the VDUSE device is gone" bash -c "! [ -e /dev/vduse/ucrypt-vd1 ]"

# 3. What the kernel's dm-crypt finds in the image.
if cryptsetup open --key-file "$W/pass" "$IMG" lab-dm; then
  dmsetup mknodes >/dev/null 2>&1
  DM=/dev/mapper/lab-dm
  mount -o ro "$DM" "$MNT"
  check "dm-crypt: the file written through /dev/vdX" cmp -s "$W/file" "$MNT/file"
  umount "$MNT"
  check "dm-crypt: the raw writes" bash -c "dd if=$DM bs=1M skip=$((END - 8)) count=4 status=none | cmp -s - '$W/raw'"
  check "dm-crypt: the zeroes" bash -c "dd if=$DM bs=1M skip=$((END - 1)) count=1 status=none | cmp -s - <(head -c 1M /dev/zero)"
  cryptsetup close lab-dm
else
  bad "cryptsetup open of the image"
fi

# 4. Read-only.
if "$UCRYPT" open "$IMG" vdro --device vduse --read-only -d "$W/pass" > "$W/o" 2> "$W/e"; then
  DEV=$(node_of vdro)
  check "read-only: the kernel sees it read-only" [ "$(blockdev --getro "$DEV")" = 1 ]
  check "read-only: a write fails" bash -c "! dd if=/dev/zero of='$DEV' bs=4096 count=1 oflag=direct status=none 2>/dev/null"
  mount -o ro "$DEV" "$MNT"
  check "read-only: the file reads back" cmp -s "$W/file" "$MNT/file"
  umount "$MNT"
  check "read-only: close" "$UCRYPT" close vdro
else
  bad "open --read-only: $(cat "$W/e")"
fi

# 5. Resize: the new capacity reaches /dev/vdX through a configuration change.
if "$UCRYPT" open "$IMG" vdrs --device vduse -d "$W/pass" > "$W/o" 2> "$W/e"; then
  DEV=$(node_of vdrs)
  if "$UCRYPT" resize vdrs --size $((32 * 2048)) -d "$W/pass" > "$W/o" 2> "$W/e"; then
    sleep 1
    check "resize: /dev/vdX shows 32 MiB" [ "$(blockdev --getsize64 "$DEV")" = $((32 * 1048576)) ]
  else
    bad "resize: $(cat "$W/e")"
  fi
  check "resize: close" "$UCRYPT" close vdrs
else
  bad "open for resize: $(cat "$W/e")"
fi

# 6. A server killed with SIGKILL: close removes what it left.
if "$UCRYPT" open "$IMG" vdk --device vduse -d "$W/pass" > "$W/o" 2> "$W/e"; then
  DEV=$(node_of vdk)
  PID=$(pid_of vdk)
  kill -9 "$PID"
  for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  "$UCRYPT" status vdk > "$W/o" 2>&1
  echo "# status of the dead instance: $(tr '\n' ' ' < "$W/o")"
  check "status of the dead instance names its $DEV" grep -q "$DEV" "$W/o"
  check "status offers no --recover for a VDUSE device (none exists)" bash -c "! grep -q 'recover:' '$W/o'"
  timeout 300 "$UCRYPT" close vdk > "$W/o" 2> "$W/e"
  rc=$?
  echo "# close of the dead instance (exit $rc): $(cat "$W/o" "$W/e" | tr '\n' ' ')"
  check "close of the dead instance" [ $rc = 0 ]
  check "its $DEV is gone" bash -c "! [ -e /sys/block/$(basename "$DEV") ]"
  check "its VDUSE device is gone" bash -c "! [ -e /dev/vduse/ucrypt-vdk ]"
else
  bad "open for the kill test: $(cat "$W/e")"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
