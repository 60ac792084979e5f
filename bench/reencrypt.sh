#!/usr/bin/env bash
# The reencryption data pass against `ucrypt write` of the same size (issue 16's target:
# at least 0.8x), side by side in one run: each round writes the plaintext through
# `ucrypt write` (encrypt + write + final flush) onto a fresh LUKS2 image, then runs
# `ucrypt reencrypt` (read + decrypt old key + encrypt new key + write, with the resilience
# mode's syncs and header updates) on a fresh initialised copy, once per resilience mode.
# Rounds are interleaved; medians and ratios at the end. Wall time of the whole command
# (start-up, key unlock and, for reencrypt, the final keyslot wipes included).
# With CRYPTSETUP=1 (the default) each round also times `cryptsetup reencrypt
# --resume-only --force-offline-reencrypt` of the same initialised images (cryptsetup
# 2.6.1 re-encrypts through the kernel crypto API offline; a row is left out when it fails).
#
# With UCRYPT_BASE=BINARY each round also runs the same reencryptions with that binary (an
# older build: before/after rows from one run, the two binaries' runs alternating in order
# from round to round). MODES="checksum journal" limits the modes; HOTZONE=SIZE passes
# --hotzone-size SIZE to every reencrypt (both binaries).
#
#   bench/reencrypt.sh [SIZE_MIB] [ROUNDS]        (defaults 512, 5)
#   UCRYPT=path/to/ucrypt  UCRYPT_BASE=path/to/old/ucrypt  MODES="none checksum journal"
#   HOTZONE=  BENCH_DIR=dir (default: a temp dir under /var/tmp)  CRYPTSETUP=0
set -euo pipefail
size=${1:-512}
rounds=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
U=${UCRYPT:-$here/target/release/ucrypt}
[ -x "$U" ] || { echo "build first: cargo build --release -p ucrypt-cli (or set UCRYPT)" >&2; exit 1; }
B=${UCRYPT_BASE:-}
if [ -n "$B" ]; then
  [ -x "$B" ] || { echo "UCRYPT_BASE=$B is not executable" >&2; exit 1; }
  B=$(realpath "$B")
fi
U=$(realpath "$U")
modes=${MODES:-none checksum journal}
hz=()
[ -z "${HOTZONE:-}" ] || hz=(--hotzone-size "$HOTZONE")
command -v cryptsetup >/dev/null || { echo "needs cryptsetup (scripts/setup.sh)" >&2; exit 1; }
dir=$(mktemp -d "${BENCH_DIR:-/var/tmp}/ucrypt-reenc-bench.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir"
printf 'bench passphrase' > pass
truncate -s $(( (16 + size) << 20 )) fresh.img
cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
  --key-file pass fresh.img
head -c $(( size << 20 )) /dev/urandom > plain.bin
"$U" luksOpen --print-table --showkeys -d pass fresh.img > table
# The plaintext once, then the initialised images for each mode.
cp fresh.img written.img
"$U" write --table-file table --input plain.bin
sed "s#fresh.img#written.img#" table > table-written
"$U" write --table-file table-written --input plain.bin
for mode in $modes; do
  cp written.img "init-$mode.img"
  "$U" reencrypt --init-only -q -d pass --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --resilience "$mode" --disable-locks "init-$mode.img"
done
# "wall cpu" seconds of one command (cpu = user + system, all threads): on a shared
# machine the CPU time is the steadier figure of the work done.
secs() { /usr/bin/time -f '%e %U %S' -o t.out "$@" >/dev/null 2>&1; awk '{printf "%s %.2f\n", $1, $2 + $3}' t.out; }
declare -A times cpu
cs=${CRYPTSETUP:-1}
declare -A csok=([none]=$cs [checksum]=$cs [journal]=$cs)
for r in $(seq "$rounds"); do
  cp fresh.img w.img; sync
  sed "s#fresh.img#w.img#" table > table-w
  read -r wall c < <(secs "$U" write --table-file table-w --input plain.bin)
  times[write]+="$wall "; cpu[write]+="$c "
  for mode in $modes; do
    # The two binaries in alternating order from round to round.
    bins=(new); [ -z "$B" ] || { if [ $((r % 2)) = 1 ]; then bins=(base new); else bins=(new base); fi; }
    for b in "${bins[@]}"; do
      bin=$U key=$mode; [ "$b" = new ] || { bin=$B; key=base-$mode; }
      cp "init-$mode.img" r.img; sync
      read -r wall c < <(secs "$bin" reencrypt --resume-only -q -d pass --disable-locks "${hz[@]}" r.img)
      times[$key]+="$wall "; cpu[$key]+="$c "
    done
    if [ "${csok[$mode]}" = 1 ]; then
      cp "init-$mode.img" r.img; sync
      if read -r wall c < <(secs cryptsetup reencrypt --resume-only --force-offline-reencrypt \
          -q --key-file pass --disable-locks r.img) && [ -n "$wall" ] \
          && [ "$(cryptsetup luksDump r.img | grep -c reencrypt)" = 0 ]; then
        times[cs-$mode]+="$wall "; cpu[cs-$mode]+="$c "
      else
        echo "cryptsetup reencrypt ($mode) did not finish here: its row is left out" >&2
        csok[$mode]=0
      fi
    fi
  done
  echo "round $r done" >&2
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
w=$(echo "${times[write]}" | median)
wc=$(echo "${cpu[write]}" | median)
printf '%-20s %7s %8s %6s %8s %6s   %s\n' what wall MiB/s ratio cpu ratio "wall of each run (s)"
row() { # name wall cpu runs
  printf '%-20s %7.3f %8.1f %6.2f %8.2f %6.2f   %s\n' "$1" "$2" "$(echo "$size / $2" | bc -l)" \
    "$(echo "$w / $2" | bc -l)" "$3" "$(echo "$wc / $3" | bc -l)" "$4"
}
row "ucrypt write" "$w" "$wc" "${times[write]}"
for mode in $modes; do
  if [ -n "$B" ]; then
    row "base $mode" "$(echo "${times[base-$mode]}" | median)" "$(echo "${cpu[base-$mode]}" | median)" "${times[base-$mode]}"
  fi
  row "reencrypt $mode" "$(echo "${times[$mode]}" | median)" "$(echo "${cpu[$mode]}" | median)" "${times[$mode]}"
done
for mode in $modes; do
  [ "${csok[$mode]}" = 1 ] || continue
  row "cryptsetup $mode" "$(echo "${times[cs-$mode]}" | median)" "$(echo "${cpu[cs-$mode]}" | median)" "${times[cs-$mode]}"
done
[ -z "$B" ] || echo "(base = $B, the other rows $U${HOTZONE:+; --hotzone-size $HOTZONE})"
echo "(medians; ratio = write / reencrypt for the same size, wall and CPU (user+system) time: >= 0.8 is issue 16's target; $size MiB, $rounds rounds, load $(cut -d' ' -f1-3 /proc/loadavg))"
