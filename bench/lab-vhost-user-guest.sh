#!/bin/bash
# Guest half of bench/lab-vhost-user.sh (runs as root in the guest of tests/lab/run.sh).
#   lab-vhost-user-guest.sh W NAME RUNTIME_S
# The disks: serial NAME is ucrypt's, NAMEs ucrypt's with one request at a time per queue,
# serial "plain" the raw virtio disk (opened here with dm-crypt from W/dm.table), the other
# vhost-user disk qemu-storage-daemon's. Each cell runs on every disk in turn (slow drift of
# a loaded host then touches all alike). fio JSON files go to W.
set -eu
W=$1 NAME=$2 RT=$3
UC= UC1= QSD= PLAIN=
for d in /sys/block/vd*; do
  case "$(cat "$d/serial" 2>/dev/null)" in
    "$NAME") UC=/dev/${d##*/} ;;
    "${NAME}s") UC1=/dev/${d##*/} ;;
    plain) PLAIN=/dev/${d##*/} ;;
    *) QSD=/dev/${d##*/} ;;
  esac
done
echo "# ucrypt $UC, ucrypt-1 $UC1, qemu-storage-daemon $QSD, plain $PLAIN"
awk -v d="$PLAIN" '{ $7 = d; print }' "$W/dm.table" > /tmp/dm.table
dmsetup create vubench --table "$(cat /tmp/dm.table)"
dmsetup mknodes
cell() { # DEVICE LABEL RW BS QD
  fio --name="$2" --filename="$1" --ioengine=libaio --direct=1 --rw=$3 --bs=$4 \
    --iodepth=$5 --numjobs=1 --time_based --runtime="$RT" --ramp_time=1 --size=200M \
    --output-format=json --output="$W/$2.$3.$4.$5.json" > /dev/null
}
# Every block written once first, so no device pays first-touch costs.
for dev in "$UC" "$UC1" "$QSD" /dev/mapper/vubench; do
  dd if=/dev/zero of="$dev" bs=1M count=200 oflag=direct status=none
done
for j in "randread 4k 1" "randread 4k 32" "randwrite 4k 32" "read 1M 8" "write 1M 8"; do
  cell "$UC" ucrypt $j
  cell "$UC1" ucrypt-1 $j
  cell "$QSD" qsd $j
  cell /dev/mapper/vubench dm-crypt $j
  echo "# $j done"
done
dmsetup remove vubench
