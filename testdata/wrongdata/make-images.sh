#!/usr/bin/env bash
# Makes the wrong-data test images (issue 18, point 0) with independent tools and the real
# kernel. Run in the guest of the repository's VM harness (dm-crypt, dm-integrity, loop),
# from this directory:
#     ../../tests/lab/run.sh ./make-images.sh
# (the current directory is shared with the guest; it is where the images land).
# Writes *.img.xz and expected.txt. The images are committed; this script is how they came to be.
#
#   tc-cascade3.img  tcplay TrueCrypt volume, AES-256-XTS,TWOFISH-256-XTS,SERPENT-256-XTS,
#                    SHA512 PBKDF2; 64 KiB of a known pattern written through tcplay's own
#                    kernel mapping (tcplay -m), read back through cryptsetup's (--type tcrypt)
#   tc-cascade2.img  the same with TWOFISH-256-XTS,AES-256-XTS
#   luks2-hmac-512.img      cryptsetup luksFormat --integrity hmac-sha256 -s 512 (96-byte key)
#   luks2-hmac-256.img      --integrity hmac-sha256 -s 256 (64-byte key: fits AES-256-XTS)
#   luks2-aead-gcm.img      -c aes-gcm-random --integrity aead -s 256
#   luks2-plain.img         a LUKS2 volume (aes-xts-plain64, -s 256) of the same shape: control
# Every LUKS image was opened by cryptsetup on the kernel and has 64 KiB of the pattern
# written through that mapping. The keyslot area is sized to the one keyslot (4000 AF stripes
# of the key, rounded to 4 KiB): it is random bytes, the bulk of each compressed image.
# (A header with an unfinished reencryption needs no kernel: the tests make it with
# `cryptsetup reencrypt --init-only` on the host.)
# Passphrase of every image: "ucrypt-wrongdata".
set -euo pipefail
export DM_DISABLE_UDEV=1
PASS=ucrypt-wrongdata
W=$(mktemp -d /tmp/wrongdata.XXXXXX)
OUT=$PWD
printf '%s' "$PASS" > "$W/key"
# The pattern: SHA-256 in counter mode over a fixed seed, 64 KiB (reproducible anywhere).
python3 -c '
import hashlib, sys
out = b"".join(hashlib.sha256(b"ucrypt-wrongdata-%d" % i).digest() for i in range(2048))
sys.stdout.buffer.write(out)' > "$W/pattern"
PSUM=$(sha256sum < "$W/pattern" | cut -d" " -f1)
: > "$OUT/expected.txt"
echo "pattern_sha256 $PSUM" >> "$OUT/expected.txt"

# tcplay asks for the passphrase on a terminal: answer it through a pty.
tcplay_pty() {
  python3 - "$PASS" "$@" <<'PY'
import os, pty, select, sys
pw = sys.argv[1].encode() + b"\n"
pid, fd = pty.fork()
if pid == 0:
    os.execvp("tcplay", ["tcplay"] + sys.argv[2:])
out = b""; asked = 0; yes = False
while True:
    r, _, _ = select.select([fd], [], [], 120)
    if not r:
        break
    try:
        d = os.read(fd, 4096)
    except OSError:
        break
    if not d:
        break
    out += d
    s = out.decode(errors="replace")
    if s.count("assphrase:") > asked:
        os.write(fd, pw); asked += 1
    if "(y/n)" in s and not yes:
        os.write(fd, b"y\n"); yes = True
_, st = os.waitpid(pid, 0)
sys.stderr.write(out.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(st))
PY
}

check_pattern() { # device
  local got
  got=$(head -c 65536 "$1" | sha256sum | cut -d" " -f1)
  [ "$got" = "$PSUM" ] || { echo "pattern mismatch on $1: $got" >&2; exit 1; }
}

mk_tc() { # name chain
  local img=$W/$1.img
  truncate -s 1M "$img"
  local loop; loop=$(losetup -f --show "$img")
  tcplay_pty -c -d "$loop" -z -w -a SHA512 -b "$2" >/dev/null
  tcplay_pty -m "wd$1" -d "$loop" >/dev/null
  dmsetup mknodes
  dd if="$W/pattern" of="/dev/mapper/wd$1" bs=65536 count=1 oflag=direct status=none
  sync
  dmsetup table | sed 's/ [0-9a-f]\{64,\} / <key> /'
  tcplay -u "wd$1"
  # An independent second reader: cryptsetup's TCRYPT support on the kernel.
  # (--key-file would be a TrueCrypt key file here: the passphrase comes on stdin.)
  printf '%s' "$PASS" | cryptsetup open --type tcrypt "$loop" "cs$1"
  dmsetup mknodes
  check_pattern "/dev/mapper/cs$1"
  cryptsetup close "cs$1"
  losetup -d "$loop"
  echo "$1 chain=$2 size=$(stat -c %s "$img")" >> "$OUT/expected.txt"
  xz -9 -T1 -c "$img" > "$OUT/$1.img.xz"
}

mk_luks() { # name keyslots-size cryptsetup-options...
  local name=$1 ks=$2; shift 2
  local img=$W/$name.img
  truncate -s 4M "$img"
  cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --luks2-metadata-size 16k --luks2-keyslots-size "$ks" --key-file "$W/key" "$@" "$img"
  cryptsetup open --key-file "$W/key" "$img" "wd$name"
  dmsetup mknodes
  dd if="$W/pattern" of="/dev/mapper/wd$name" bs=65536 count=1 oflag=direct status=none
  sync
  check_pattern "/dev/mapper/wd$name"
  dmsetup table "wd$name" | sed 's/ [0-9a-f]\{64,\} / <key> /'
  cryptsetup close "wd$name"
  # Any loop device cryptsetup made for the file is gone with close.
  echo "$name options=$* segment0=$(cryptsetup luksDump --dump-json-metadata "$img" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["segments"]["0"], sort_keys=True, separators=(",", ":")))')" >> "$OUT/expected.txt"
}

echo "tcplay cascades" > "$OUT/progress.log"
mk_tc tc-cascade3 AES-256-XTS,TWOFISH-256-XTS,SERPENT-256-XTS
mk_tc tc-cascade2 TWOFISH-256-XTS,AES-256-XTS

echo "luks" >> "$OUT/progress.log"
# keyslots size: 32-byte key x 4000 = 128000 -> 128k; 64 -> 256000 -> 252k; 96 -> 384000 -> 376k
mk_luks luks2-plain 128k -c aes-xts-plain64 -s 256
mk_luks luks2-hmac-512 376k -c aes-xts-plain64 -s 512 --integrity hmac-sha256 --integrity-no-wipe
mk_luks luks2-hmac-256 252k -c aes-xts-plain64 -s 256 --integrity hmac-sha256 --integrity-no-wipe
mk_luks luks2-aead-gcm 128k -c aes-gcm-random -s 256 --integrity aead --integrity-no-wipe
for n in luks2-plain luks2-hmac-512 luks2-hmac-256 luks2-aead-gcm; do
  xz -9 -T1 -c "$W/$n.img" > "$OUT/$n.img.xz"
done
rm -rf "$W" "$OUT/progress.log"
cat "$OUT/expected.txt"
ls -la "$OUT"
