#!/bin/bash
# Guest half of bench/lab-integrity.sh (runs as root in the guest of tests/lab/run.sh).
#   lab-integrity-guest.sh UCRYPT RUNTIME_S OUT_DIR [CONFIGS] [ROUNDS]
# One brd ramdisk per config of CONFIGS (default "plain hmac-sha256 aes-gcm"), each holding
# a LUKS2 volume formatted by cryptsetup (plain: aes-xts-plain64 512-bit key; hmac-sha256:
# the same plus --integrity hmac-sha256; aes-gcm: aes-gcm-random with --integrity aead;
# 4096-byte sectors, journal mode). Each of ROUNDS (default 3) opens every device in turn,
# runs the four cells (fio libaio, direct) on it and closes it: the kernel's (cryptsetup
# open: dm-crypt over dm-integrity) and ucrypt's (ucrypt open --device ublk) of each
# config, the order rotated each round. So a drift of the guest's speed during the run
# spreads over all devices instead of landing on whichever ran last.
# Results: fio JSON files in OUT_DIR named rROUND-SIDE-CONFIG.RW.BS.QD.json, and which
# cipher code each side had in OUT_DIR/ciphers.txt.
set -eu
UCRYPT=$1 RT=$2 OUT=$3
read -r -a CONFIGS <<< "${4:-plain hmac-sha256 aes-gcm}"
ROUNDS=${5:-3}
mkdir -p "$OUT"
MIB=160
rmmod brd 2>/dev/null || true
modprobe brd rd_nr=${#CONFIGS[@]} rd_size=$((MIB * 1024))
T=$(mktemp -d)
printf 'bench' > "$T/pass"
export UCRYPT_RUNTIME_DIR=$T/run
mkdir -p "$UCRYPT_RUNTIME_DIR"

{
  echo "# guest CPU flags: $(grep -m1 -o -w -E 'aes|vaes|avx2|avx512f|vpclmulqdq|pclmulqdq|sha_ni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  grep -m1 '^model name' /proc/cpuinfo
} > "$OUT/ciphers.txt"
declare -A DISK
i=0
for c in "${CONFIGS[@]}"; do
  case $c in
    plain) args=(--cipher aes-xts-plain64 --key-size 512) ;;
    hmac-sha256) args=(--cipher aes-xts-plain64 --key-size 512 --integrity hmac-sha256) ;;
    aes-gcm) args=(--cipher aes-gcm-random --key-size 256 --integrity aead) ;;
    *) echo "unknown config $c" >&2; exit 1 ;;
  esac
  DISK[$c]=/dev/ram$i
  i=$((i + 1))
  dd if=/dev/zero of="${DISK[$c]}" bs=1M count=$MIB oflag=direct status=none
  t0=$(date +%s)
  cryptsetup luksFormat -q --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --sector-size 4096 --key-file "$T/pass" "${args[@]}" "${DISK[$c]}"
  echo "# $c: luksFormat (with the integrity wipe) took $(( $(date +%s) - t0 )) s"
  cryptsetup open --key-file "$T/pass" "${DISK[$c]}" kbench
  {
    echo "# $c: kernel tables:"
    dmsetup table | sed -E 's/ [0-9a-f]{32,} / KEY /; s/^/#   /'
    awk '/^name/{n=$3} /^driver/{d=$3} /^priority/{p=$3} /^type/{t=$3; if (t=="skcipher" || t=="aead" || t=="shash") print "#   " t " " n " -> " d " (priority " p ")"}' /proc/crypto |
      grep -E 'xts|gcm|authenc|hmac|sha256' | sort -u
  } >> "$OUT/ciphers.txt"
  cryptsetup close kbench
  "$UCRYPT" open "${DISK[$c]}" ubench --device ublk --key-file "$T/pass" > /dev/null 2> "$T/err" ||
    { echo "ucrypt open ($c) failed: $(cat "$T/err")" >&2; exit 1; }
  "$UCRYPT" status ubench | sed 's/^/#   ucrypt status: /' >> "$OUT/ciphers.txt"
  "$UCRYPT" close ubench
done

DEVICES=()
for c in "${CONFIGS[@]}"; do DEVICES+=("kernel-$c" "ucrypt-$c"); done
up() { # kernel-CONFIG | ucrypt-CONFIG -> DEV
  local side=${1%%-*} c=${1#*-}
  if [ "$side" = kernel ]; then
    cryptsetup open --key-file "$T/pass" "${DISK[$c]}" kbench
    dmsetup mknodes
    DEV=/dev/mapper/kbench
  else
    "$UCRYPT" open "${DISK[$c]}" ubench --device ublk --key-file "$T/pass" > /dev/null 2> "$T/err" ||
      { echo "ucrypt open ($c) failed: $(cat "$T/err")" >&2; exit 1; }
    DEV=$(ls /dev/ublkb* | head -1)
  fi
}
down() {
  if [ "${1%%-*}" = kernel ]; then cryptsetup close kbench; else "$UCRYPT" close ubench; fi
}
n=${#DEVICES[@]}
for r in $(seq "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    d=${DEVICES[$(( (k + r - 1) % n ))]}
    up "$d"
    for j in "randread 4k 32" "randwrite 4k 32" "read 1M 8" "write 1M 8"; do
      set -- $j
      fio --name="$d" --filename="$DEV" --ioengine=libaio --direct=1 --rw=$1 --bs=$2 \
        --iodepth=$3 --numjobs=1 --time_based --runtime="$RT" --ramp_time=1 \
        --output-format=json --output="$OUT/r$r-$d.$1.$2.$3.json" > /dev/null
    done
    down "$d"
    echo "# round $r: $d done ($(cut -d' ' -f1-3 /proc/loadavg))"
  done
done
nproc | sed 's/^/# vCPUs: /'
