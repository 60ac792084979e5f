#!/bin/bash
# Guest half of bench/lab-blockdev.sh (runs as root in the guest of tests/lab/run.sh).
#   lab-blockdev-guest.sh ATTACH RUNTIME_S OUT_DIR
# One brd ramdisk as backing; aes-xts-plain64 (512-bit key, 4096-byte sectors) over it
# through: ucrypt's ublk front end (inline, and with 2 worker threads), ucrypt's kernel NBD
# front end (1 and 2 connections), and the kernel's own dm-crypt. fio (libaio, direct) runs
# the same six jobs on each; results are fio JSON files in OUT_DIR.
set -eu
ATTACH=$1 RT=$2 OUT=$3
mkdir -p "$OUT"
MIB=256
rmmod brd 2>/dev/null || true  # tests/lab/run.sh loads it with the default 4 MiB disks
modprobe brd rd_nr=1 rd_size=$((MIB * 1024))
# Allocate every ramdisk page up front so no device pays first-touch costs.
dd if=/dev/zero of=/dev/ram0 bs=1M count=$MIB oflag=direct status=none
KEY=$(head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n')
SECTORS=$((MIB * 2048))
T=$(mktemp -d)
echo "0 $SECTORS crypt aes-xts-plain64 $KEY 0 /dev/ram0 0 1 sector_size:4096" > "$T/table"

jobs() { # DEVICE LABEL
  local dev=$1 label=$2
  for j in "randread 4k 1" "randread 4k 32" "randwrite 4k 1" "randwrite 4k 32" "read 1M 8" "write 1M 8"; do
    set -- $j
    fio --name="$label" --filename="$dev" --ioengine=libaio --direct=1 --rw=$1 --bs=$2 \
      --iodepth=$3 --numjobs=1 --time_based --runtime="$RT" --ramp_time=1 \
      --output-format=json --output="$OUT/$label.$1.$2.$3.json" > /dev/null
  done
  echo "# $label done"
}
start() { # FRONT ARGS...
  local front=$1; shift
  rm -f "$T/ready"
  "$ATTACH" "$front" "$T/table" --ready "$T/ready" "$@" > /dev/null 2> "$T/err" &
  PID=$!
  for _ in $(seq 600); do [ -s "$T/ready" ] && break; sleep 0.1; done
  DEV=$(cat "$T/ready")
}
stop() { kill -TERM "$PID"; wait "$PID" || true; }

start ublk --no-recovery; jobs "$DEV" ublk; stop
start ublk --no-recovery --workers 2; jobs "$DEV" ublk-w2; stop
start nbd; jobs "$DEV" nbd; stop
start nbd --conns 2; jobs "$DEV" nbd-c2; stop
dmsetup create ucbench --table "$(cat "$T/table")"; dmsetup mknodes
jobs /dev/mapper/ucbench dm-crypt
dmsetup remove ucbench
nproc | sed 's/^/# vCPUs: /'
