#!/bin/bash
# Issue 15 item 3: which cipher specs does dm-crypt of Debian's 6.12 kernel accept that
# ucrypt did not, and what ciphertext does it write for them. One guest run (from the repo root):
#   tests/lab/run.sh testdata/golden/make-kernel-ciphers.sh "$PWD/testdata/golden"
# Writes $1/kernel-6.12-proc-crypto.txt (the guest's /proc/crypto after loading every cipher
# module of the kernel, one line per algorithm), $1/kernel-6.12-spec-probe.jsonl (every spec
# tried, accepted or the kernel's refusal), and for accepted specs the usual golden case
# (manifest.jsonl line + ct/<case>.bin.gz, pattern-v1 written with O_DIRECT through
# /dev/mapper/<case> over a zeroed brd ramdisk, the ramdisk read back). Specs the kernel
# refuses that ucrypt must refuse too are added to the manifest as "rejected" cases.
# Cases already in the manifest are skipped.
set -euo pipefail
out=$1
modprobe brd rd_nr=1 rd_size=$((4 * 1024))
for m in des_generic cast5_generic cast6_generic fcrypt blowfish_generic camellia_generic \
         serpent_generic twofish_generic crypto_null pcbc cts lrw xts essiv chacha_generic \
         adiantum nhpoly1305 streebog_generic blake2b_generic md4 rmd160 wp512 sha3_generic \
         sm4_generic aria_generic seed tea anubis khazad xctr hctr2 cfb ofb; do
    modprobe "$m" 2>/dev/null || echo "module $m: not in this kernel"
done
python3 - "$out" <<'PY'
import gzip, hashlib, json, mmap, os, subprocess, sys
out = sys.argv[1]
# /proc/crypto, one line per entry: name driver type blocksize ivsize min-max keysize
entries, cur = [], {}
for line in open("/proc/crypto"):
    line = line.strip()
    if not line:
        if cur: entries.append(cur)
        cur = {}
        continue
    k, _, v = line.partition(":")
    cur[k.strip()] = v.strip()
if cur: entries.append(cur)
with open(os.path.join(out, "kernel-6.12-proc-crypto.txt"), "w") as f:
    f.write("# /proc/crypto of the kernel lab guest (Debian 6.12) after loading every cipher module\n")
    f.write("# name | driver | type | blocksize | ivsize | min_keysize-max_keysize\n")
    for e in sorted(entries, key=lambda e: (e.get("type", ""), e.get("name", ""), e.get("driver", ""))):
        f.write(" | ".join([e.get("name", ""), e.get("driver", ""), e.get("type", ""),
                            e.get("blocksize", "-"), e.get("ivsize", "-"),
                            e.get("min keysize", "-") + "-" + e.get("max keysize", "-")]) + "\n")
# name, spec, key bytes, iv_offset, opt_params, sectors, what a kernel refusal means:
#   "probe" (record only) or "reject" (add to the manifest: ucrypt must refuse it too)
cases = [
    ("des-cbc-plain64-k64", "des-cbc-plain64", 8, 0, "", 64, "probe"),
    ("des-ecb-k64", "des-ecb", 8, 0, "", 16, "probe"),
    ("des-ctr-plain64-k64", "des-ctr-plain64", 8, 0, "", 16, "probe"),
    ("cast6-xts-plain64-k512", "cast6-xts-plain64", 64, 0, "", 64, "probe"),
    ("cast6-cbc-essiv-sha256-k256", "cast6-cbc-essiv:sha256", 32, 0, "", 64, "probe"),
    ("cast6-lrw-benbi-k384", "cast6-lrw-benbi", 48, 0, "", 64, "probe"),
    ("cast6-cbc-plain64-k160", "cast6-cbc-plain64", 20, 0, "", 16, "probe"),
    ("aes-pcbc-plain64-k256", "aes-pcbc-plain64", 32, 0, "", 64, "probe"),
    ("des3_ede-pcbc-plain64-k192", "des3_ede-pcbc-plain64", 24, 0, "", 16, "probe"),
    ("aes-cts-cbc-plain64-k256", "capi:cts(cbc(aes))-plain64", 32, 0, "", 64, "probe"),
    ("aes-cbc-essiv-sha3-256-k256", "aes-cbc-essiv:sha3-256", 32, 0, "", 16, "probe"),
    ("aes-cbc-essiv-streebog256-k256", "aes-cbc-essiv:streebog256", 32, 0, "", 16, "probe"),
    ("aes-cbc-essiv-blake2b-256-k256", "aes-cbc-essiv:blake2b-256", 32, 0, "", 16, "probe"),
    ("aes-cbc-essiv-md4-k256", "aes-cbc-essiv:md4", 32, 0, "", 16, "probe"),
    ("fcrypt-cbc-plain64-k64", "fcrypt-cbc-plain64", 8, 0, "", 16, "probe"),
    ("chacha20-plain64-k256", "capi:chacha20-plain64", 32, 0, "", 16, "probe"),
    ("cipher_null-cbc-plain", "cipher_null-cbc-plain", 0, 0, "", 16, "probe"),
    ("sm4-xts-plain64-k256", "sm4-xts-plain64", 32, 0, "", 16, "reject"),
    ("aria-xts-plain64-k512", "aria-xts-plain64", 64, 0, "", 16, "reject"),
    ("seed-cbc-plain64-k128", "seed-cbc-plain64", 16, 0, "", 16, "reject"),
    ("tea-cbc-plain64-k128", "tea-cbc-plain64", 16, 0, "", 16, "reject"),
    ("xtea-cbc-plain64-k128", "xtea-cbc-plain64", 16, 0, "", 16, "reject"),
    ("anubis-cbc-plain64-k128", "anubis-cbc-plain64", 16, 0, "", 16, "reject"),
    ("khazad-cbc-plain64-k128", "khazad-cbc-plain64", 16, 0, "", 16, "reject"),
    ("aes-cfb-plain64-k256", "aes-cfb-plain64", 32, 0, "", 16, "reject"),
    ("aes-ofb-plain64-k256", "aes-ofb-plain64", 32, 0, "", 16, "reject"),
    ("aes-xctr-plain64-k256", "capi:xctr(aes)-plain64", 32, 0, "", 16, "reject"),
    ("aes-hctr2-plain64-k256", "aes-hctr2-plain64", 32, 0, "", 16, "probe"),
    ("kuznyechik-xts-plain64-k512", "kuznyechik-xts-plain64", 64, 0, "", 16, "probe"),
]
have = set()
with open(os.path.join(out, "manifest.jsonl")) as m:
    for line in m:
        have.add(json.loads(line)["name"])
def run(*a):
    return subprocess.run(a, capture_output=True)
probe = open(os.path.join(out, "kernel-6.12-spec-probe.jsonl"), "w")
for name, cipher, klen, ivoff, opts, sectors, refusal in cases:
    key = os.urandom(klen).hex() if klen else "-"
    with open("/dev/ram0", "r+b") as f:
        f.write(bytes(sectors * 512)); f.flush(); os.fsync(f.fileno())
    table = f"0 {sectors} crypt {cipher} {key} {ivoff} /dev/ram0 0" + (f" {opts}" if opts else "")
    run("dmesg", "-C")
    r = run("dmsetup", "create", name, "--table", table)
    if r.returncode != 0:
        msgs = [l.split("] ", 1)[-1] for l in run("dmesg").stdout.decode().splitlines()
                if "device-mapper" in l]
        probe.write(json.dumps({"name": name, "cipher": cipher, "kernel": "refused",
                                "kernel_messages": msgs}) + "\n")
        print("refused", name, msgs)
        if refusal == "reject" and name not in have:
            case = {"name": name, "result": "rejected", "expected": "reject", "table": table,
                    "cipher": cipher, "key_hex": key, "key_bytes": klen, "iv_offset": ivoff,
                    "offset_sectors": 0, "opt_params": opts, "sectors": sectors,
                    "kernel_messages": msgs,
                    "made_by": "testdata/golden/make-kernel-ciphers.sh (kernel-lab, Debian 6.12 kernel)"}
            with open(os.path.join(out, "manifest.jsonl"), "a") as m:
                m.write(json.dumps(case) + "\n")
        continue
    run("dmsetup", "mknodes")
    kernel_table = run("dmsetup", "table", "--showkeys", name).stdout.decode().strip()
    plain = bytes(((n * 31 + i) & 0xff) for n in range(sectors) for i in range(512))
    fd = os.open(f"/dev/mapper/{name}", os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, len(plain)); buf.write(plain)
    os.write(fd, buf); os.fsync(fd); os.close(fd)
    subprocess.run(["dmsetup", "remove", name], check=True)
    with open("/dev/ram0", "rb") as f:
        ct = f.read(sectors * 512)
    probe.write(json.dumps({"name": name, "cipher": cipher, "kernel": "accepted",
                            "identity": ct == plain}) + "\n")
    print("accepted", name, "(ciphertext = plaintext)" if ct == plain else "")
    if name in have:
        continue
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
        "made_by": "testdata/golden/make-kernel-ciphers.sh (kernel-lab, Debian 6.12 kernel)",
        "kernel_messages": [],
    }
    with open(os.path.join(out, "manifest.jsonl"), "a") as m:
        m.write(json.dumps(case) + "\n")
probe.close()
PY
