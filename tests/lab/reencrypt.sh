# In-guest checks of LUKS2 reencryption between ucrypt and cryptsetup's own online
# reencryption (issue 16, items 1 and 5): sourced by blockdev.sh (`reencrypt=PATH` among its
# rounds), which provides UCRYPT, W, check, ok and bad. In the guest, cryptsetup 2.6.1 runs
# online (device-mapper stacks its reencryption targets over the active volume):
#   1. cryptsetup re-encrypts an active volume online and is killed (-9) mid-way; the stack
#      is torn down as after a crash; ucrypt resumes offline, and both ucrypt and dm-crypt
#      read the written pattern back;
#   2. ucrypt re-encrypts and stops mid-way (--debug-stop-after); cryptsetup resumes it
#      online through dm-crypt; dm-crypt and ucrypt read the pattern back;
#   3. ucrypt re-encrypts and is killed (-9) inside its pass; cryptsetup recovers the hotzone
#      and finishes online; the pattern reads back.

re_pattern() { # IMAGE -> 0 when dm-crypt (cryptsetup open) and ucrypt both read the pattern
  local img=$1 ok=0 loop
  loop=$(losetup -f --show "$img") || return 1
  if cryptsetup open -q -d "$W/re.pass" "$loop" rechk 2>"$W/re.err"; then
    dmsetup mknodes
    cmp -s -n "$RE_BYTES" /dev/mapper/rechk "$W/re.pat" || ok=1
    cryptsetup close rechk
  else
    echo "# cryptsetup open: $(cat "$W/re.err")"; ok=1
  fi
  losetup -d "$loop"
  "$UCRYPT" luksOpen --print-table --showkeys -d "$W/re.pass" "$img" > "$W/re.table" || return 1
  "$UCRYPT" read --table-file "$W/re.table" --length "$RE_BYTES" --output "$W/re.back" || return 1
  cmp -s "$W/re.back" "$W/re.pat" || ok=1
  return $ok
}

re_midway() { # IMAGE -> 0 when the header says a reencryption is in progress
  cryptsetup luksDump "$1" | grep -q "online-reencrypt"
}

re_fresh() { # IMAGE: a LUKS2 volume (cryptsetup luksFormat) with the pattern written by dm-crypt
  local img=$1 loop
  rm -f "$img"; truncate -s 80M "$img"
  cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --sector-size 4096 -d "$W/re.pass" "$img" || return 1
  loop=$(losetup -f --show "$img") || return 1
  cryptsetup open -q -d "$W/re.pass" "$loop" refill || { losetup -d "$loop"; return 1; }
  dmsetup mknodes
  dd if="$W/re.pat" of=/dev/mapper/refill bs=1M oflag=direct conv=fsync status=none
  cryptsetup close refill
  losetup -d "$loop"
}

re_teardown() { # removes every device-mapper device and loop device left by a killed run
  local d _
  # A reencryption stack is several devices, each holding the one below: repeat until all
  # are gone (`dmsetup ls` lists them by name, not from the top down).
  for _ in 1 2 3 4 5; do
    dmsetup ls 2>/dev/null | grep -q "^No devices" && break
    for d in $(dmsetup ls 2>/dev/null | awk '{print $1}'); do
      dmsetup remove --force "$d" 2>/dev/null
    done
  done
  losetup -D 2>/dev/null
}

reencrypt_round() {
  RE_BYTES=$((60 << 20))
  # The new keyslot's KDF kept cheap: the guest's emulated CPU is slow.
  RE_FAST="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
  printf 'lab reencryption passphrase' > "$W/re.pass"
  head -c "$RE_BYTES" /dev/urandom > "$W/re.pat"
  local img=$W/re.img loop pid

  # 1. cryptsetup online, killed mid-way; ucrypt resumes offline.
  if check "re 1: cryptsetup luksFormat + pattern through dm-crypt" re_fresh "$img"; then
    loop=$(losetup -f --show "$img")
    cryptsetup open -q -d "$W/re.pass" "$loop" reon
    # shellcheck disable=SC2086  # RE_FAST splits into options on purpose
    cryptsetup reencrypt -q -d "$W/re.pass" $RE_FAST --resilience journal --hotzone-size 1M \
      "$loop" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do re_midway "$img" && break; sleep 0.2; done
    sleep 2; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    re_teardown
    check "re 1: the killed pass's device stack is torn down" \
      sh -c "dmsetup ls | grep -q '^No devices'"
    check "re 1: cryptsetup's online pass was interrupted mid-way" re_midway "$img"
    check "re 1: ucrypt reencrypt --resume-only finishes it" \
      "$UCRYPT" reencrypt -q --resume-only -d "$W/re.pass" "$img"
    check "re 1: no reencryption left in the header" sh -c "! cryptsetup luksDump '$img' | grep -q online-reencrypt"
    check "re 1: dm-crypt and ucrypt read the pattern" re_pattern "$img"
  fi

  # 2. ucrypt stops mid-way; cryptsetup resumes online through dm-crypt.
  if check "re 2: cryptsetup luksFormat + pattern through dm-crypt" re_fresh "$img"; then
    check "re 2: ucrypt reencrypt stops after 24 MiB" \
      "$UCRYPT" reencrypt -q -d "$W/re.pass" $RE_FAST --hotzone-size 4M --debug-stop-after 24M "$img"
    check "re 2: the header says mid-way" re_midway "$img"
    loop=$(losetup -f --show "$img")
    cryptsetup open -q -d "$W/re.pass" "$loop" re2on && dmsetup mknodes
    check "re 2: cryptsetup reencrypt --resume-only --active-name (online) finishes it" \
      cryptsetup reencrypt -q --resume-only -d "$W/re.pass" --active-name re2on
    check "re 2: the active volume reads the pattern" \
      cmp -s -n "$RE_BYTES" /dev/mapper/re2on "$W/re.pat"
    cryptsetup close re2on; losetup -d "$loop"
    check "re 2: dm-crypt and ucrypt read the pattern after close" re_pattern "$img"
  fi

  # 3. ucrypt killed inside its pass; cryptsetup recovers and finishes online.
  if check "re 3: cryptsetup luksFormat + pattern through dm-crypt" re_fresh "$img"; then
    "$UCRYPT" reencrypt -q -d "$W/re.pass" $RE_FAST --resilience checksum --hotzone-size 1M \
      "$img" >/dev/null 2>&1 &
    pid=$!
    # Killed a second into its data pass (once the header says a reencryption runs).
    for _ in $(seq 100); do re_midway "$img" && break; sleep 0.2; done
    sleep 1; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    check "re 3: ucrypt's pass was interrupted mid-way" re_midway "$img"
    loop=$(losetup -f --show "$img")
    cryptsetup open -q -d "$W/re.pass" "$loop" re3on && dmsetup mknodes
    check "re 3: cryptsetup reencrypt --resume-only --active-name (online) finishes it" \
      cryptsetup reencrypt -q --resume-only -d "$W/re.pass" --active-name re3on
    cryptsetup close re3on; losetup -d "$loop"
    check "re 3: dm-crypt and ucrypt read the pattern" re_pattern "$img"
  fi
  re_teardown
  rm -f "$img" "$W"/re.*
}
