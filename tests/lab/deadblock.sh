#!/bin/bash
# Kernel checks of dead instances' devices and of `resize` on the block front ends. Runs as
# root in the guest of tests/lab/run.sh (Debian's 6.12 kernel: ublk_drv, nbd), started by
# crates/cli/tests/lab_dead_devices.rs:
#   deadblock.sh UCRYPT
# For ublk and kernel NBD each:
#  - `kill -9` of the server under a mounted filesystem: `ls`, `ls --json` and `status`
#    show the instance as dead with its device and the `--recover`/`close` hint; `open` of
#    the same name, and of the same image under another name, are refused (exit 5) and
#    make no second device; `close` is refused while the device is mounted; `open
#    --recover` serves it again (the data intact), then umount and close;
#  - `kill -9` with nothing mounted: `close` removes the device and the directory (exit 0);
#  - `kill -9`, then the instance's runtime directory removed (and then the whole base
#    directory, name locks included): `ls` and `status` find the dead instance through its
#    kernel device, `close` removes the device;
#  - `resize`: kernel NBD shrinks and grows /dev/nbdN (NBD_CMD_RECONFIGURE); ublk on 6.12
#    (no UBLK_CMD_UPDATE_SIZE) is refused while mounted or held open (exit 5, sizes kept),
#    and otherwise re-adds the device at the new size under the same number (shrink, then
#    grow; the filesystem mounts again, intact; recovery after kill -9 still works);
#  - a start-up failure after the device existed (`--pid-file` in a missing directory)
#    leaves no device behind;
#  - root's stable name /dev/ucrypt/NAME: made by open, shown by status, points to the
#    node, mkfs and mount by it, gone after close.
# Prints one "ok - ..." line per check and "N passed, M failed" at the end.
set -u
UCRYPT=$1
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
W=$(mktemp -d /tmp/ucrypt-dead.XXXXXX)
MNT=$W/mnt; mkdir -p "$MNT"
export UCRYPT_RUNTIME_DIR=$W/run

IMG=$W/disk.img
truncate -s 40M "$IMG"
printf 'lab passphrase' > "$W/pass"
"$UCRYPT" luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --sector-size 4096 \
  -d "$W/pass" "$IMG" || { echo "luksFormat failed"; exit 1; }

# Devices of each kind that exist now (ublk: character devices; nbd: configured ones).
count() {
  case $1 in
    ublk) ls /sys/class/ublk-char 2>/dev/null | grep -c '^ublkc' ;;
    nbd) grep -lv '^0$' /sys/block/nbd*/size 2>/dev/null | wc -l ;;
  esac
}
json() { python3 -c 'import json,sys; v=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

open_named() { # FRONT NAME [extra...]: sets DEV and SERVER_PID
  local front=$1 name=$2; shift 2
  "$UCRYPT" open "$IMG" "$name" --device "$front" -d "$W/pass" "$@" > "$W/open.out" 2> "$W/open.err" ||
    { echo "# open $name: $(cat "$W/open.err")"; return 1; }
  DEV=$("$UCRYPT" status --json "$name" | json 'v["node"]')
  SERVER_PID=$("$UCRYPT" status --json "$name" | json 'v["pid"]')
}
kill9() {
  kill -9 "$SERVER_PID"
  while kill -0 "$SERVER_PID" 2>/dev/null; do sleep 0.1; done
  sleep 1
}

dead_round() {
  local F=$1 NAME=dead$1 N before
  open_named "$F" "$NAME" || { bad "$F: open"; return; }
  N=$(basename "$DEV")
  mkfs.ext4 -q -F "$DEV" && mount -t ext4 "$DEV" "$MNT" || { bad "$F: mkfs+mount"; return; }
  head -c 1M /dev/urandom > "$W/a"; cp "$W/a" "$MNT/a"; sync
  kill9
  before=$(count "$F")
  "$UCRYPT" ls > "$W/ls.out" 2> "$W/ls.err"
  sed 's/^/# ls: /' "$W/ls.out" "$W/ls.err"
  check "$F: ls shows $NAME as dead with $DEV" grep -qE "^$NAME .* dead +$DEV " "$W/ls.out"
  check "$F: ls says what to do" grep -q -- "--recover $IMG $NAME" "$W/ls.err"
  "$UCRYPT" ls --json > "$W/ls.json" 2>/dev/null
  check "$F: ls --json: dead, its node" test "$(json '[(e["dead"], e["node"]) for e in v if e["name"]=="'$NAME'"]' < "$W/ls.json")" = "[(True, '$DEV')]"
  "$UCRYPT" status "$NAME" > "$W/st.out" 2>&1; rc=$?
  sed 's/^/# status: /' "$W/st.out"
  check "$F: status of the dead instance exits 4 (got $rc)" test "$rc" = 4
  check "$F: status names $DEV and --recover" sh -c "grep -q '$DEV' '$W/st.out' && grep -q -- '--recover' '$W/st.out'"
  "$UCRYPT" open "$IMG" "$NAME" --device "$F" -d "$W/pass" > /dev/null 2> "$W/err"; rc=$?
  sed 's/^/# open same name: /' "$W/err"
  check "$F: open of the same name is refused (exit $rc, want 5)" test "$rc" = 5
  check "$F: ... naming --recover" grep -q -- "--recover" "$W/err"
  "$UCRYPT" open "$IMG" other$F --device "$F" -d "$W/pass" > /dev/null 2> "$W/err"; rc=$?
  sed 's/^/# open other name: /' "$W/err"
  check "$F: open of the image under another name is refused (exit $rc, want 5)" test "$rc" = 5
  check "$F: ... naming $NAME" grep -q "$NAME" "$W/err"
  check "$F: no second device" test "$(count "$F")" = "$before"
  "$UCRYPT" close "$NAME" > /dev/null 2> "$W/err"; rc=$?
  sed 's/^/# close while mounted: /' "$W/err"
  check "$F: close refused while the dead device is mounted (exit $rc, want 5)" test "$rc" = 5
  check "$F: open --recover" open_named "$F" "$NAME" --recover
  check "$F: same node after --recover" test "$DEV" = "/dev/$N"
  check "$F: data intact after recovery" cmp -s "$MNT/a" "$W/a"
  check "$F: umount" umount "$MNT"
  check "$F: close" "$UCRYPT" close "$NAME"

  # Dead with nothing mounted: close takes the device away.
  open_named "$F" "$NAME" || { bad "$F: reopen"; return; }
  N=$(basename "$DEV")
  kill9
  "$UCRYPT" close "$NAME" > /dev/null 2> "$W/err"; rc=$?
  sed 's/^/# close of the dead: /' "$W/err"
  check "$F: close of the dead instance exits 0 (got $rc)" test "$rc" = 0
  case $F in
    ublk) check "$F: device deleted" test ! -e "/sys/block/$N" ;;
    nbd) check "$F: device disconnected" sh -c "! test -s /sys/block/$N/size || test \$(cat /sys/block/$N/size) = 0" ;;
  esac
  check "$F: directory gone" test ! -e "$UCRYPT_RUNTIME_DIR/$NAME"
  check "$F: ls is empty" test -z "$("$UCRYPT" ls 2>&1)"
  check "$F: the name opens again" open_named "$F" "$NAME"
  "$UCRYPT" close "$NAME"

  # Dead, and its runtime directory removed (the instance's, then the whole base with the
  # name locks): ls and status still find it through the kernel device, and close removes it.
  for gone in instance base; do
    open_named "$F" "$NAME" || { bad "$F: reopen ($gone)"; return; }
    N=$(basename "$DEV")
    kill9
    case $gone in
      instance) rm -rf "${UCRYPT_RUNTIME_DIR:?}/$NAME" ;;
      base) rm -rf "${UCRYPT_RUNTIME_DIR:?}" ;;
    esac
    "$UCRYPT" ls > "$W/ls.out" 2> "$W/ls.err"
    sed 's/^/# ls ('$gone' gone): /' "$W/ls.out" "$W/ls.err"
    check "$F: $gone directory gone: ls shows $NAME dead with $DEV" grep -qE "^$NAME .* dead +$DEV" "$W/ls.out"
    check "$F: $gone directory gone: ls says what to do" sh -c "grep -q -- '--recover' '$W/ls.err' && grep -q 'ucrypt close $NAME' '$W/ls.err'"
    "$UCRYPT" status "$NAME" > "$W/st.out" 2>&1; rc=$?
    check "$F: $gone directory gone: status exits 4 naming $DEV (got $rc)" sh -c "test $rc = 4 && grep -q '$DEV' '$W/st.out'"
    "$UCRYPT" close "$NAME" > /dev/null 2> "$W/err"; rc=$?
    sed 's/^/# close ('$gone' gone): /' "$W/err"
    check "$F: $gone directory gone: close removes the device (exit $rc)" test "$rc" = 0
    case $F in
      ublk) check "$F: $gone directory gone: device deleted" test ! -e "/sys/block/$N" ;;
      nbd) check "$F: $gone directory gone: device disconnected" sh -c "! test -s /sys/block/$N/size || test \$(cat /sys/block/$N/size) = 0" ;;
    esac
    check "$F: $gone directory gone: ls is empty" test -z "$("$UCRYPT" ls 2>&1)"
  done
}

resize_round() {
  local F=$1 NAME=rs$1 N sectors
  truncate -s 40M "$IMG"
  open_named "$F" "$NAME" || { bad "$F: open"; return; }
  N=$(basename "$DEV")
  sectors=$(cat "/sys/block/$N/size")
  if [ "$F" = nbd ]; then
    check "$F: resize --size 40960" "$UCRYPT" resize "$NAME" --size 40960 -d "$W/pass"
    check "$F: /dev/$N shrank to 40960 sectors" test "$(cat /sys/block/$N/size)" = 40960
    check "$F: blockdev --getsize64 agrees" test "$(blockdev --getsize64 "$DEV")" = $((40960 * 512))
    truncate -s 48M "$IMG"
    check "$F: resize to all the device holds" "$UCRYPT" resize "$NAME" -d "$W/pass"
    check "$F: /dev/$N grew by 8 MiB" test "$(cat /sys/block/$N/size)" = $((sectors + 16384))
    check "$F: status agrees" test "$("$UCRYPT" status --json "$NAME" | json 'v["size_sectors"]')" = $((sectors + 16384))
    check "$F: reads to the new end" dd if="$DEV" of=/dev/null bs=1M skip=$(((sectors + 16384) / 2048 - 1)) count=1 status=none
  else
    # 6.12 has no UBLK_CMD_UPDATE_SIZE: the device is added again at the new size, which
    # only a device nobody uses survives.
    mkfs.ext4 -q -F "$DEV" 16M && mount -t ext4 "$DEV" "$MNT" || { bad "$F: mkfs+mount"; return; }
    head -c 1M /dev/urandom > "$W/r"; cp "$W/r" "$MNT/r"
    "$UCRYPT" resize "$NAME" --size 40960 -d "$W/pass" > /dev/null 2> "$W/err"; rc=$?
    sed 's/^/# ublk resize while mounted: /' "$W/err"
    check "$F: resize refused while mounted (exit $rc, want 5)" test "$rc" = 5
    check "$F: ... naming UBLK_CMD_UPDATE_SIZE and the use" sh -c "grep -q UBLK_CMD_UPDATE_SIZE '$W/err' && grep -q 'is in use' '$W/err'"
    check "$F: /dev/$N keeps its size" test "$(cat /sys/block/$N/size)" = "$sectors"
    check "$F: the instance keeps its size" test "$("$UCRYPT" status --json "$NAME" | json 'v["size_sectors"]')" = "$sectors"
    umount "$MNT"
    sleep 60 < "$DEV" & HOLDER=$!
    sleep 1
    "$UCRYPT" resize "$NAME" --size 40960 -d "$W/pass" > /dev/null 2> "$W/err"; rc=$?
    check "$F: resize refused while a process holds $DEV (exit $rc, want 5)" test "$rc" = 5
    kill "$HOLDER"; wait "$HOLDER" 2>/dev/null
    "$UCRYPT" resize "$NAME" --size 40960 -d "$W/pass" > /dev/null 2> "$W/err"; rc=$?
    sed 's/^/# ublk resize unused: /' "$W/err"
    check "$F: resize --size 40960 of the unused device (exit $rc)" test "$rc" = 0
    check "$F: same node /dev/$N" test -b "/dev/$N"
    check "$F: /dev/$N has 40960 sectors" test "$(cat /sys/block/$N/size)" = 40960
    check "$F: status agrees" test "$("$UCRYPT" status --json "$NAME" | json 'v["size_sectors"], v["node"]')" = "(40960, '/dev/$N')"
    check "$F: the stable path still leads to it" test "$(readlink "$UCRYPT_RUNTIME_DIR/$NAME/node")" = "/dev/$N"
    check "$F: the filesystem mounts after the re-add" mount -t ext4 "$DEV" "$MNT"
    check "$F: its file intact" cmp -s "$MNT/r" "$W/r"
    umount "$MNT"
    truncate -s 48M "$IMG"
    check "$F: resize to all the device holds" "$UCRYPT" resize "$NAME" -d "$W/pass"
    check "$F: /dev/$N grew by 8 MiB" test "$(cat /sys/block/$N/size)" = $((sectors + 16384))
    check "$F: reads to the new end" dd if="$DEV" of=/dev/null bs=1M skip=$(((sectors + 16384) / 2048 - 1)) count=1 status=none
    check "$F: the ublk device still recovers after a kill -9" sh -c "kill -9 $(cat "$UCRYPT_RUNTIME_DIR/$NAME/pid") && sleep 1 && '$UCRYPT' open '$IMG' '$NAME' --device ublk -d '$W/pass' --recover > /dev/null 2>&1"
  fi
  "$UCRYPT" close "$NAME"
  truncate -s 40M "$IMG"
}

# Root's stable names, /dev/ucrypt/NAME (the runtime directory /run/ucrypt): made by open,
# shown by status, usable to mount, gone after close.
stable_round() {
  local F=$1 NAME=st$1 L
  L=/dev/ucrypt/$NAME
  (
    unset UCRYPT_RUNTIME_DIR
    open_named "$F" "$NAME" || exit 1
    echo "$DEV" > "$W/stable.dev"
    "$UCRYPT" status "$NAME" > "$W/st.out" 2>&1
    grep -q "stable path: $L" "$W/open.err" || echo "# open said: $(cat "$W/open.err")"
  ) || { bad "$F: open as root's instance"; return; }
  DEV=$(cat "$W/stable.dev")
  sed 's/^/# status: /' "$W/st.out"
  check "$F: $L exists after open" test -L "$L"
  check "$F: $L points to $DEV" test "$(readlink "$L")" = "$DEV"
  check "$F: open names $L" grep -q "stable path: $L" "$W/open.err"
  check "$F: status shows $L" grep -qE "^  link: +$L\$" "$W/st.out"
  check "$F: mkfs by $L" mkfs.ext4 -q -F "$L"
  check "$F: mount by $L" mount -t ext4 "$L" "$MNT"
  echo "by the stable name" > "$MNT/s"
  check "$F: umount" umount "$MNT"
  check "$F: mount by $L again: the file is there" sh -c "mount -t ext4 -o ro '$L' '$MNT' && grep -q 'by the stable name' '$MNT/s' && umount '$MNT'"
  check "$F: close" env -u UCRYPT_RUNTIME_DIR "$UCRYPT" close "$NAME"
  check "$F: $L gone after close" test ! -e "$L" -a ! -L "$L"
}

failed_start_round() {
  local F=$1 before
  before=$(count "$F")
  "$UCRYPT" open "$IMG" fail$F --device "$F" -d "$W/pass" --pid-file "$W/missing/dir/pid" \
    > /dev/null 2> "$W/err"; rc=$?
  sed 's/^/# failed start: /' "$W/err"
  check "$F: open with an unwritable --pid-file fails (exit $rc)" test "$rc" != 0
  sleep 1
  check "$F: no device left behind ($(count "$F") vs $before)" test "$(count "$F")" = "$before"
  check "$F: no instance left behind" test -z "$("$UCRYPT" ls 2>&1)"
}

for F in ublk nbd; do
  dead_round "$F"
  resize_round "$F"
  failed_start_round "$F"
  stable_round "$F"
done
dmesg | grep -iE "ublk|nbd" | tail -20 | sed 's/^/# dmesg: /'
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
