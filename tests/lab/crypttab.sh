#!/bin/bash
# Two volumes of one crypttab on a real kernel, with the block front ends. Runs as root in
# the guest of tests/lab/run.sh (Debian's 6.12 kernel: ublk_drv, nbd), started by
# crates/cli/tests/lab_crypttab.rs:
#   crypttab.sh UCRYPT
# One LUKS2 image named by path (x-ucrypt-device=ublk), one on a loop device named by its
# LUKS UUID (found through blkid: the guest has no udev, so no /dev/disk/by-uuid), opened
# by `ucrypt crypttab open`; mkfs, mount, write, umount; `crypttab ls` says open; `crypttab
# close` is refused while one is mounted, then closes both and their devices go; opened
# again, the files are there; a `--notify` open sends READY=1 with the device up and
# stops on `close`.
# Prints one "ok - ..." line per check and "N passed, M failed" at the end.
set -u
UCRYPT=$1
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
W=$(mktemp -d /tmp/ucrypt-crypttab.XXXXXX)
export UCRYPT_RUNTIME_DIR=$W/run
mkdir -p "$W/ma" "$W/mb"

truncate -s 48M "$W/a.img" "$W/b.img"
head -c 64 /dev/urandom > "$W/a.key"
printf 'passphrase b' > "$W/b.key"
UUID=6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab
"$UCRYPT" luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d "$W/a.key" "$W/a.img" &&
  "$UCRYPT" luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --uuid "$UUID" \
    -d "$W/b.key" "$W/b.img" || { echo "luksFormat failed"; exit 1; }
LOOP=$(losetup -f --show "$W/b.img") || { echo "losetup failed"; exit 1; }

cat > "$W/tab" <<TAB
# two volumes, two front ends
vola  $W/a.img      $W/a.key  luks,x-ucrypt-device=ublk,discard
volb  UUID=$UUID    $W/b.key  luks,x-ucrypt-device=nbd
TAB
T=$W/tab
ct() { "$UCRYPT" crypttab "$1" --file "$T" "${@:2}"; }

check "crypttab open prints two nodes" bash -c "'$UCRYPT' crypttab open --file '$T' > '$W/nodes' 2> '$W/err'"
sed 's/^/# open: /' "$W/err"
A=$(sed -n 1p "$W/nodes"); B=$(sed -n 2p "$W/nodes")
check "vola is a ublk device ($A)" test -b "$A" -a "${A#/dev/ublkb}" != "$A"
check "volb is a kernel NBD device ($B)" test -b "$B" -a "${B#/dev/nbd}" != "$B"
check "volb's device resolved by UUID to $LOOP" bash -c "'$UCRYPT' status volb | grep -q '$LOOP'"
check "ls: both open" test "$(ct ls | awk 'NR>1 {print $NF}' | tr '\n' ' ')" = "open open "
mkfs.ext4 -q -F "$A" && mkfs.ext4 -q -F "$B" || bad "mkfs"
mount "$A" "$W/ma" && mount "$B" "$W/mb" || bad "mount"
echo "file on a" > "$W/ma/f" && echo "file on b" > "$W/mb/f" && sync
umount "$W/mb"
check "close refused while vola is mounted" bash -c "! '$UCRYPT' crypttab close --file '$T' 2> '$W/err'"
sed 's/^/# close: /' "$W/err"
umount "$W/ma"
check "close after umount: both closed" ct close
check "ls: both closed" test "$(ct ls | awk 'NR>1 {print $NF}' | tr '\n' ' ')" = "closed closed "
check "no instance left" test -z "$("$UCRYPT" ls 2>&1)"
check "the ublk device is gone" test ! -e "$A"
check "the NBD device is disconnected" test "$(cat /sys/block/$(basename "$B")/size)" = 0

# Again, by name in the other order: the files are back.
"$UCRYPT" crypttab open --file "$T" volb vola > "$W/nodes" 2> "$W/err" || bad "reopen: $(cat "$W/err")"
B=$(sed -n 1p "$W/nodes"); A=$(sed -n 2p "$W/nodes")
mount "$A" "$W/ma" && mount "$B" "$W/mb" || bad "remount"
check "vola's file is back" grep -qx "file on a" "$W/ma/f"
check "volb's file is back" grep -qx "file on b" "$W/mb/f"
umount "$W/ma" "$W/mb"
check "closed again" ct close

# --notify: READY=1 once /dev/ublkbN exists; the process stays the server until close.
python3 - "$W/notify" > "$W/ready" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(300)
print(s.recv(4096).decode(), flush=True)
PY
LISTENER=$!
for _ in $(seq 50); do [ -S "$W/notify" ] && break; sleep 0.1; done
NOTIFY_SOCKET=$W/notify "$UCRYPT" crypttab open --notify --file "$T" vola < /dev/null > /dev/null 2> "$W/err" &
SERVER=$!
wait "$LISTENER"
check "READY=1 sent" grep -q '^READY=1' "$W/ready"
DEV=$(sed -n 's/^STATUS=serving //p' "$W/ready")
check "the device named in STATUS= ($DEV) exists when READY=1 arrives" test -b "$DEV"
check "the --notify process is the server" bash -c "'$UCRYPT' status vola | grep -q 'pid $SERVER'"
"$UCRYPT" close vola
wait "$SERVER"
check "--notify server exits 0 after close" test $? = 0
sed 's/^/# notify: /' "$W/err"

losetup -d "$LOOP"
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
