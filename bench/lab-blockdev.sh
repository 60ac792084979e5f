#!/bin/bash
# Block-device front ends side by side in one guest of tests/lab/run.sh (issue 12, point 7;
# issue 32, item 3): fio (libaio, direct) on ucrypt's ublk device, ucrypt's kernel NBD
# device and the kernel's dm-crypt over the same brd ramdisk, each with aes-xts-plain64 and
# with cipher_null-ecb (4096-byte sectors; the null cipher measures the I/O path alone).
#   bench/lab-blockdev.sh [RUNTIME_SECONDS]      (default 8 per cell; about 12 min in all)
#   CIPHERS='aes null' DEVICES='ublk ublk-w2 nbd nbd-c2 dm-crypt' narrow the run (more
#   devices: ublk-i, ublk-b, ublk-s1, ublk-u, ublk-raw, ublk-zero, ublk-zero-u, ublk-up, ublk-upi, ublk-zero-up, dm-linear, see the guest script); ROUNDS=N repeats every cell
#   on every device N times (the order rotating), for medians.
# Prints a table of IOPS (4k) / MiB/s (1M) and the ratios per cipher (medians over rounds;
# a ratio column is the median of the per-round ratios, whose spread follows), and which
# cipher code the kernel and the guest CPU offered; TCG distorts absolute speed, so only
# ratios inside one run mean anything. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-8}
T=${CARGO_TARGET_DIR:-target}
# ATTACH names another build of the example (e.g. target/debug/examples/attach).
if [ -z "${ATTACH:-}" ]; then
  cargo build --release -p ucrypt-device --example attach >&2
  ATTACH=$T/release/examples/attach
fi
ATTACH=$(realpath "$ATTACH")
OUT=$(mktemp -d "$PWD/target/lab-bench.XXXXXX")
CIPHERS=${CIPHERS:-aes null}
DEVICES=${DEVICES:-ublk ublk-w2 nbd nbd-c2 dm-crypt}
LAB_MODULES="${LAB_MODULES:-} crypto_null" LAB_TIMEOUT=${LAB_TIMEOUT:-5400} \
  tests/lab/run.sh bench/lab-blockdev-guest.sh "$ATTACH" "$RT" "$OUT" "$CIPHERS" "$DEVICES" "${ROUNDS:-1}"
python3 - "$OUT" "$CIPHERS" <<'PY'
import glob, json, os, statistics, sys
out, ciphers = sys.argv[1], sys.argv[2].split()
devs = [d for d in ["ublk", "ublk-i", "ublk-b", "ublk-w2", "ublk-s1", "ublk-u", "ublk-up", "ublk-upi", "ublk-raw", "ublk-zero", "ublk-zero-u",
                  "ublk-zero-up",
                  "nbd", "nbd-c2", "dm-linear", "dm-crypt"]
        if any(f.split(".")[0] in (d, "null-" + d) for f in os.listdir(out))]
cells = [("randread", "4k", 1), ("randread", "4k", 32), ("randwrite", "4k", 1),
         ("randwrite", "4k", 32), ("read", "1M", 8), ("write", "1M", 8)]
def rounds(dev, rw, bs, qd):
    """Round number -> IOPS (4k) or MiB/s (1M) of one device's cell."""
    got = {}
    for p in glob.glob(os.path.join(out, f"{dev}.{rw}.{bs}.{qd}.r*.json")):
        j = json.load(open(p))["jobs"][0]
        side = j["read"] if "read" in rw else j["write"]
        got[p.rsplit(".r", 1)[1][:-5]] = side["iops"] if bs == "4k" else side["bw_bytes"] / 2**20
    return got
def val(dev, rw, bs, qd):
    got = rounds(dev, rw, bs, qd)
    return statistics.median(got.values()) if got else None
def ratio(dev, base, rw, bs, qd):
    a, b = rounds(dev, rw, bs, qd), rounds(base, rw, bs, qd)
    per = [a[r] / b[r] for r in sorted(a) if r in b and b[r]]
    if not per:
        return "-"
    spread = f" ({', '.join(f'{x:.2f}' for x in per)})" if len(per) > 1 else ""
    return f"{statistics.median(per):.2f}x{spread}"
for c in ciphers:
    prefix = "null-" if c == "null" else ""
    print(f"\n{'cipher_null-ecb' if c == 'null' else 'aes-xts-plain64 (512-bit key)'}, 4096-byte sectors\n")
    others = [d for d in devs if d != "dm-crypt"]
    print("| cell | unit | " + " | ".join(devs) + " | " + " | ".join(f"{d}/dm-crypt" for d in others) + " |")
    print("|---|---|" + "---|" * (len(devs) + len(others)))
    for rw, bs, qd in cells:
        v = {d: val(prefix + d, rw, bs, qd) for d in devs}
        unit = "IOPS" if bs == "4k" else "MiB/s"
        print(f"| {rw} {bs} QD{qd} | {unit} | " + " | ".join(f"{v[d]:.0f}" if v[d] else "-" for d in devs)
              + " | " + " | ".join(ratio(prefix + d, prefix + "dm-crypt", rw, bs, qd) for d in others) + " |")
    print(f"\nGuest CPUs kept busy during each cell (all processes and the kernel; 2.00 = both vCPUs), medians\n")
    print("| cell | " + " | ".join(devs) + " |")
    print("|---|" + "---|" * len(devs))
    for rw, bs, qd in cells:
        row = []
        for d in devs:
            got = []
            for p in glob.glob(os.path.join(out, f"{prefix}{d}.{rw}.{bs}.{qd}.r*.cpu")):
                ticks, hz, secs = map(float, open(p).read().split())
                got.append(ticks / hz / secs)
            row.append(f"{statistics.median(got):.2f}" if got else "-")
        print(f"| {rw} {bs} QD{qd} | " + " | ".join(row) + " |")
print()
p = os.path.join(out, "ciphers.txt")
if os.path.exists(p):
    print(open(p).read())
PY
echo "(fio JSON in $OUT)"
