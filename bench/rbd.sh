#!/usr/bin/env bash
# Ceph RBD, side by side in one run on one single-node cluster (tests/ceph/cluster.sh,
# bluestore on a sparse file) and one image: every number is only comparable with the others
# of the same run (see BENCHMARKING.md).
#
#   bench/rbd.sh            REPS=3 RUNTIME=5 SIZE=1G UCRYPT=target/release/ucrypt CACHE=on|off  UCRYPT_BASE=  NICE=-20  SPLIT=1
#                           ONLY='4k' (grep -E on workload names)  CONFIGS_ONLY='ucrypt-rbd librbd-luks2'
#
# The image is formatted once as LUKS2 (aes-xts-plain64, 512-bit key, 4096-byte sectors,
# 16 MiB data offset: the layout `rbd encryption format luks2` writes; by ucrypt, with a
# cheap PBKDF) and its data area filled with 1 MiB writes first, so reads are of written
# objects (librbd answers holes with zeros without reading or decrypting anything).
# Configurations:
#   librbd-raw    fio's rbd engine on the image: librbd unencrypted, no NBD hop (the ceiling)
#   qemu-nbd-raw  qemu-nbd's rbd driver, unencrypted, fio over NBD (the NBD hop's ceiling)
#   librbd-luks2  qemu-nbd's rbd driver with encrypt.format=luks2: librbd's own encryption
#                 (rbd_encryption_load; `rbd bench` in 16.2 has no encryption), fio over NBD
#   ucrypt-rbd    ucrypt open rbd:rbd/IMAGE (its RBD backend), fio over ucrypt's NBD socket
#   ucrypt-nbd    ucrypt open nbd+unix://... of a qemu-nbd raw export of the image (ucrypt
#                 over an NBD export of RBD, as with rbd-nbd), fio over ucrypt's NBD socket
#   ucrypt-rbd-base  (only with UCRYPT_BASE=BINARY) ucrypt-rbd run by another ucrypt binary, in
#                 the same run: a change's before/after side by side
#   ucrypt-rbd-noflush  (only with CONFIGS_ONLY) ucrypt-rbd without the flush before the runs:
#                 librbd stays in writethrough, as this script measured before 2026-11-25 evening
#   ucrypt-rbd-null  (only with CONFIGS_ONLY) ucrypt-rbd with cipher_null (a table line over the
#                 same data area and 4096-byte sectors): ucrypt's NBD export of librbd without
#                 the cipher, the ceiling of any encryption served over NBD by ucrypt
#   inproc-raw, inproc-ucrypt  no NBD hop on either side: `ucrypt bench --table` runs the
#                 workload in one process with one load generator (a queue kept full from one
#                 thread, as fio's rbd engine does) against librbd over the data area
#                 (inproc-raw) and against ucrypt's engine over its RBD backend
#                 (inproc-ucrypt: aes-xts-plain64, 512-bit random key, 4096-byte sectors,
#                 the same data area): what encryption costs over librbd with no hop. Their
#                 CPU column is the bench process's own (librbd's threads included), measured
#                 inside the timed window. Evidence beside the NBD columns, not a substitute.
# NICE=-20 runs everything (cluster, servers, fio) at that nice level, for runs on a machine
# others share.
# SPLIT=1 gives the cluster (monitor and OSD, every thread) the last CPU and everything else
# (fio, the NBD servers, `ucrypt bench`) the others, so the client side no longer competes
# with the OSD for CPU: the layout of a real deployment, where the OSDs are other machines
# and the client's CPUs are its own. Needs at least 2 CPUs. Without it every process shares
# every CPU (on a 2-vCPU machine the OSD's CPU then bounds the client's, BENCHMARKING.md).
# librbd's cache mode is the same in every column. librbd (16.2, rbd_cache=true by default) starts
# each image handle in writethrough (a write completes when the OSD has it) and switches to
# write-around at the handle's first flush: a write then completes when it is sent (at most
# rbd_cache_max_dirty, 24 MiB, in flight; overlapping reads and writes wait for it, a flush waits
# for all, a failed write fails the next flush). fio's rbd engine flushes when it opens the image,
# fio's nbd engine never flushes: so every NBD export gets one flush (qemu-io) before the timed
# runs, as any filesystem's first fsync would send. CACHE=off runs every column with rbd_cache
# off instead (writes complete when the OSD has them): `rbd cache = false` in the clients'
# ceph.conf, qemu-nbd --cache=none (QEMU sets rbd_cache itself), fio --direct=1 for the rbd
# engine (it sets rbd_cache itself).
# Workloads: 4k randread and randwrite at depth 32, 1M sequential read and write at depth 32.
# Each repetition runs every configuration in turn (round robin against drift); printed are
# medians of REPS runs, ratios against librbd-raw and librbd-luks2, and the spread; then the
# CPU time per request of each side (median): fio (with librbd for librbd-raw, the nbd engine
# otherwise), the server process(es) (ucrypt, qemu-nbd) and the OSD, from /proc (utime+stime
# of the servers and the OSD before and after, fio's through its parent's cutime+cstime). On a
# machine whose CPUs the OSD shares, the sums bound what each column can reach.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${NICE:-}" ] && [ -z "${RBD_BENCH_NICED:-}" ]; then
  RBD_BENCH_NICED=1 exec nice -n "$NICE" "$0" "$@"
fi

case ${SPLIT:-0} in 0|1) ;; *) echo "rbd.sh: SPLIT must be 0 or 1" >&2; exit 1 ;; esac
if [ "${SPLIT:-0}" = 1 ] && [ -z "${RBD_BENCH_SPLIT:-}" ]; then
  NCPU=$(nproc)
  [ "$NCPU" -ge 2 ] || { echo "rbd.sh: SPLIT=1 needs at least 2 CPUs" >&2; exit 1; }
  RBD_BENCH_SPLIT=$((NCPU - 1)) exec taskset -c "0-$((NCPU - 2))" "$0" "$@"
fi

REPS=${REPS:-3}
RUNTIME=${RUNTIME:-5}
SIZE=${SIZE:-1G}
UCRYPT=${UCRYPT:-target/release/ucrypt}
CACHE=${CACHE:-on}
case $CACHE in on|off) ;; *) echo "rbd.sh: CACHE must be on or off" >&2; exit 1 ;; esac
for t in fio qemu-nbd qemu-io nbdinfo rbd ceph-mon ceph-osd /usr/bin/python3; do
  command -v "$t" >/dev/null || { echo "rbd.sh: $t is missing (run scripts/setup.sh)" >&2; exit 1; }
done
[ -x "$UCRYPT" ] || { echo "rbd.sh: build first: cargo build --release -p ucrypt-cli" >&2; exit 1; }
UCRYPT=$(realpath "$UCRYPT")

W=$(mktemp -d /tmp/ucrypt-rbd-bench.XXXXXX)
SERVER_PIDS=()
CEPH_TEST_DIR=
cleanup() {
  for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$CEPH_TEST_DIR" ] && tests/ceph/cluster.sh stop "$CEPH_TEST_DIR" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
# bluestore allocates fresh extents for overwrites, so its sparse block file grows towards its
# full size over a run's writes (some 20 GiB of 1 MiB writes): cluster.sh's default 8 GiB
# keeps a run within the host's free disk (20 GiB filled it on 2026-11-26, the OSD aborted).
eval "$(CEPH_WATCH_PID=$$ tests/ceph/cluster.sh start)"
if [ -n "${RBD_BENCH_SPLIT:-}" ]; then
  for f in "$CEPH_TEST_DIR"/run/mon.*.pid "$CEPH_TEST_DIR"/run/osd.*.pid; do
    taskset -a -cp "$RBD_BENCH_SPLIT" "$(cat "$f")" >/dev/null
  done
  echo "rbd.sh: SPLIT=1: the cluster on CPU $RBD_BENCH_SPLIT, the clients on 0-$((RBD_BENCH_SPLIT - 1))" >&2
fi
QEMU_CACHE=()
RAW_DIRECT=()
if [ "$CACHE" = off ]; then
  # the clients' copy of the configuration: the cluster's own keeps its path (cluster.sh stop)
  sed 's/^\[client\]$/[client]\nrbd cache = false/' "$CEPH_CONF" > "$W/ceph.conf"
  grep -q '^rbd cache = false$' "$W/ceph.conf" || { echo "rbd.sh: no [client] section in $CEPH_CONF" >&2; exit 1; }
  CEPH_CONF=$W/ceph.conf
  QEMU_CACHE=(--cache=none)
  RAW_DIRECT=(--direct=1)
fi
export CEPH_CONF
IMG=bench
PASSF=$W/pass
printf 'benchmark-passphrase' > "$PASSF"
rbd create --size "$SIZE" "rbd/$IMG"
"$UCRYPT" luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
  "rbd:rbd/$IMG" "$PASSF"
BYTES=$(( $(rbd info "rbd/$IMG" --format json | /usr/bin/python3 -c 'import json,sys;print(json.load(sys.stdin)["size"])') ))
DATA=$(( BYTES - (16 << 20) ))
echo "rbd.sh: filling the ${SIZE} image's data area (runtime ${RUNTIME}s per cell, $REPS reps)" >&2
fio --name=fill --ioengine=rbd --pool=rbd --rbdname="$IMG" --clientname=admin --rw=write \
  --bs=1M --iodepth=16 --offset=16M --size="$DATA" --output=/dev/null

# The in-process columns' table line: a random throw-away key over the benchmark's data
# area (what it decrypts to does not matter; the cost of AES-XTS does).
INPROC_TABLE="0 $((DATA / 512)) crypt aes-xts-plain64 $(od -An -tx1 -N64 /dev/urandom | tr -d ' \n') 0 rbd:rbd/$IMG 32768 1 sector_size:4096"
SOCK=$W/s.sock
SOCK2=$W/raw.sock
wait_sock() {  # socket pid (qemu-nbd binds its socket before the image is open: connect)
  for _ in $(seq 600); do
    [ -S "$1" ] && nbdinfo --size "nbd+unix:///?socket=$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { echo "rbd.sh: server died:" >&2; tail -5 "$W/server.err" >&2; exit 1; }
    sleep 0.05
  done
  echo "rbd.sh: $1 did not appear" >&2; exit 1
}
qemu_nbd() {  # socket extra-image-opts
  rm -f "$1"
  qemu-nbd -t -e 4 "${QEMU_CACHE[@]}" -k "$1" --object secret,id=s0,file="$PASSF" \
    --image-opts "driver=rbd,pool=rbd,image=$IMG,conf=$CEPH_CONF$2" >/dev/null 2>"$W/server.err" &
  SERVER_PIDS+=($!)
  wait_sock "$1" $!
}
ucrypt_open() {  # device [binary]
  rm -f "$SOCK"
  "${2:-$UCRYPT}" open "$1" --key-file "$PASSF" --socket "$SOCK" >/dev/null 2>"$W/server.err" &
  SERVER_PIDS+=($!)
  wait_sock "$SOCK" $!
}
ucrypt_open_null() {  # cipher_null over the LUKS data area, as the LUKS2 mapping lays it out
  rm -f "$SOCK"
  "$UCRYPT" open --nbd-workers 32 --socket "$SOCK" --table \
    "0 $((DATA / 512)) crypt cipher_null-ecb - 0 rbd:rbd/$IMG 32768 1 sector_size:4096" \
    >/dev/null 2>"$W/server.err" &
  SERVER_PIDS+=($!)
  wait_sock "$SOCK" $!
}
start() {
  case $1 in
    librbd-raw|inproc-raw|inproc-ucrypt) ;;
    qemu-nbd-raw) qemu_nbd "$SOCK" "" ;;
    librbd-luks2) qemu_nbd "$SOCK" ",encrypt.format=luks2,encrypt.key-secret=s0" ;;
    ucrypt-rbd|ucrypt-rbd-noflush) ucrypt_open "rbd:rbd/$IMG" ;;
    ucrypt-rbd-base) ucrypt_open "rbd:rbd/$IMG" "$UCRYPT_BASE" ;;
    ucrypt-rbd-null) ucrypt_open_null ;;
    ucrypt-nbd) qemu_nbd "$SOCK2" ""; ucrypt_open "nbd+unix:///?socket=$SOCK2" ;;
  esac
  # One flush through the export (see the top: librbd's cache mode); for ucrypt-nbd it reaches
  # the qemu-nbd under ucrypt as ucrypt's own flush.
  if [ "$1" != librbd-raw ] && [ "$1" != ucrypt-rbd-noflush ] && [ "${1#inproc-}" = "$1" ]; then
    qemu-io -f raw "nbd+unix:///?socket=$SOCK" -c flush >/dev/null 2>"$W/flush.err" ||
      { echo "rbd.sh: flushing $1 failed:" >&2; cat "$W/flush.err" >&2; exit 1; }
  fi
}
stop() {  # newest first (ucrypt before the qemu-nbd under it); qemu-nbd needs ~2 s (librbd close)
  local i p
  for (( i=${#SERVER_PIDS[@]}-1; i>=0; i-- )); do
    p=${SERVER_PIDS[$i]}
    kill "$p" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
  wait 2>/dev/null || true
  SERVER_PIDS=()
}

# name rw bs depth
WORKLOADS=(
  "4k-randread-qd32 randread 4k 32"
  "4k-randwrite-qd32 randwrite 4k 32"
  "1M-read-qd32 read 1M 32"
  "1M-write-qd32 write 1M 32"
)
CONFIGS=(librbd-raw qemu-nbd-raw librbd-luks2 ucrypt-rbd ucrypt-nbd inproc-raw inproc-ucrypt)
if [ -n "${UCRYPT_BASE:-}" ]; then
  [ -x "$UCRYPT_BASE" ] || { echo "rbd.sh: UCRYPT_BASE=$UCRYPT_BASE is not executable" >&2; exit 1; }
  UCRYPT_BASE=$(realpath "$UCRYPT_BASE")
  CONFIGS+=(ucrypt-rbd-base)
fi
[ -n "${CONFIGS_ONLY:-}" ] && read -r -a CONFIGS <<< "$CONFIGS_ONLY"
if [ -n "${ONLY:-}" ]; then
  kept=(); for w in "${WORKLOADS[@]}"; do grep -qE "${ONLY}" <<< "${w%% *}" && kept+=("$w"); done
  WORKLOADS=("${kept[@]}")
fi
: > "$W/results"
OSD_PID=$(cat "$CEPH_TEST_DIR/run/osd.0.pid")
ticks() {  # pids...: their utime+stime in clock ticks, summed (0 for none)
  local p t=0 s
  for p in "$@"; do
    read -r -a s < "/proc/$p/stat" && t=$(( t + s[13] + s[14] ))
  done
  echo "$t"
}
for rep in $(seq "$REPS"); do
  for c in "${CONFIGS[@]}"; do
    start "$c"
    for w in "${WORKLOADS[@]}"; do
      set -- $w
      if [ "$c" = librbd-raw ]; then
        eng=(--ioengine=rbd --pool=rbd --rbdname="$IMG" --clientname=admin --offset=16M --size="$DATA"
             "${RAW_DIRECT[@]}")
      elif [ "$c" = qemu-nbd-raw ]; then
        # the raw export holds the LUKS header in its first 16 MiB: keep writes off it
        eng=(--ioengine=nbd --uri="nbd+unix:///?socket=$SOCK" --offset=16M --size="$DATA")
      else
        eng=(--ioengine=nbd --uri="nbd+unix:///?socket=$SOCK")
      fi
      if [ "${c#inproc-}" != "$c" ]; then
        # In process: the bench flushes the image once itself (librbd's write-around, as
        # fio's rbd engine), and measures its own CPU inside the timed window.
        bs=$(( ${3%[kM]} << $([ "${3: -1}" = M ] && echo 20 || echo 10) ))
        osd0=$(ticks "$OSD_PID")
        "$UCRYPT" bench --table "$INPROC_TABLE" --side "${c#inproc-}" --rw "$2" --block "$bs" \
          --depth "$4" --seconds "$RUNTIME" --repeat 1 --json > "$W/inproc.json" 2>"$W/inproc.err" ||
          { echo "rbd.sh: ucrypt bench failed:" >&2; cat "$W/inproc.err" >&2; exit 1; }
        osd=$(( $(ticks "$OSD_PID") - osd0 ))
        /usr/bin/python3 - "$c" "$1" "$W/inproc.json" "$osd" "$(getconf CLK_TCK)" >> "$W/results" <<'PY'
import json, sys
j = json.loads(open(sys.argv[3]).read().splitlines()[-1])
ticks = j["cpu_us_per_op"] * j["ops"] * int(sys.argv[5]) / 1e6
print(f"{sys.argv[1]} {sys.argv[2]} {j['iops']:.0f} {j['mib_s']:.1f} {j['ops']} {ticks:.0f} 0 {sys.argv[4]}")
PY
        echo "  rep $rep $c $1: $(tail -1 "$W/results" | cut -d' ' -f3-4) (IOPS MiB/s), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        continue
      fi
      srv0=$(ticks "${SERVER_PIDS[@]}"); osd0=$(ticks "$OSD_PID")
      # fio's CPU time (librbd's threads included) is its parent shell's cutime+cstime
      FIO_OUT=$W/fio.json FIO_CPU=$W/fio.cpu bash -c '"$@" > "$FIO_OUT"
        read -r -a s < /proc/$$/stat; echo $(( s[15] + s[16] )) > "$FIO_CPU"' _ \
        fio --name="$1" "${eng[@]}" --rw="$2" --bs="$3" --iodepth="$4" --time_based \
        --runtime="$RUNTIME" --output-format=json
      srv=$(( $(ticks "${SERVER_PIDS[@]}") - srv0 )); osd=$(( $(ticks "$OSD_PID") - osd0 ))
      /usr/bin/python3 - "$c" "$1" "$W/fio.json" "$(cat "$W/fio.cpu")" "$srv" "$osd" \
        >> "$W/results" <<'PY'
import json, sys
text = open(sys.argv[3]).read()  # the nbd engine prints "fio: connected to NBD server" first
j = json.loads(text[text.index("{"):])["jobs"][0]
iops = j["read"]["iops"] + j["write"]["iops"]
bw = j["read"]["bw_bytes"] + j["write"]["bw_bytes"]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
print(f"{sys.argv[1]} {sys.argv[2]} {iops:.0f} {bw / 2**20:.1f} {ios} {' '.join(sys.argv[4:7])}")
PY
      echo "  rep $rep $c $1: $(tail -1 "$W/results" | cut -d' ' -f3-4) (IOPS MiB/s), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    done
    stop
  done
done

SPLIT_NOTE=
[ -n "${RBD_BENCH_SPLIT:-}" ] && SPLIT_NOTE=", cluster on CPU $RBD_BENCH_SPLIT, clients on 0-$((RBD_BENCH_SPLIT - 1))"
/usr/bin/python3 - "$W/results" "$RUNTIME" "$SIZE" "$REPS" "$CACHE" "$(getconf CLK_TCK)" "$SPLIT_NOTE" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
runs = {}
cpu = {}
tick_us = 1e6 / int(sys.argv[6])
for c, w, i, m, ios, f, s, o in rows:
    runs.setdefault((c, w), []).append((float(i), float(m)))
    n = max(int(ios), 1)
    cpu.setdefault((c, w), []).append(tuple(int(t) * tick_us / n for t in (f, s, o)))
configs = list(dict.fromkeys(r[0] for r in rows))
loads = list(dict.fromkeys(r[1] for r in rows))
def med(c, w):
    v = runs.get((c, w))
    if not v:
        return None
    return statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), \
        min(x[1] for x in v), max(x[1] for x in v)
print(f"RBD, one single-node bluestore cluster, image {sys.argv[3]}, rbd_cache {sys.argv[5]}, "
      f"fio {sys.argv[2]} s per cell, median of {sys.argv[4]} (min-max MiB/s){sys.argv[7]}")
print()
print("| workload | " + " | ".join(configs) + " |")
print("|---" * (len(configs) + 1) + "|")
for w in loads:
    cells = []
    for c in configs:
        m = med(c, w)
        if m is None:
            cells.append("-")
        elif w.startswith("4k"):
            cells.append(f"{m[0]:.0f} IOPS ({m[2]:.0f}-{m[3]:.0f} MiB/s)")
        else:
            cells.append(f"{m[1]:.0f} MiB/s ({m[2]:.0f}-{m[3]:.0f})")
    print(f"| {w} | " + " | ".join(cells) + " |")
print()
for base in ("librbd-raw", "librbd-luks2", "inproc-raw"):
    if base not in configs:
        continue
    others = [c for c in configs if c != base]
    if base == "inproc-raw":  # the in-process pair only: one load generator, no hop
        others = [c for c in others if c.startswith("inproc-")]
    if not others:
        continue
    print(f"Ratios of medians against {base}:")
    print()
    print("| workload | " + " | ".join(others) + " |")
    print("|---" * (len(others) + 1) + "|")
    for w in loads:
        b = med(base, w)
        cells = [f"{med(c, w)[1] / b[1]:.2f}x" if med(c, w) and b and b[1] else "-" for c in others]
        print(f"| {w} | " + " | ".join(cells) + " |")
    print()
print("CPU time per request, microseconds, medians: fio (inproc: the bench process) + server + OSD = sum")
print()
print("| workload | " + " | ".join(configs) + " |")
print("|---" * (len(configs) + 1) + "|")
for w in loads:
    cells = []
    for c in configs:
        v = cpu.get((c, w))
        if not v:
            cells.append("-")
            continue
        f, s, o = (statistics.median(x[k] for x in v) for k in range(3))
        cells.append(f"{f:.0f} + {s:.0f} + {o:.0f} = {f + s + o:.0f}")
    print(f"| {w} | " + " | ".join(cells) + " |")
PY
