#!/bin/bash
# The guest's side of the vhost-user reconnect test, run by tests/lab/run.sh from
# crates/cli/tests/lab_vhost_user.rs, whose host side serves instance NAME with
# `ucrypt open --device vhost-user` (QEMU's chardev with reconnect=1):
#   vhost_reconnect.sh W NAME
# An ext4 on the disk whose serial is NAME; then files written and fsync'd one after
# another, each listed in W/fsynced ("fN SHA256") only once its fsync returned. After the
# tenth the guest touches W/ready: the host kill -9's the server and starts a new one with
# `open --recover`, then touches W/recovered; the guest writes ten more files after that,
# then touches W/written; the host grows the image and runs `ucrypt resize`, then writes
# the new size in bytes into W/resized, which the disk must show (a configuration-change
# message); then every file is read back. Prints "ok - ..." per check and "N passed, M failed".
set -u
W=$1 NAME=$2
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
finish() {
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" -eq 0 ]
  exit
}
T=$(mktemp -d /tmp/vr.XXXXXX)
MNT=$T/mnt; mkdir -p "$MNT"
sha() { sha256sum "$1" | cut -d' ' -f1; }
by_serial() {
  local d
  for d in /sys/block/vd*; do
    [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}

D=$(by_serial "$NAME") || { bad "a virtio disk with serial $NAME"; finish; }
ok "the disk is $D"
BEFORE=$(blockdev --getsize64 "$D")
check "mkfs.ext4" mkfs.ext4 -q -F "$D"
check "mount" mount -t ext4 "$D" "$MNT" || finish
: > "$W/fsynced"
i=0 after=0 longest=0
start=$(date +%s)
while :; do
  i=$((i + 1))
  head -c $(((i % 7 + 1) * 16384)) /dev/urandom > "$T/f"
  t0=$(date +%s)
  if ! dd if="$T/f" of="$MNT/f$i" bs=64k conv=fsync status=none; then
    bad "write and fsync f$i"
    break
  fi
  t=$(($(date +%s) - t0))
  [ "$t" -gt "$longest" ] && longest=$t
  echo "f$i $(sha "$T/f")" >> "$W/fsynced"
  [ "$i" = 10 ] && touch "$W/ready"
  if [ -e "$W/recovered" ]; then
    after=$((after + 1))
    [ "$after" -ge 10 ] && break
  fi
  if [ $(($(date +%s) - start)) -gt 600 ]; then
    bad "the host said it recovered within 600 s"
    break
  fi
done
echo "longest write + fsync: ${longest} s (the server was down meanwhile)"
check "files written and fsync'd after the new server took over: $after" [ "$after" -ge 10 ]
check "no I/O error in the kernel log" bash -c '! dmesg | grep -qi "i/o error"'
touch "$W/written"
t=0
while [ ! -e "$W/resized" ] && [ "$t" -lt 300 ]; do sleep 1; t=$((t + 1)); done
want=$(cat "$W/resized" 2>/dev/null || echo none)
t=0
while [ "$(blockdev --getsize64 "$D")" != "$want" ] && [ "$t" -lt 20 ]; do sleep 1; t=$((t + 1)); done
grew() { [ "$(blockdev --getsize64 "$D")" = "$want" ] && [ "$want" != "$BEFORE" ]; }
check "the capacity the host resized to, seen while mounted ($BEFORE -> $want bytes)" grew
check "umount" umount "$MNT"
check "mount again" mount -t ext4 -o ro "$D" "$MNT"
n=0 good=0
while read -r f s; do
  n=$((n + 1))
  [ "$(sha "$MNT/$f")" = "$s" ] && good=$((good + 1))
done < "$W/fsynced"
check "all $n fsync'd files read back in the guest ($good good)" [ "$good" = "$n" ]
umount "$MNT"
finish
