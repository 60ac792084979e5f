#!/usr/bin/env bash
# The read path against its ceiling: fio's nbd engine over unix sockets against `ucrypt open
# --raw` (the same-sized file unencrypted: the ceiling of ucrypt's own server) and `ucrypt
# open` of a LUKS1 image (aes-xts-plain64, 512-bit key, 512-byte sectors, made by qemu-img)
# and of a LUKS2 image (aes-xts-plain64, 512-bit key, 4096-byte sectors, made by
# cryptsetup), with nbdkit's luks filter and qemu-nbd on the same LUKS1 image and nbdkit's
# null plugin (the client and socket ceiling) beside them. Every server runs at once on its
# own socket; each cell is measured on every server in turn (the order rotating between
# rounds), ROUNDS rounds, and the table shows medians and ratios of medians.
#
#   bench/nbd-read.sh [--quick]     RUNTIME=5 SIZE=512M ROUNDS=3 UCRYPT=target/release/ucrypt
#                                   SERVERS_ONLY='ucrypt-raw ucrypt-l1' ONLY='qd32' NICE=-10
#                                   UCRYPT_B=other/ucrypt UCRYPT_B_ENV='VAR=value'
#
# UCRYPT_B adds a second build as servers ucrypt-raw-b, ucrypt-l1-b and ucrypt-l2-b (run with
# the environment UCRYPT_B_ENV), each against its own raw export: before and after a change
# in one run. Servers ucrypt-n1 and ucrypt-n2 (not in the default set: SERVERS_ONLY) are
# named instances (`ucrypt open IMG NAME --device none`) of the LUKS1 and LUKS2 images,
# which serve through the instance's switch (N1, N2 in the ratio columns). NICE runs fio and every server at that nice level (root for negative ones),
# which keeps other work on a shared machine from taking their CPUs.
#
# Columns: IOPS (MiB/s for the large-block rows), the server's CPU seconds per GiB moved
# (from /proc/PID/stat: the least noise-sensitive number), ucrypt / raw and ucrypt /
# nbdkit+luks. Images live on tmpfs (BENCH_DIR=/dev/shm) so the servers are measured, not
# a disk. See BENCHMARKING.md.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-5}
SIZE=${SIZE:-512M}
ROUNDS=${ROUNDS:-3}
[ "${1:-}" = "--quick" ] && { RUNTIME=2; SIZE=128M; ROUNDS=${ROUNDS_QUICK:-1}; }
UCRYPT=${UCRYPT:-target/release/ucrypt}
for t in fio nbdkit qemu-nbd qemu-img qemu-io python3; do
  command -v "$t" >/dev/null || { echo "nbd-read: $t is missing (run scripts/setup.sh)" >&2; exit 1; }
done
[ -x "$UCRYPT" ] || { echo "nbd-read: build first: cargo build --release -p ucrypt-cli" >&2; exit 1; }
UCRYPT=$(realpath "$UCRYPT")

W=$(mktemp -d "${BENCH_DIR:-/dev/shm}/ucrypt-nbd-read.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
PASS=benchmark-passphrase
printf %s "$PASS" > "$W/pass"

echo "nbd-read: preparing $SIZE images in $W (${RUNTIME}s per cell, $ROUNDS rounds)" >&2
truncate -s "$SIZE" "$W/plain.img"
BYTES=$(stat -c %s "$W/plain.img")
dd if=/dev/urandom of="$W/plain.img" bs=1M count=$((BYTES >> 20)) conv=notrunc status=none
# --raw exports the table's device as it is: the key is never used.
echo "0 $((BYTES / 512)) crypt aes-xts-plain64 $(head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n') 0 $W/plain.img 0" \
  > "$W/raw.table"
# LUKS1, aes-xts-plain64 with a 512-bit key and 512-byte sectors: what nbdkit's filter reads.
# qemu-img's PBKDF2 benchmark samples CPU time by ticks and fails now and then on a busy
# machine ("Unable to get accurate CPU usage"): retried.
for try in $(seq 20); do
  qemu-img create -q -f luks --object secret,id=s0,data=$PASS -o key-secret=s0,iter-time=10 \
    "$W/luks1.img" "$SIZE" 2>"$W/qemu-img.err" && break
  [ "$try" = 20 ] && { cat "$W/qemu-img.err" >&2; exit 1; }
  sleep 0.3
done
qemu-io --object secret,id=s0,data=$PASS --image-opts \
  "driver=luks,key-secret=s0,file.filename=$W/luks1.img" -c "write -P 0x5a 0 $SIZE" >/dev/null
# LUKS2, 4096-byte sectors, a 16 MiB header area: the data area is $SIZE as well.
truncate -s $((BYTES + (16 << 20))) "$W/luks2.img"
if command -v cryptsetup >/dev/null; then
  cryptsetup luksFormat -q --type luks2 --cipher aes-xts-plain64 --key-size 512 \
    --sector-size 4096 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$W/pass" \
    "$W/luks2.img"
else
  "$UCRYPT" luksFormat -q --type luks2 --cipher aes-xts-plain64 --key-size 512 \
    --sector-size 4096 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$W/pass" \
    "$W/luks2.img"
fi

# name -> socket; every server starts now and stays up for the whole run.
declare -A PID
N=(nice -n "${NICE:-0}")
start() { # name
  local sock=$W/$1.sock pidf=$W/$1.pid
  local U=("${N[@]}" "$UCRYPT")
  [[ $1 == *-b ]] && U=("${N[@]}" env ${UCRYPT_B_ENV:-} "$UCRYPT_B")
  case $1 in
    ucrypt-raw*) "${U[@]}" open --table-file "$W/raw.table" --raw --socket "$sock" --pid-file "$pidf" >/dev/null & ;;
    ucrypt-l1*)  "${U[@]}" open "$W/luks1.img" --key-file "$W/pass" --socket "$sock" --pid-file "$pidf" >/dev/null & ;;
    ucrypt-l2*)  "${U[@]}" open "$W/luks2.img" --key-file "$W/pass" --socket "$sock" --pid-file "$pidf" >/dev/null & ;;
    # Named instances (`ucrypt open DEV NAME`, served through the instance's switch), NBD
    # socket only, sharing the image with the unnamed server of the same image.
    ucrypt-n1*)  UCRYPT_RUNTIME_DIR=$W/run "${U[@]}" open "$W/luks1.img" "$1" --device none --shared --foreground \
                   --key-file "$W/pass" --socket "$sock" --pid-file "$pidf" >/dev/null & ;;
    ucrypt-n2*)  UCRYPT_RUNTIME_DIR=$W/run "${U[@]}" open "$W/luks2.img" "$1" --device none --shared --foreground \
                   --key-file "$W/pass" --socket "$sock" --pid-file "$pidf" >/dev/null & ;;
    nbdkit-luks) "${N[@]}" nbdkit -f -U "$sock" -P "$pidf" --filter=luks file "$W/luks1.img" passphrase=$PASS & ;;
    nbdkit-null) "${N[@]}" nbdkit -f -U "$sock" -P "$pidf" null "$SIZE" & ;;
    qemu-luks)   "${N[@]}" qemu-nbd -t -e 4 -k "$sock" --pid-file "$pidf" --object secret,id=s0,data=$PASS \
                   --image-opts "driver=luks,key-secret=s0,file.filename=$W/luks1.img,file.locking=off" & ;;
    *) echo "nbd-read: unknown server $1" >&2; exit 1 ;;
  esac
  PIDS+=($!)
  for _ in $(seq 400); do [ -s "$pidf" ] && [ -S "$sock" ] && break; sleep 0.05; done
  [ -s "$pidf" ] && [ -S "$sock" ] || { echo "nbd-read: $1 did not start" >&2; exit 1; }
  PID[$1]=$(cat "$pidf")
}
SERVERS=(nbdkit-null nbdkit-luks qemu-luks ucrypt-raw ucrypt-l1 ucrypt-l2)
[ -n "${SERVERS_ONLY:-}" ] && read -r -a SERVERS <<< "$SERVERS_ONLY"
if [ -n "${UCRYPT_B:-}" ]; then
  UCRYPT_B=$(realpath "$UCRYPT_B")
  for s in "${SERVERS[@]}"; do [[ $s == ucrypt-* ]] && SERVERS+=("$s-b"); done
fi
for s in "${SERVERS[@]}"; do start "$s"; done
uri() { echo "nbd+unix:///?socket=$W/$1.sock"; }
# The LUKS2 data area is filled through ucrypt (a hole would decrypt nothing real).
if [[ " ${SERVERS[*]} " == *" ucrypt-"[ln]"2"* ]]; then
  l2=$(tr ' ' '\n' <<< "${SERVERS[*]}" | grep -m1 '^ucrypt-[ln]2')
  fio --name=fill --ioengine=nbd --uri="$(uri "$l2")" --rw=write --bs=1M --iodepth=4 \
    --size="$SIZE" --output-format=terse >/dev/null
fi

# name rw bs depth jobs (jobs = connections)
WORKLOADS=(
  "4k-randread-qd1 randread 4k 1 1"
  "4k-randread-qd32 randread 4k 32 1"
  "4k-randwrite-qd32 randwrite 4k 32 1"
  "64k-randread-qd8 randread 64k 8 1"
  "1M-read-qd4 read 1M 4 1"
  "1M-write-qd4 write 1M 4 1"
  "4k-randread-qd32-2conn randread 4k 32 2"
)
if [ -n "${ONLY:-}" ]; then
  kept=(); for w in "${WORKLOADS[@]}"; do grep -qE "${ONLY}" <<< "${w%% *}" && kept+=("$w"); done
  WORKLOADS=("${kept[@]}")
fi
HZ=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
: > "$W/results"
n=${#SERVERS[@]}
for round in $(seq "$ROUNDS"); do
  for w in "${WORKLOADS[@]}"; do
    set -- $w
    for i in $(seq 0 $((n - 1))); do
      # Rotate the order each round: no server always runs first (or right after another).
      s=${SERVERS[$(( (i + round - 1) % n ))]}
      t0=$(cpu_ticks "${PID[$s]}")
      "${N[@]}" fio --name="$1" --ioengine=nbd --uri="$(uri "$s")" --rw="$2" --bs="$3" \
        --iodepth="$4" --numjobs="$5" --group_reporting --time_based --runtime="$RUNTIME" \
        --size="$SIZE" --output-format=json > "$W/fio.json"
      t1=$(cpu_ticks "${PID[$s]}")
      python3 - "$s" "$1" "$(( t1 - t0 ))" "$HZ" "$W/fio.json" "$round" >> "$W/results" <<'PY'
import json, sys
server, load, ticks, hz, path, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
text = open(path).read()  # the nbd engine prints "fio: connected to NBD server" first
j = json.loads(text[text.index("{"):])["jobs"][0]
iops = j["read"]["iops"] + j["write"]["iops"]
bw = j["read"]["bw_bytes"] + j["write"]["bw_bytes"]
moved = j["read"]["io_bytes"] + j["write"]["io_bytes"]
cpu = (ticks / hz) / (moved / 2**30) if moved else 0.0
print(f"{rnd} {server} {load} {iops:.0f} {bw / 2**20:.1f} {cpu:.3f}")
PY
    done
    echo "  round $round $1 done" >&2
  done
done
[ -n "${KEEP_RESULTS:-}" ] && cp "$W/results" "$KEEP_RESULTS"

python3 - "$W/results" "$RUNTIME" "$SIZE" "$ROUNDS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
cells = {}
for rnd, s, w, iops, mib, cpu in rows:
    cells.setdefault((s, w), []).append((float(iops), float(mib), float(cpu)))
servers = list(dict.fromkeys(r[1] for r in rows))
loads = list(dict.fromkeys(r[2] for r in rows))
names = {"nbdkit-null": "nbdkit null", "nbdkit-luks": "nbdkit + luks", "qemu-luks": "qemu-nbd luks",
         "ucrypt-raw": "ucrypt --raw", "ucrypt-l1": "ucrypt LUKS1/512", "ucrypt-l2": "ucrypt LUKS2/4096",
         "ucrypt-n1": "named LUKS1/512", "ucrypt-n2": "named LUKS2/4096"}
for k in list(names):
    if k.startswith("ucrypt"):
        names[k + "-b"] = names[k] + " (B)"
def raw_of(o): return "ucrypt-raw-b" if o.endswith("-b") else "ucrypt-raw"
def med(s, w, k):
    v = cells.get((s, w))
    return statistics.median(x[k] for x in v) if v else None
def big(w): return not w.startswith("4k")
def fmt(v, w):
    if v is None: return "-"
    return f"{v:.0f}" if big(w) else f"{v / 1000:.1f}k"
print(f"fio nbd engine over unix sockets; {sys.argv[2]} s per cell, {sys.argv[3]} images, "
      f"medians of {sys.argv[4]} rounds (IOPS; MiB/s for 64k and 1M)")
print()
ours = [s for s in ("ucrypt-l1", "ucrypt-l2", "ucrypt-n1", "ucrypt-n2",
                    "ucrypt-l1-b", "ucrypt-l2-b", "ucrypt-n1-b", "ucrypt-n2-b") if s in servers]
head = ["workload"] + [names.get(s, s) for s in servers]
for o in ours:
    tag = o[len("ucrypt-"):len("ucrypt-") + 2].upper() + (" (B)" if o.endswith("-b") else "")
    head += [f"{tag} / raw", f"{tag} / nbdkit+luks"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for w in loads:
    k = 1 if big(w) else 0
    row = [w] + [fmt(med(s, w, k), w) for s in servers]
    for o in ours:
        v, raw, luks = med(o, w, k), med(raw_of(o), w, k), med("nbdkit-luks", w, k)
        row.append(f"{v / raw:.2f}" if v and raw else "-")
        row.append(f"{v / luks:.2f}" if v and luks else "-")
    print("| " + " | ".join(row) + " |")
print()
print("server CPU seconds per GiB moved (medians)")
print("| workload | " + " | ".join(names.get(s, s) for s in servers) + " |")
print("|" + "---|" * (len(servers) + 1))
for w in loads:
    print(f"| {w} | " + " | ".join(f"{med(s, w, 2):.2f}" for s in servers) + " |")
print()
print("per-round ratios to ucrypt --raw (spread)")
for w in loads:
    k = 1 if big(w) else 0
    for o in ours:
        per = {}
        for rnd, s, ww, iops, mib, cpu in rows:
            if ww == w and s in (o, raw_of(o)):
                per.setdefault(rnd, {})[s] = float(mib if k else iops)
        rs = [p[o] / p[raw_of(o)] for p in per.values() if o in p and p.get(raw_of(o))]
        if rs:
            print(f"  {w:24} {names[o]:18} " + " ".join(f"{r:.2f}" for r in rs))
PY
