#!/usr/bin/env bash
# fio (nbd engine, unix socket) against ucrypt and its userspace peers, side by side in one
# run, on one image size and one machine: every number below is only comparable with the
# others of the same run (see BENCHMARKING.md).
#
#   bench/nbd-fio.sh [--quick]         RUNTIME=5 SIZE=512M UCRYPT=target/release/ucrypt
#                                      SERVERS_ONLY='ucrypt-xts nbdkit-luks' ONLY='1M|qd32'
#
# Servers: ucrypt --raw (the device as it is: the ceiling for ucrypt's own server),
# ucrypt aes-xts-plain64 (512-bit key, 4096-byte sectors), nbdkit file + luks filter
# (LUKS1, aes-xts-plain64 512-bit, made by qemu-img), nbdkit memory, qemu-nbd raw,
# qemu-nbd luks, nbdkit null (the client and socket ceiling). Workloads: 4k randread depth
# 1 and 32, 4k randwrite depth 32, 64k randread depth 8, 1M sequential read and write
# depth 4, and 4k randread depth 32 over 2 connections. Printed: IOPS, MiB/s, server CPU
# seconds per GiB moved, and ratios against ucrypt raw and nbdkit+luks.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-5}
SIZE=${SIZE:-512M}
[ "${1:-}" = "--quick" ] && { RUNTIME=2; SIZE=128M; }
UCRYPT=${UCRYPT:-target/release/ucrypt}
for t in fio nbdkit qemu-nbd qemu-img python3; do
  command -v "$t" >/dev/null || { echo "nbd-fio: $t is missing (run scripts/setup.sh)" >&2; exit 1; }
done
[ -x "$UCRYPT" ] || { echo "nbd-fio: build first: cargo build --release -p ucrypt-cli" >&2; exit 1; }

# Images on tmpfs (a ramdisk, like the kernel's brd) so the servers are measured, not the
# disk; BENCH_DIR=/var/tmp measures a real filesystem instead.
W=$(mktemp -d "${BENCH_DIR:-/dev/shm}/ucrypt-nbd-fio.XXXXXX")
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
SOCK=$W/nbd.sock
PASS=benchmark-passphrase

echo "nbd-fio: preparing $SIZE images in $W (runtime ${RUNTIME}s per cell)" >&2
truncate -s "$SIZE" "$W/plain.img"
BYTES=$(stat -c %s "$W/plain.img")
KEY=$(head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "0 $((BYTES / 512)) crypt aes-xts-plain64 $KEY 0 $W/plain.img 0 1 sector_size:4096" > "$W/table"
# qemu-img makes LUKS1 with aes-256-xts-plain64 (a 512-bit key), what nbdkit's filter reads.
qemu-img create -q -f luks --object secret,id=s0,data=$PASS -o key-secret=s0,iter-time=10 \
  "$W/luks.img" "$SIZE"
# Fill both with data so reads are of written blocks, not holes.
dd if=/dev/urandom of="$W/plain.img" bs=1M count=$((BYTES >> 20)) conv=notrunc status=none
qemu-io --object secret,id=s0,data=$PASS --image-opts \
  "driver=luks,key-secret=s0,file.filename=$W/luks.img" -c "write -P 0x5a 0 $SIZE" >/dev/null

wait_ready() { # pid file and socket
  for _ in $(seq 200); do [ -s "$W/pid" ] && [ -S "$SOCK" ] && return 0; sleep 0.05; done
  echo "nbd-fio: server did not start" >&2; exit 1
}
start() { # name
  rm -f "$SOCK" "$W/pid"
  case $1 in
    ucrypt-raw)  "$UCRYPT" open --table-file "$W/table" --raw --socket "$SOCK" --pid-file "$W/pid" >/dev/null & ;;
    ucrypt-xts)  "$UCRYPT" open --table-file "$W/table" --socket "$SOCK" --pid-file "$W/pid" >/dev/null & ;;
    nbdkit-luks) nbdkit -f -U "$SOCK" -P "$W/pid" --filter=luks file "$W/luks.img" passphrase=$PASS & ;;
    nbdkit-mem)  nbdkit -f -U "$SOCK" -P "$W/pid" memory "$SIZE" & ;;
    nbdkit-null) nbdkit -f -U "$SOCK" -P "$W/pid" null "$SIZE" & ;;
    qemu-raw)    qemu-nbd -t -e 4 -k "$SOCK" --pid-file "$W/pid" -f raw "$W/plain.img" & ;;
    qemu-luks)   qemu-nbd -t -e 4 -k "$SOCK" --pid-file "$W/pid" --object secret,id=s0,data=$PASS \
                   --image-opts "driver=luks,key-secret=s0,file.filename=$W/luks.img" & ;;
  esac
  SERVER_PID=$!
  wait_ready
  SERVER_PID=$(cat "$W/pid")
}
stop() { kill "$SERVER_PID" 2>/dev/null || true; wait 2>/dev/null || true; SERVER_PID=; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER_PID/stat"; }

# name rw bs depth jobs
WORKLOADS=(
  "4k-randread-qd1 randread 4k 1 1"
  "4k-randread-qd32 randread 4k 32 1"
  "4k-randwrite-qd32 randwrite 4k 32 1"
  "64k-randread-qd8 randread 64k 8 1"
  "1M-read-qd4 read 1M 4 1"
  "1M-write-qd4 write 1M 4 1"
  "4k-randread-qd32-2conn randread 4k 32 2"
)
SERVERS=(ucrypt-raw ucrypt-xts nbdkit-luks nbdkit-mem qemu-raw qemu-luks nbdkit-null)
# Subsets: SERVERS_ONLY="ucrypt-xts nbdkit-luks" ONLY=1M-read (a grep -E pattern on names).
[ -n "${SERVERS_ONLY:-}" ] && read -r -a SERVERS <<< "$SERVERS_ONLY"
if [ -n "${ONLY:-}" ]; then
  kept=(); for w in "${WORKLOADS[@]}"; do grep -qE "${ONLY}" <<< "${w%% *}" && kept+=("$w"); done
  WORKLOADS=("${kept[@]}")
fi
HZ=$(getconf CLK_TCK)
: > "$W/results"
for s in "${SERVERS[@]}"; do
  start "$s"
  for w in "${WORKLOADS[@]}"; do
    set -- $w
    t0=$(cpu_ticks)
    fio --name="$1" --ioengine=nbd --uri="nbd+unix:///?socket=$SOCK" --rw="$2" --bs="$3" \
      --iodepth="$4" --numjobs="$5" --group_reporting --time_based --runtime="$RUNTIME" \
      --size="$SIZE" --output-format=json > "$W/fio.json"
    t1=$(cpu_ticks)
    python3 - "$s" "$1" "$(( t1 - t0 ))" "$HZ" "$W/fio.json" >> "$W/results" <<'PY'
import json, sys
server, load, ticks, hz, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
text = open(path).read()  # the nbd engine prints "fio: connected to NBD server" first
j = json.loads(text[text.index("{"):])["jobs"][0]
iops = j["read"]["iops"] + j["write"]["iops"]
bw = j["read"]["bw_bytes"] + j["write"]["bw_bytes"]
moved = j["read"]["io_bytes"] + j["write"]["io_bytes"]
cpu_per_gib = (ticks / hz) / (moved / 2**30) if moved else 0.0
print(f"{server} {load} {iops:.0f} {bw / 2**20:.1f} {cpu_per_gib:.2f}")
PY
    echo "  $s $1 done" >&2
  done
  stop
done

python3 - "$W/results" "$RUNTIME" "$SIZE" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
r = {(s, w): (float(i), float(m), float(c)) for s, w, i, m, c in rows}
servers = list(dict.fromkeys(s for s, *_ in rows))
loads = list(dict.fromkeys(w for _, w, *_ in rows))
print(f"fio nbd engine over a unix socket; {sys.argv[2]} s per cell, {sys.argv[3]} image")
print(f"{'workload':24} {'server':12} {'IOPS':>9} {'MiB/s':>9} {'cpu s/GiB':>10} {'x ucrypt-raw':>13} {'x nbdkit-luks':>14}")
for w in loads:
    for s in servers:
        i, m, c = r[(s, w)]
        base = r.get(("ucrypt-raw", w), (0, 0, 0))[0]
        luks = r.get(("nbdkit-luks", w), (0, 0, 0))[0]
        xr = f"{i / base:.2f}x" if base else "-"
        xl = f"{i / luks:.2f}x" if luks else "-"
        print(f"{w:24} {s:12} {i:9.0f} {m:9.1f} {c:10.2f} {xr:>13} {xl:>14}")
    print()
PY
