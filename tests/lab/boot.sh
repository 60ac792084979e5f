#!/bin/bash
# A real boot with systemd as PID 1: an /etc/ucrypttab line opened by ucrypt-generator's
# unit, the node named /dev/ucrypt/NAME by udev's rule, and an fstab line mounting it.
# Runs in the guest of tests/lab/run.sh with LAB_EXEC=1 (this script is PID 1), started by
# crates/cli/tests/lab_boot.rs:
#   boot.sh UCRYPT REPO
# Before systemd: ucrypt, the generator, the unit template and the udev rule installed
# where the README says (the guest's root is a writable overlay); a LUKS2 image with an
# ext4 file system; /etc/ucrypttab and /etc/fstab. Then exec systemd --unit=lab.target,
# which pulls in udev, cryptsetup.target and the mount; lab-check.service reports (one
# "ok - ..." line per check, "N passed, M failed"), stops the mount and the volume, writes
# the run's status and powers off.
set -u
UCRYPT=$1 REPO=$2
L=/run/ucrypt-lab
fail() { echo "boot.sh: $*"; echo 1 > $L/status; cut -d" " -f1 /proc/uptime > $L/finished; sync; echo o > /proc/sysrq-trigger; sleep 60; }

install -D -m 0755 "$UCRYPT" /usr/local/bin/ucrypt || fail "install ucrypt"
install -D -m 0755 "$REPO/systemd/ucrypt-generator" /usr/local/lib/systemd/system-generators/ucrypt-generator
install -D -m 0644 "$REPO/systemd/ucrypt@.service" /usr/local/lib/systemd/system/ucrypt@.service
install -D -m 0644 "$REPO/udev/99-ucrypt.rules" /usr/local/lib/udev/rules.d/99-ucrypt.rules

mkdir -p /var/lib/lab /etc/keys /srv/data
truncate -s 48M /var/lib/lab/data.img
head -c 64 /dev/urandom > /etc/keys/data
ucrypt luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d /etc/keys/data /var/lib/lab/data.img ||
  fail "luksFormat"
# The file system, made before boot through ucrypt's own link (no udev yet).
ucrypt open /var/lib/lab/data.img data --device ublk --key-file /etc/keys/data > /dev/null || fail "open"
mkfs.ext4 -q /dev/ucrypt/data && mount /dev/ucrypt/data /srv/data && echo "made before boot" > /srv/data/f &&
  umount /srv/data || fail "mkfs"
ucrypt close data || fail "close"

echo "data /var/lib/lab/data.img /etc/keys/data luks,x-ucrypt-device=ublk" > /etc/ucrypttab
echo "/dev/ucrypt/data /srv/data ext4 defaults,x-systemd.requires=ucrypt@data.service 0 0" > /etc/fstab

cat > /usr/local/sbin/lab-check <<'CHECK'
#!/bin/bash
exec >> /run/ucrypt-lab/output 2>&1
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
echo "# systemd $(systemctl --version | head -1), PID 1: $(cat /proc/1/comm)"
check "PID 1 is systemd" test "$(cat /proc/1/comm)" = systemd
check "the generator wrote ucrypt@data.service" test -f /run/systemd/generator/ucrypt@data.service
check "ucrypt@data.service is active" test "$(systemctl is-active ucrypt@data.service)" = active
MAIN=$(systemctl show -P MainPID ucrypt@data.service)
check "its main process ($MAIN) is the instance's server" bash -c "ucrypt status data | grep -q 'pid $MAIN'"
NODE=$(ucrypt status data --json | sed -n 's/.*"node": *"\([^"]*\)".*/\1/p')
check "/dev/ucrypt/data -> $NODE" test "$(readlink -f /dev/ucrypt/data)" = "$NODE"
check "udev made the link (DEVLINKS of $NODE)" bash -c "udevadm info --query=property '$NODE' | grep -q '^DEVLINKS=.*/dev/ucrypt/data'"
check "dev-ucrypt-data.device is active" test "$(systemctl is-active dev-ucrypt-data.device)" = active
check "cryptsetup.target is active" test "$(systemctl is-active cryptsetup.target)" = active
check "srv-data.mount (fstab: /dev/ucrypt/data) is active" test "$(systemctl is-active srv-data.mount)" = active
check "the file made before boot is there" grep -qx "made before boot" /srv/data/f
systemctl status --no-pager ucrypt@data.service srv-data.mount 2>&1 | sed 's/^/# /' | head -30
systemctl stop srv-data.mount ucrypt@data.service
check "stopped: the unit is inactive" test "$(systemctl is-active ucrypt@data.service)" = inactive
check "stopped: no instance left (ExecStop=ucrypt close)" test -z "$(ucrypt ls 2>&1)"
check "stopped: $NODE is gone" test ! -e "$NODE"
check "stopped: /dev/ucrypt/data is gone" test ! -L /dev/ucrypt/data
systemctl list-units --failed --no-pager 2>&1 | sed 's/^/# failed: /' | head -20
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]; echo $? > /run/ucrypt-lab/status
cut -d" " -f1 /proc/uptime > /run/ucrypt-lab/finished
sync; echo o > /proc/sysrq-trigger
CHECK
chmod 755 /usr/local/sbin/lab-check

cat > /etc/systemd/system/lab-check.service <<'UNIT'
[Unit]
Description=kernel lab: check the boot
DefaultDependencies=no
Wants=srv-data.mount cryptsetup.target
After=srv-data.mount cryptsetup.target ucrypt@data.service systemd-udev-trigger.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/lab-check
UNIT
cat > /etc/systemd/system/lab.target <<'UNIT'
[Unit]
Description=kernel lab: a boot with one ucrypttab volume
Wants=systemd-udevd.service systemd-udev-trigger.service systemd-journald.service cryptsetup.target srv-data.mount lab-check.service
UNIT

# If systemd never gets to the check, the run still ends with a status.
( sleep 600; echo "boot.sh: lab-check did not finish within 600 s"; echo 1 > $L/status
  cut -d" " -f1 /proc/uptime > $L/finished; sync; echo o > /proc/sysrq-trigger ) &
echo "# exec systemd"
exec /lib/systemd/systemd --unit=lab.target --show-status=1 --log-target=console --log-level=info
