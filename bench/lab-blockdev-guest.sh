#!/bin/bash
# Guest half of bench/lab-blockdev.sh (runs as root in the guest of tests/lab/run.sh).
#   lab-blockdev-guest.sh ATTACH RUNTIME_S OUT_DIR [CIPHERS] [DEVICES] [ROUNDS]
# One brd ramdisk as backing; each cipher of CIPHERS (default "aes null": aes-xts-plain64
# with a 512-bit key, and cipher_null-ecb with no key, both with 4096-byte sectors) over it
# through each of DEVICES (default "ublk ublk-w2 nbd nbd-c2 dm-crypt"): ucrypt's ublk front
# end (requests run on the queue thread, and with 2 worker threads), ucrypt's kernel NBD
# front end (1 and 2 connections), and the kernel's own dm-crypt, given the same table
# line, each cell on every device in turn. Every ublk variant opens the ramdisk O_DIRECT,
# as `ucrypt open` does a block device. Also: ublk-i (the table with no_read_workqueue
# no_write_workqueue: crypto inline instead of the automatic placement), ublk-b (the
# ramdisk through the page cache), ublk-s1 (one worker taking requests only when several
# are ready at once: UblkOptions::spill). Controls that take the volume out: ublk-raw
# (the ramdisk served as it is, no cipher and no engine) and ublk-zero (nothing served at
# all: zeros read, writes dropped), both spilling as ublk-s1 does, beside the kernel's
# dm-linear (the ramdisk through device-mapper, no crypt target). ublk-u and ublk-zero-u:
# ublk-s1 and ublk-zero with the queue threads free to run on any CPU (--unpin-queues);
# ublk-up and ublk-zero-up: those, polling for POLL_US (default 200) microseconds after
# each round before they sleep (UblkOptions::poll); ublk-upi: ublk-up without workers.
# Beside each fio JSON, LABEL.RW.BS.QD.rN.cpu holds the guest's busy CPU ticks during the
# cell (every process and the kernel), the tick rate and the cell's seconds. fio (libaio,
# direct) runs the same six jobs on each, ROUNDS times (default 1; the device order rotates
# each round); results are fio JSON files in OUT_DIR, named LABEL.RW.BS.QD.rN.json (LABEL
# is the device, with "null-" before it for the null cipher; N the round).
# Which cipher code each side ran goes to OUT_DIR/ciphers.txt: the kernel's drivers from
# /proc/crypto while dm-crypt holds the table, and the guest CPU's AES flags.
set -eu
ATTACH=$1 RT=$2 OUT=$3
CIPHERS=${4:-aes null}
DEVICES=${5:-ublk ublk-w2 nbd nbd-c2 dm-crypt}
ROUNDS=${6:-1}
mkdir -p "$OUT"
MIB=256
rmmod brd 2>/dev/null || true  # tests/lab/run.sh loads it with the default 4 MiB disks
modprobe brd rd_nr=1 rd_size=$((MIB * 1024))
# Allocate every ramdisk page up front so no device pays first-touch costs.
dd if=/dev/zero of=/dev/ram0 bs=1M count=$MIB oflag=direct status=none
KEY=$(head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n')
SECTORS=$((MIB * 2048))
T=$(mktemp -d)

busy() { # the guest's busy CPU time so far, in clock ticks (all CPUs, every process and the kernel)
  awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat
}
cell() { # DEVICE LABEL RW BS QD
  local b0; b0=$(busy)
  fio --name="$2" --filename="$1" --ioengine=libaio --direct=1 --rw=$3 --bs=$4 \
    --iodepth=$5 --numjobs=1 --time_based --runtime="$RT" --ramp_time=1 \
    --output-format=json --output="$OUT/$2.$3.$4.$5.r$ROUND.json" > /dev/null
  # Busy CPU of the cell (ramp included) over its wall time: how many CPUs it kept busy.
  echo "$(( $(busy) - b0 )) $(getconf CLK_TCK) $((RT + 1))" > "$OUT/$2.$3.$4.$5.r$ROUND.cpu"
}
start() { # FRONT ARGS...
  local front=$1; shift
  rm -f "$T/ready"
  "$ATTACH" "$front" "${TABLE:-$T/table}" --ready "$T/ready" "$@" > /dev/null 2> "$T/err" &
  PID=$!
  for _ in $(seq 600); do [ -s "$T/ready" ] && break; sleep 0.1; done
  [ -s "$T/ready" ] || { echo "attach $front $*: did not start: $(cat "$T/err")" >&2; exit 1; }
  DEV=$(cat "$T/ready")
}
stop() { kill -TERM "$PID"; wait "$PID" || true; }

{
  echo "# guest CPU AES flags: $(grep -m1 -o -w -E 'aes|vaes|avx2|avx512f|vpclmulqdq|pclmulqdq' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  grep -m1 '^model name' /proc/cpuinfo
} > "$OUT/ciphers.txt"
# What a switch between two processes costs in this guest against one between two threads
# of a process (a ublk server and its client are two processes; dm-crypt's kworker borrows
# the client's address space): perf's pipe ping-pong, on one vCPU and across both.
if command -v perf > /dev/null; then
  for mode in processes threads; do
    for cpus in 0 0,1; do
      flag=; [ $mode = threads ] && flag=-T
      us=$(taskset -c $cpus perf bench sched pipe $flag -l 20000 2>&1 | awk '/usecs\/op/{print $1}')
      echo "# pipe ping-pong, $mode, CPUs $cpus: $us us per round trip"
    done
  done >> "$OUT/ciphers.txt"
fi
read -r -a DEVS <<< "$DEVICES"
for ROUND in $(seq "$ROUNDS"); do
for c in $CIPHERS; do
  case $c in
    aes) spec="aes-xts-plain64 $KEY" prefix= ;;
    null) spec="cipher_null-ecb -" prefix=null- ;;
    *) echo "unknown cipher $c" >&2; exit 1 ;;
  esac
  echo "0 $SECTORS crypt $spec 0 /dev/ram0 0 1 sector_size:4096" > "$T/table"
  # The same with dm-crypt's inline flags (crypto on the thread that took the request).
  echo "0 $SECTORS crypt $spec 0 /dev/ram0 0 3 sector_size:4096 no_read_workqueue no_write_workqueue" > "$T/table-i"
  # Each cell on every device in turn (a device is attached for its cell and detached
  # after it), so that a loaded host's drift touches every device alike.
  for j in "randread 4k 1" "randread 4k 32" "randwrite 4k 1" "randwrite 4k 32" "read 1M 8" "write 1M 8"; do
    n=${#DEVS[@]}
    for i in $(seq 0 $((n - 1))); do
      # Rotate the order each round: no device always runs first (or right after another).
      d=${DEVS[$(( (i + ROUND - 1) % n ))]}
      case $d in
        ublk) start ublk --no-recovery --direct ;;
        ublk-w2) start ublk --no-recovery --direct --workers 2 ;;
        ublk-s1) start ublk --no-recovery --direct --workers 1 --spill ;;
        ublk-raw) start ublk --no-recovery --direct --workers 1 --spill --export raw ;;
        ublk-u) start ublk --no-recovery --direct --workers 1 --spill --unpin-queues ;;
        ublk-up) start ublk --no-recovery --direct --workers 1 --spill --unpin-queues --poll-us "${POLL_US:-200}" ;;
        ublk-upi) start ublk --no-recovery --direct --unpin-queues --poll-us "${POLL_US:-200}" ;;
        ublk-zero-up) start ublk --no-recovery --direct --workers 1 --spill --export zero --unpin-queues --poll-us "${POLL_US:-200}" ;;
        ublk-zero-u) start ublk --no-recovery --direct --workers 1 --spill --export zero --unpin-queues ;;
        ublk-zero) start ublk --no-recovery --direct --workers 1 --spill --export zero ;;
        dm-linear)
          dmsetup create ucbench --table "0 $SECTORS linear /dev/ram0 0"; dmsetup mknodes
          cell /dev/mapper/ucbench "${prefix}dm-linear" $j
          dmsetup remove ucbench
          continue ;;
        ublk-i) TABLE=$T/table-i start ublk --no-recovery --direct ;;
        ublk-b) start ublk --no-recovery ;;
        nbd) start nbd ;;
        nbd-c2) start nbd --conns 2 ;;
        dm-crypt)
          dmsetup create ucbench --table "$(cat "$T/table")"; dmsetup mknodes
          # The drivers the kernel's crypto API picked for this table (skcipher instances).
          if [ "$j" = "randread 4k 1" ] && [ "$ROUND" = 1 ]; then
            { echo "# $c: kernel dm-crypt table: $(dmsetup table ucbench | awk '{print $4}')"
              awk '/^name/{n=$3} /^driver/{d=$3} /^priority/{p=$3} /^type/{if ($3=="skcipher") print "#   " n " -> " d " (priority " p ")"}' /proc/crypto |
                grep -E 'xts|ecb|null' | sort -u; } >> "$OUT/ciphers.txt"
          fi
          cell /dev/mapper/ucbench "${prefix}dm-crypt" $j
          dmsetup remove ucbench
          continue ;;
        *) echo "unknown device $d" >&2; exit 1 ;;
      esac
      cell "$DEV" "$prefix$d" $j; stop
    done
    echo "# round $ROUND: $c $j done"
  done
done
done
nproc | sed 's/^/# vCPUs: /'
