#!/bin/bash
# Guest half of bench/lab-integrity.sh (runs as root in the guest of tests/lab/run.sh).
#   lab-integrity-guest.sh UCRYPT RUNTIME_S OUT_DIR [CONFIGS]
# One brd ramdisk as backing; for each of CONFIGS (default "plain hmac-sha256 aes-gcm"):
# a LUKS2 volume formatted on it by cryptsetup (plain: aes-xts-plain64 512-bit key;
# hmac-sha256: the same plus --integrity hmac-sha256; aes-gcm: aes-gcm-random with
# --integrity aead; 4096-byte sectors, journal mode), then opened by the kernel
# (cryptsetup open: dm-crypt over dm-integrity) and by ucrypt (ucrypt open --device ublk)
# one after the other, and fio (libaio, direct) runs the same four jobs on each. Results:
# fio JSON files in OUT_DIR named SIDE-CONFIG.RW.BS.QD.json, and which cipher code each
# side had in OUT_DIR/ciphers.txt.
set -eu
UCRYPT=$1 RT=$2 OUT=$3
CONFIGS=${4:-plain hmac-sha256 aes-gcm}
mkdir -p "$OUT"
MIB=160
rmmod brd 2>/dev/null || true
modprobe brd rd_nr=1 rd_size=$((MIB * 1024))
dd if=/dev/zero of=/dev/ram0 bs=1M count=$MIB oflag=direct status=none
T=$(mktemp -d)
printf 'bench' > "$T/pass"
export UCRYPT_RUNTIME_DIR=$T/run
mkdir -p "$UCRYPT_RUNTIME_DIR"

jobs() { # DEVICE LABEL
  local dev=$1 label=$2
  for j in "randread 4k 32" "randwrite 4k 32" "read 1M 8" "write 1M 8"; do
    set -- $j
    fio --name="$label" --filename="$dev" --ioengine=libaio --direct=1 --rw=$1 --bs=$2 \
      --iodepth=$3 --numjobs=1 --time_based --runtime="$RT" --ramp_time=1 \
      --output-format=json --output="$OUT/$label.$1.$2.$3.json" > /dev/null
  done
  echo "# $label done"
}

{
  echo "# guest CPU flags: $(grep -m1 -o -w -E 'aes|vaes|avx2|avx512f|vpclmulqdq|pclmulqdq|sha_ni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  grep -m1 '^model name' /proc/cpuinfo
} > "$OUT/ciphers.txt"
for c in $CONFIGS; do
  case $c in
    plain) args=(--cipher aes-xts-plain64 --key-size 512) ;;
    hmac-sha256) args=(--cipher aes-xts-plain64 --key-size 512 --integrity hmac-sha256) ;;
    aes-gcm) args=(--cipher aes-gcm-random --key-size 256 --integrity aead) ;;
    *) echo "unknown config $c" >&2; exit 1 ;;
  esac
  t0=$(date +%s)
  cryptsetup luksFormat -q --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --sector-size 4096 --key-file "$T/pass" "${args[@]}" /dev/ram0
  echo "# $c: luksFormat (with the integrity wipe) took $(( $(date +%s) - t0 )) s"
  cryptsetup open --key-file "$T/pass" /dev/ram0 kbench
  dmsetup mknodes
  {
    echo "# $c: kernel tables:"
    dmsetup table | sed -E 's/ [0-9a-f]{32,} / KEY /; s/^/#   /'
    awk '/^name/{n=$3} /^driver/{d=$3} /^priority/{p=$3} /^type/{t=$3; if (t=="skcipher" || t=="aead" || t=="shash") print "#   " t " " n " -> " d " (priority " p ")"}' /proc/crypto |
      grep -E 'xts|gcm|authenc|hmac|sha256' | sort -u
  } >> "$OUT/ciphers.txt"
  jobs /dev/mapper/kbench "kernel-$c"
  cryptsetup close kbench
  "$UCRYPT" open /dev/ram0 ubench --device ublk --key-file "$T/pass" 2> "$T/err" ||
    { echo "ucrypt open ($c) failed: $(cat "$T/err")" >&2; exit 1; }
  dev=$(ls /dev/ublkb* | head -1)
  "$UCRYPT" status ubench | sed 's/^/#   ucrypt status: /' >> "$OUT/ciphers.txt"
  jobs "$dev" "ucrypt-$c"
  "$UCRYPT" close ubench
done
nproc | sed 's/^/# vCPUs: /'
