#!/bin/bash
# /dev/ucrypt/NAME made by udev (udev/99-ucrypt.rules) on a real kernel. Runs as root in
# the guest of tests/lab/run.sh, which has no udev of its own: this script starts the
# host's systemd-udevd with the repository's rule, its PROGRAM pointed at the binary under
# test. Started by crates/cli/tests/lab_udev.rs:
#   udev.sh UCRYPT RULES
# Without udevd first (ucrypt's own link is the fallback), then with it: a ublk and a
# kernel NBD instance get the link from udev (DEVLINKS and UCRYPT_NAME in udev's
# database, `udevadm test` shows it), the link comes back on a change event after it is
# removed, and goes when the instance closes.
# Prints one "ok - ..." line per check and "N passed, M failed" at the end.
set -u
UCRYPT=$1 RULES=$2
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
W=$(mktemp -d /tmp/ucrypt-udev.XXXXXX)
unset UCRYPT_RUNTIME_DIR
truncate -s 32M "$W/a.img" "$W/b.img"
printf 'passphrase' > "$W/key"
for i in a b; do
  "$UCRYPT" luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d "$W/key" "$W/$i.img" ||
    { echo "luksFormat failed"; exit 1; }
done
op() { "$UCRYPT" open "$1" "$2" --device "$3" --key-file "$W/key" 2> "$W/err"; }
target() { readlink -f "/dev/ucrypt/$1"; }

# No udevd: ucrypt's own link.
A=$(op "$W/a.img" fb ublk) || bad "open without udev: $(cat "$W/err")"
check "without udev: /dev/ucrypt/fb -> $A (ucrypt's own link)" test "$(target fb)" = "$A"
"$UCRYPT" close fb
check "without udev: the link goes on close" test ! -e /dev/ucrypt/fb -a ! -L /dev/ucrypt/fb

# udevd with the rule (PROGRAM: the binary under test).
mkdir -p /run/udev/rules.d
sed "s|/usr/local/bin/ucrypt|$UCRYPT|" "$RULES" > /run/udev/rules.d/99-ucrypt.rules
/lib/systemd/systemd-udevd --daemon --resolve-names=never 2> "$W/udevd.err" ||
  { echo "systemd-udevd did not start: $(cat "$W/udevd.err")"; exit 1; }
udevadm settle --timeout=60
settle() { udevadm settle --timeout=60; }

A=$(op "$W/a.img" ua ublk) || bad "open ublk: $(cat "$W/err")"
settle
KA=$(basename "$A")
check "ublk: /dev/ucrypt/ua -> $A" test "$(target ua)" = "$A"
udevadm info --query=property "$A" > "$W/props"
sed 's/^/# ua: /' "$W/props" | grep -E 'DEVLINKS|UCRYPT' 
check "ublk: udev's database has the link (DEVLINKS)" grep -q '^DEVLINKS=.*/dev/ucrypt/ua' "$W/props"
check "ublk: UCRYPT_NAME=ua" grep -qx 'UCRYPT_NAME=ua' "$W/props"
udevadm test --action=change "/sys/class/block/$KA" > "$W/test" 2>&1
check "udevadm test: the rule's PROGRAM names the device" grep -q 'ucrypt/ua' "$W/test"
grep -E "99-ucrypt|ucrypt/ua" "$W/test" | head -5 | sed 's/^/# udevadm test: /'
rm -f /dev/ucrypt/ua
udevadm trigger --action=change "$A"
settle
check "ublk: a change event puts the link back" test "$(target ua)" = "$A"
check "ucrypt udev-name $KA says ua" test "$("$UCRYPT" udev-name "$KA")" = ua
check "ucrypt udev-name of a device no instance serves fails" bash -c "! '$UCRYPT' udev-name loop7"

B=$(op "$W/b.img" ub nbd) || bad "open nbd: $(cat "$W/err")"
settle
check "nbd: /dev/ucrypt/ub -> $B" test "$(target ub)" = "$B"
check "nbd: udev's database has the link" bash -c "udevadm info --query=property '$B' | grep -q '^DEVLINKS=.*/dev/ucrypt/ub'"

mkfs.ext4 -q -F /dev/ucrypt/ua && mkdir -p "$W/m" && mount /dev/ucrypt/ua "$W/m" &&
  echo hi > "$W/m/f" && umount "$W/m"
check "mkfs and mount through /dev/ucrypt/ua" test $? = 0
settle
check "ublk: the link survives the file system's change events" test "$(target ua)" = "$A"

"$UCRYPT" close ua && "$UCRYPT" close ub
settle
check "ublk: the link goes on close" test ! -L /dev/ucrypt/ua
check "nbd: the link goes on close" test ! -L /dev/ucrypt/ub
check "nbd: udev no longer links $B" bash -c "! udevadm info --query=property '$B' | grep -q 'ucrypt/ub'"

udevadm control --exit
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
