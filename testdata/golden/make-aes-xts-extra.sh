#!/bin/bash
# Makes the extra golden cases (AES-192-XTS, AES-128-XTS with 4 KiB sectors and an IV
# offset, CTR mode) with the real dm-crypt, in the guest of tests/lab/run.sh (from the repo root):
#   tests/lab/run.sh testdata/golden/make-aes-xts-extra.sh "$PWD/testdata/golden"
# Appends one manifest line per case to $1/manifest.jsonl and writes $1/ct/<case>.bin.gz,
# in the format of the original set (see README.md): pattern-v1 plaintext written with
# O_DIRECT through /dev/mapper/<case> over a zeroed brd ramdisk, the ramdisk read back.
# Cases already in the manifest are skipped.
set -euo pipefail
out=$1
modprobe brd rd_nr=1 rd_size=$((4 * 1024))
python3 - "$out" <<'PY'
import gzip, hashlib, json, os, subprocess, sys
out = sys.argv[1]
cases = [
    # name, cipher, key bytes, iv_offset, opt_params, sectors
    ("aes-xts-plain64-k384", "aes-xts-plain64", 48, 0, "", 256),
    ("aes-xts-plain64-k256-ss4096", "aes-xts-plain64", 32, 0, "1 sector_size:4096", 256),
    ("aes-xts-plain64-k256-ivoff", "aes-xts-plain64", 32, 12345, "", 256),
    ("aes-ctr-plain64-k256", "aes-ctr-plain64", 32, 0, "", 256),
    ("aes-ctr-plain64-k128-ivwrap", "aes-ctr-plain64", 16, 2**64 - 128, "", 256),
    ("aes-ctr-plain64-k256-ss4096", "aes-ctr-plain64", 32, 0, "1 sector_size:4096", 256),
    ("serpent-ctr-plain64-k256", "serpent-ctr-plain64", 32, 0, "", 64),
    ("aes-ctr-plain-k256", "aes-ctr-plain", 32, 4294967040, "", 512),
]
have = set()
with open(os.path.join(out, "manifest.jsonl")) as m:
    for line in m:
        have.add(json.loads(line)["name"])
def run(*a, **k):
    return subprocess.run(a, check=True, capture_output=True, **k)
for name, cipher, klen, ivoff, opts, sectors in cases:
    if name in have:
        continue
    key = os.urandom(klen).hex()
    with open("/dev/ram0", "r+b") as f:
        f.write(bytes(sectors * 512)); f.flush(); os.fsync(f.fileno())
    table = f"0 {sectors} crypt {cipher} {key} {ivoff} /dev/ram0 0" + (f" {opts}" if opts else "")
    run("dmsetup", "create", name, "--table", table)
    run("dmsetup", "mknodes")
    kernel_table = run("dmsetup", "table", "--showkeys", name).stdout.decode().strip()
    plain = bytes(((n * 31 + i) & 0xff) for n in range(sectors) for i in range(512))
    fd = os.open(f"/dev/mapper/{name}", os.O_WRONLY | os.O_DIRECT)
    import mmap
    buf = mmap.mmap(-1, len(plain)); buf.write(plain)
    os.write(fd, buf); os.fsync(fd); os.close(fd)
    run("dmsetup", "remove", name)
    with open("/dev/ram0", "rb") as f:
        ct = f.read(sectors * 512)
    assert ct != plain and any(ct)
    ctfile = f"ct/{name}.bin.gz"
    with gzip.open(os.path.join(out, ctfile), "wb") as g:
        g.write(ct)
    case = {
        "name": name, "result": "ok", "expected": "ok", "table": table,
        "lower_device": "/dev/ram0 (brd ramdisk, zero-filled before each case)",
        "cipher": cipher, "key_hex": key, "key_bytes": klen,
        "iv_offset": ivoff, "offset_sectors": 0, "opt_params": opts, "sectors": sectors,
        "kernel_table": kernel_table, "logical_block_size": 512,
        "plaintext": "pattern-v1: byte i (0..511) of 512-byte sector n of the plaintext = (n*31 + i) & 0xff, n counted from 0 at the first sector of the dm device (independent of sector_size, iv_offset and device offset)",
        "plaintext_sha256": hashlib.sha256(plain).hexdigest(),
        "ciphertext_bytes": len(ct), "ciphertext_sha256": hashlib.sha256(ct).hexdigest(),
        "ciphertext_file": ctfile, "ciphertext_head_hex": ct[:64].hex(),
        "made_by": "testdata/golden/make-aes-xts-extra.sh (kernel-lab, Debian 6.12 kernel)",
        "kernel_messages": [],
    }
    with open(os.path.join(out, "manifest.jsonl"), "a") as m:
        m.write(json.dumps(case) + "\n")
    print("made", name)
PY
