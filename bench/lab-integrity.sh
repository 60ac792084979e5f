#!/bin/bash
# Authenticated encryption's cost, ucrypt against the kernel, in one guest of
# tests/lab/run.sh (issue 28, item 7): the same LUKS2 volumes on a brd ramdisk (plain
# aes-xts-plain64, --integrity hmac-sha256, aes-gcm-random --integrity aead; 4096-byte
# sectors, dm-integrity journal mode) through the kernel's dm-crypt + dm-integrity and
# through ucrypt's ublk device, fio 4k random (QD32) and 1M sequential (QD8).
#   bench/lab-integrity.sh [RUNTIME_SECONDS]     (default 6 per cell)
#   CONFIGS='plain hmac-sha256 aes-gcm' narrows the run.
# Needs the release binary (CARGO_TARGET_DIR or target/, release/ucrypt). Prints IOPS /
# MiB/s per side and the ratio of each integrity mode to plain on the same side: compare
# those ratios (TCG distorts absolute speed). Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-6}
T=${CARGO_TARGET_DIR:-target}
cargo build --release -p ucrypt-cli >&2
UCRYPT=$(realpath "$T/release/ucrypt")
OUT=$(mktemp -d "$PWD/target/lab-integrity.XXXXXX")
CONFIGS=${CONFIGS:-plain hmac-sha256 aes-gcm}
LAB_TIMEOUT=${LAB_TIMEOUT:-5400} \
  tests/lab/run.sh bench/lab-integrity-guest.sh "$UCRYPT" "$RT" "$OUT" "$CONFIGS"
python3 - "$OUT" "$CONFIGS" <<'PY'
import json, os, sys
out, configs = sys.argv[1], sys.argv[2].split()
cells = [("randread", "4k", 32), ("randwrite", "4k", 32), ("read", "1M", 8), ("write", "1M", 8)]
def val(label, rw, bs, qd):
    p = os.path.join(out, f"{label}.{rw}.{bs}.{qd}.json")
    if not os.path.exists(p):
        return None
    j = json.load(open(p))["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return side["iops"] if bs == "4k" else side["bw_bytes"] / 2**20
cols = [(s, c) for c in configs for s in ("kernel", "ucrypt")]
head = "| cell | unit | " + " | ".join(f"{s} {c}" for s, c in cols)
ratios = [c for c in configs if c != "plain"] if "plain" in configs else []
head += "".join(f" | kernel {c}/plain | ucrypt {c}/plain" for c in ratios)
head += "".join(f" | ucrypt/kernel {c}" for c in configs)
print(head + " |")
print("|---|---|" + "---|" * (len(cols) + 2 * len(ratios) + len(configs)))
for rw, bs, qd in cells:
    v = {(s, c): val(f"{s}-{c}", rw, bs, qd) for s, c in cols}
    r = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
    row = f"| {rw} {bs} QD{qd} | {'IOPS' if bs == '4k' else 'MiB/s'} | "
    row += " | ".join(f"{v[k]:.0f}" if v[k] else "-" for k in cols)
    for c in ratios:
        row += f" | {r(v[('kernel', c)], v[('kernel', 'plain')])} | {r(v[('ucrypt', c)], v[('ucrypt', 'plain')])}"
    for c in configs:
        row += f" | {r(v[('ucrypt', c)], v[('kernel', c)])}"
    print(row + " |")
print()
p = os.path.join(out, "ciphers.txt")
if os.path.exists(p):
    print(open(p).read())
PY
echo "(fio JSON in $OUT)"
