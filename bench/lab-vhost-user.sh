#!/bin/bash
# A VM's encrypted disk three ways, side by side in one guest of tests/lab/run.sh (issue 30,
# item 6): fio (libaio, direct) in the guest on
#   ucrypt  - ucrypt open --device vhost-user (2 queues), a vhost-user-blk-pci disk;
#   ucrypt-1 - the same with --nbd-workers 1: one request at a time per queue (the
#             default keeps up to 8 of a queue's requests in flight);
#   qsd     - qemu-storage-daemon exporting a `luks` blockdev over vhost-user-blk (2 queues);
#   dm-crypt - the guest kernel's own dm-crypt over a plain virtio-blk disk.
# The three images are alike: LUKS1 aes-xts-plain64, 512-bit key, 512-byte sectors (QEMU
# 7.2's luks driver reads LUKS1 only), 256 MiB of data, in the host's /dev/shm (no disk:
# the crypto and the transport are measured).
#   bench/lab-vhost-user.sh [RUNTIME_SECONDS]     (default 5 per cell; about 4 min in all)
# UCRYPT names the binary (default target/release/ucrypt, built if missing); OPEN_ARGS adds
# options to ucrypt's open (engine knobs: --perf-no_read_workqueue ...). TCG distorts
# absolute speed: only ratios inside one run mean anything. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-5}
if [ -z "${UCRYPT:-}" ]; then
  UCRYPT=${CARGO_TARGET_DIR:-target}/release/ucrypt
  [ -x "$UCRYPT" ] || cargo build --release -p ucrypt-cli >&2
fi
U=$(realpath "$UCRYPT")
W=$(mktemp -d "$PWD/target/lab-vu-bench.XXXXXX")
S=$(mktemp -d /dev/shm/vu-bench.XXXXXX)
NAME=vubench$$
QSD=
cleanup() {
  "$U" close --force "$NAME" 2>/dev/null || true
  "$U" close --force "${NAME}s" 2>/dev/null || true
  [ -n "$QSD" ] && kill "$QSD" 2>/dev/null && wait "$QSD" 2>/dev/null
  rm -rf "$S"
}
trap cleanup EXIT
printf 'bench passphrase' > "$W/pass"
for n in uc uc1 qsd dm; do
  truncate -s 258M "$S/$n.img"
  "$U" luksFormat -q --type luks1 --pbkdf-force-iterations 1000 -d "$W/pass" "$S/$n.img"
done
"$U" luksOpen --print-table --showkeys -d "$W/pass" "$S/dm.img" > "$W/dm.table"
"$U" open "$S/uc.img" "$NAME" --device vhost-user --vhost-socket "$S/uc.sock" --queues 2 \
  -d "$W/pass" ${OPEN_ARGS:-} > /dev/null
"$U" open "$S/uc1.img" "${NAME}s" --device vhost-user --vhost-socket "$S/uc1.sock" --queues 2 \
  --nbd-workers 1 -d "$W/pass" ${OPEN_ARGS:-} > /dev/null
qemu-storage-daemon --object secret,id=sec0,file="$W/pass" \
  --blockdev driver=file,node-name=file0,filename="$S/qsd.img" \
  --blockdev driver=luks,node-name=luks0,file=file0,key-secret=sec0 \
  --export type=vhost-user-blk,id=exp0,node-name=luks0,addr.type=unix,addr.path="$S/qsd.sock",writable=on,num-queues=2 &
QSD=$!
for _ in $(seq 100); do [ -S "$S/qsd.sock" ] && break; sleep 0.1; done
LAB_SHARED_MEM=1 LAB_TIMEOUT=1800 LAB_QEMU_ARGS="-chardev socket,id=vu0,path=$S/uc.sock \
-device vhost-user-blk-pci,chardev=vu0,num-queues=2 -chardev socket,id=vu1,path=$S/qsd.sock \
-device vhost-user-blk-pci,chardev=vu1,num-queues=2 -chardev socket,id=vu2,path=$S/uc1.sock \
-device vhost-user-blk-pci,chardev=vu2,num-queues=2 -drive file=$S/dm.img,if=none,id=d2,format=raw \
-device virtio-blk-pci,drive=d2,serial=plain,num-queues=2" \
  tests/lab/run.sh bench/lab-vhost-user-guest.sh "$W" "$NAME" "$RT"
python3 - "$W" <<'PY'
import json, os, sys
out = sys.argv[1]
devs = ["ucrypt", "ucrypt-1", "qsd", "dm-crypt"]
cells = [("randread", "4k", 1), ("randread", "4k", 32), ("randwrite", "4k", 32),
         ("read", "1M", 8), ("write", "1M", 8)]
def val(dev, rw, bs, qd):
    p = os.path.join(out, f"{dev}.{rw}.{bs}.{qd}.json")
    if not os.path.exists(p):
        return None
    j = json.load(open(p))["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return side["iops"] if bs == "4k" else side["bw_bytes"] / 2**20
print("| cell | unit | " + " | ".join(devs) + " | ucrypt/ucrypt-1 | ucrypt/qsd | ucrypt/dm-crypt |")
print("|---|---|" + "---|" * (len(devs) + 3))
for rw, bs, qd in cells:
    v = {d: val(d, rw, bs, qd) for d in devs}
    unit = "IOPS" if bs == "4k" else "MiB/s"
    r = lambda a, b: f"{v[a] / v[b]:.2f}x" if v[a] and v[b] else "-"
    print(f"| {rw} {bs} QD{qd} | {unit} | " + " | ".join(f"{v[d]:.0f}" if v[d] else "-" for d in devs)
          + f" | {r('ucrypt', 'ucrypt-1')} | {r('ucrypt', 'qsd')} | {r('ucrypt', 'dm-crypt')} |")
PY
echo "(fio JSON in $W)"
