#!/bin/bash
# Guest half of bench/lab-vhost-user.sh (runs as root in the guest of tests/lab/run.sh).
#   lab-vhost-user-guest.sh W NAME RUNTIME_S
# The disks: serial NAME is ucrypt's, serial "plain" the raw virtio disk (opened here with
# dm-crypt from W/dm.table), the other vhost-user disk qemu-storage-daemon's. fio JSON files
# go to W.
set -eu
W=$1 NAME=$2 RT=$3
UC= QSD= PLAIN=
for d in /sys/block/vd*; do
  case "$(cat "$d/serial" 2>/dev/null)" in
    "$NAME") UC=/dev/${d##*/} ;;
    plain) PLAIN=/dev/${d##*/} ;;
    *) QSD=/dev/${d##*/} ;;
  esac
done
echo "# ucrypt $UC, qemu-storage-daemon $QSD, plain $PLAIN"
awk -v d="$PLAIN" '{ $7 = d; print }' "$W/dm.table" > /tmp/dm.table
dmsetup create vubench --table "$(cat /tmp/dm.table)"
dmsetup mknodes
run() { # DEVICE LABEL
  local dev=$1 label=$2
  for j in "randread 4k 1" "randread 4k 32" "randwrite 4k 32" "read 1M 8" "write 1M 8"; do
    set -- $j
    fio --name="$label" --filename="$dev" --ioengine=libaio --direct=1 --rw=$1 --bs=$2 \
      --iodepth=$3 --numjobs=1 --time_based --runtime="$RT" --ramp_time=1 --size=200M \
      --output-format=json --output="$W/$label.$1.$2.$3.json" > /dev/null
  done
  echo "# $label done"
}
# Every block written once first, so no device pays first-touch costs.
for dev in "$UC" "$QSD" /dev/mapper/vubench; do
  dd if=/dev/zero of="$dev" bs=1M count=200 oflag=direct status=none
done
run "$UC" ucrypt
run "$QSD" qsd
run /dev/mapper/vubench dm-crypt
dmsetup remove vubench
