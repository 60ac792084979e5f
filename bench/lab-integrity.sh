#!/bin/bash
# Authenticated encryption's cost, ucrypt against the kernel, in one guest of
# tests/lab/run.sh (issue 28, item 7): the same LUKS2 volumes on brd ramdisks (plain
# aes-xts-plain64, --integrity hmac-sha256, aes-gcm-random --integrity aead; 4096-byte
# sectors, dm-integrity journal mode) through the kernel's dm-crypt + dm-integrity and
# through ucrypt's ublk device, fio 4k random (QD32) and 1M sequential (QD8), every cell on
# every device in turn, ROUNDS times (the order rotated each round).
#   bench/lab-integrity.sh [RUNTIME_SECONDS]     (default 5 per cell)
#   CONFIGS='plain hmac-sha256 aes-gcm' narrows the run; ROUNDS=3 (about 12 min for all three).
# Needs the release binary (CARGO_TARGET_DIR or target/, release/ucrypt). Prints medians
# over the rounds of IOPS / MiB/s per device, and of the per-round ratios: each integrity
# mode to plain on the same side (compare those: TCG distorts absolute speed) and ucrypt
# to the kernel per config. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-5}
ROUNDS=${ROUNDS:-3}
T=${CARGO_TARGET_DIR:-target}
cargo build --release -p ucrypt-cli >&2
UCRYPT=$(realpath "$T/release/ucrypt")
OUT=$(mktemp -d "$PWD/target/lab-integrity.XXXXXX")
CONFIGS=${CONFIGS:-plain hmac-sha256 aes-gcm}
LAB_TIMEOUT=${LAB_TIMEOUT:-5400} \
  tests/lab/run.sh bench/lab-integrity-guest.sh "$UCRYPT" "$RT" "$OUT" "$CONFIGS" "$ROUNDS"
python3 - "$OUT" "$CONFIGS" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, configs, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
cells = [("randread", "4k", 32), ("randwrite", "4k", 32), ("read", "1M", 8), ("write", "1M", 8)]
def val(r, label, rw, bs, qd):
    p = os.path.join(out, f"r{r}-{label}.{rw}.{bs}.{qd}.json")
    if not os.path.exists(p):
        return None
    j = json.load(open(p))["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return side["iops"] if bs == "4k" else side["bw_bytes"] / 2**20
def med(xs):
    xs = [x for x in xs if x]
    return statistics.median(xs) if xs else None
cols = [(s, c) for c in configs for s in ("kernel", "ucrypt")]
ratios = [c for c in configs if c != "plain"] if "plain" in configs else []
head = "| cell | unit | " + " | ".join(f"{s} {c}" for s, c in cols)
head += "".join(f" | kernel {c}/plain | ucrypt {c}/plain" for c in ratios)
head += "".join(f" | ucrypt/kernel {c}" for c in configs)
print(f"medians of {rounds} rounds (ratios: medians of the per-round ratios)")
print(head + " |")
print("|---|---|" + "---|" * (len(cols) + 2 * len(ratios) + len(configs)))
spread = []
for rw, bs, qd in cells:
    v = {(r, s, c): val(r, f"{s}-{c}", rw, bs, qd) for r in range(1, rounds + 1) for s, c in cols}
    def ratio(a, b):
        xs = [v[(r,) + a] / v[(r,) + b] for r in range(1, rounds + 1) if v[(r,) + a] and v[(r,) + b]]
        return xs
    fmt = lambda xs: f"{statistics.median(xs):.2f}x" if xs else "-"
    row = f"| {rw} {bs} QD{qd} | {'IOPS' if bs == '4k' else 'MiB/s'} | "
    row += " | ".join(f"{m:.0f}" if (m := med([v[(r, s, c)] for r in range(1, rounds + 1)])) else "-" for s, c in cols)
    for c in ratios:
        k, u = ratio(("kernel", c), ("kernel", "plain")), ratio(("ucrypt", c), ("ucrypt", "plain"))
        row += f" | {fmt(k)} | {fmt(u)}"
        spread.append(f"  {rw} {bs} {c}/plain per round: kernel {' '.join(f'{x:.2f}' for x in k)}; ucrypt {' '.join(f'{x:.2f}' for x in u)}")
    for c in configs:
        row += f" | {fmt(ratio(('ucrypt', c), ('kernel', c)))}"
    print(row + " |")
print()
print("per-round ratios (spread)")
print("\n".join(spread))
print()
p = os.path.join(out, "ciphers.txt")
if os.path.exists(p):
    print(open(p).read())
PY
echo "(fio JSON in $OUT)"
