# In-guest checks of LUKS1 reencryption between ucrypt and cryptsetup 2.6.1's own legacy
# LUKS1 reencryption (issue 14, item 1): sourced by blockdev.sh (`luks1reenc=PATH` among its
# rounds), which provides UCRYPT, W, check, ok and bad. In the guest cryptsetup maps the old
# and new headers with dm-crypt and copies between them; ucrypt does the pass itself. Both
# keep their state in the working directory (LUKS-<UUID>.log/.org/.new), so each case runs
# in a directory of its own:
#   1. cryptsetup re-keys (new cipher) and is interrupted (SIGINT) mid-way; ucrypt resumes it
#      from the same directory and finishes; dm-crypt and ucrypt read the pattern back;
#   2. ucrypt re-keys and is interrupted (SIGINT) mid-way; cryptsetup resumes it and
#      finishes; dm-crypt and ucrypt read the pattern back;
#   3. ucrypt re-keys and is killed (-9) mid-way; ucrypt resumes (putting back the block it
#      was writing) and finishes; dm-crypt reads the pattern;
#   4. ucrypt decrypts (--decrypt): the device is the pattern from its first byte;
#   5. cryptsetup decrypts and is interrupted (SIGINT) past its first block (the header is
#      overwritten by then); ucrypt resumes with --decrypt --uuid and finishes;
#   6. ucrypt encrypts (--encrypt --type luks1 --reduce-device-size): dm-crypt reads the
#      pattern.

l1_pattern() { # IMAGE -> 0 when dm-crypt (cryptsetup open) and ucrypt both read the pattern
  local img=$1 ok=0 loop
  loop=$(losetup -f --show "$img") || return 1
  if cryptsetup open -q --type luks1 -d "$W/l1.pass" "$loop" l1chk 2>"$W/l1.err"; then
    dmsetup mknodes
    cmp -s -n "$L1_BYTES" /dev/mapper/l1chk "$W/l1.pat" || ok=1
    cryptsetup close l1chk
  else
    echo "# cryptsetup open: $(cat "$W/l1.err")"; ok=1
  fi
  losetup -d "$loop"
  "$UCRYPT" luksOpen --print-table --showkeys -d "$W/l1.pass" "$img" > "$W/l1.table" || return 1
  "$UCRYPT" read --table-file "$W/l1.table" --length "$L1_BYTES" --output "$W/l1.back" || return 1
  cmp -s "$W/l1.back" "$W/l1.pat" || ok=1
  return $ok
}

l1_fresh() { # DIR: DIR/img, a LUKS1 volume (cryptsetup luksFormat) with the pattern written by dm-crypt
  local dir=$1 loop
  rm -rf "$dir"; mkdir -p "$dir"
  truncate -s $((L1_BYTES + (2 << 20))) "$dir/img"
  cryptsetup luksFormat -q --type luks1 --pbkdf-force-iterations 1000 -d "$W/l1.pass" \
    "$dir/img" || return 1
  loop=$(losetup -f --show "$dir/img") || return 1
  cryptsetup open -q -d "$W/l1.pass" "$loop" l1fill || { losetup -d "$loop"; return 1; }
  dmsetup mknodes
  dd if="$W/l1.pat" of=/dev/mapper/l1fill bs=1M oflag=direct conv=fsync status=none
  cryptsetup close l1fill
  losetup -d "$loop"
}

l1_offset() { # DIR -> the log's offset (0 when none)
  sed -n 's/^offset = //p' "$1"/LUKS-*.log 2>/dev/null | head -1
}

l1_wait_past() { # PID DIR -> returns once the pass in DIR is past 4 MiB or PID has exited
  # No fixed deadline: under TCG on a loaded host the PBKDF alone can take tens of seconds,
  # and a signal sent before the pass starts leaves nothing to resume.
  while kill -0 "$1" 2>/dev/null; do
    n=$(l1_offset "$2"); [ "${n:-0}" -gt $((4 << 20)) ] && return 0; sleep 0.1
  done
}

l1_midway() { # DIR -> 0 when the header is marked and the log is there
  [ "$(head -c 6 "$1/img" | od -An -tx1 | tr -d ' ')" = 4c554b53dead ] && ls "$1"/LUKS-*.log >/dev/null 2>&1
}

l1_clean() { # DIR -> 0 when no state file is left and the header is usable LUKS1
  ! ls "$1"/LUKS-* >/dev/null 2>&1 && cryptsetup isLuks --type luks1 "$1/img"
}

luks1_round() {
  L1_BYTES=$((32 << 20))
  printf 'lab luks1 passphrase' > "$W/l1.pass"
  head -c "$L1_BYTES" /dev/urandom > "$W/l1.pat"
  local d pid n

  # 1. cryptsetup interrupted mid-way; ucrypt finishes.
  d=$W/l1a
  if check "l1 1: LUKS1 luksFormat + pattern through dm-crypt" l1_fresh "$d"; then
    (cd "$d" && exec cryptsetup reencrypt -q -d "$W/l1.pass" --pbkdf-force-iterations 1000 \
      -c aes-cbc-essiv:sha256 -s 256 --block-size 1 --write-log img >/dev/null 2>&1) &
    pid=$!
    l1_wait_past "$pid" "$d"
    kill -INT "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "# l1 1: cryptsetup stopped at offset $(l1_offset "$d") of $L1_BYTES"
    check "l1 1: cryptsetup's pass was interrupted mid-way" l1_midway "$d"
    check "l1 1: ucrypt reencrypt resumes it and finishes" \
      sh -c "cd '$d' && '$UCRYPT' reencrypt -q -d '$W/l1.pass' img"
    check "l1 1: no state files left, the header is LUKS1 again" l1_clean "$d"
    check "l1 1: the new cipher is cryptsetup's (cbc-essiv:sha256)" \
      sh -c "cryptsetup luksDump '$d/img' | grep -q 'cbc-essiv:sha256'"
    check "l1 1: dm-crypt and ucrypt read the pattern" l1_pattern "$d/img"
  fi

  # 2. ucrypt interrupted mid-way; cryptsetup finishes.
  d=$W/l1b
  if check "l1 2: LUKS1 luksFormat + pattern through dm-crypt" l1_fresh "$d"; then
    (cd "$d" && exec "$UCRYPT" reencrypt -q -d "$W/l1.pass" --pbkdf-force-iterations 1000 \
      --block-size 1 img >/dev/null 2>&1) &
    pid=$!
    l1_wait_past "$pid" "$d"
    kill -INT "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "# l1 2: ucrypt stopped at offset $(l1_offset "$d") of $L1_BYTES"
    check "l1 2: ucrypt's pass was interrupted mid-way" l1_midway "$d"
    check "l1 2: cryptsetup reencrypt resumes it and finishes" \
      sh -c "cd '$d' && cryptsetup reencrypt -q -d '$W/l1.pass' img"
    check "l1 2: no state files left (but ucrypt's journal), the header is LUKS1 again" \
      sh -c "rm -f '$d'/LUKS-*.ucrypt-journal; ! ls '$d'/LUKS-* >/dev/null 2>&1 && cryptsetup isLuks --type luks1 '$d/img'"
    check "l1 2: dm-crypt and ucrypt read the pattern" l1_pattern "$d/img"
  fi

  # 3. ucrypt killed (-9) mid-way; ucrypt resumes; dm-crypt reads it.
  d=$W/l1c
  if check "l1 3: LUKS1 luksFormat + pattern through dm-crypt" l1_fresh "$d"; then
    (cd "$d" && exec "$UCRYPT" reencrypt -q -d "$W/l1.pass" --pbkdf-force-iterations 1000 \
      --block-size 1 img >/dev/null 2>&1) &
    pid=$!
    l1_wait_past "$pid" "$d"
    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    check "l1 3: ucrypt's pass was killed mid-way" l1_midway "$d"
    check "l1 3: ucrypt reencrypt resumes it and finishes" \
      sh -c "cd '$d' && '$UCRYPT' reencrypt -q -d '$W/l1.pass' img"
    check "l1 3: no state files left, the header is LUKS1 again" l1_clean "$d"
    check "l1 3: dm-crypt and ucrypt read the pattern" l1_pattern "$d/img"
  fi

  # 4. ucrypt decrypts; the device is the plaintext (what dm-crypt wrote) from byte 0.
  d=$W/l1d
  if check "l1 4: LUKS1 luksFormat + pattern through dm-crypt" l1_fresh "$d"; then
    check "l1 4: ucrypt reencrypt --decrypt" \
      sh -c "cd '$d' && '$UCRYPT' reencrypt -q --decrypt -d '$W/l1.pass' img"
    check "l1 4: no state files left, no LUKS header" \
      sh -c "! ls '$d'/LUKS-* >/dev/null 2>&1 && ! cryptsetup isLuks '$d/img'"
    check "l1 4: the device is the pattern" cmp -s -n "$L1_BYTES" "$d/img" "$W/l1.pat"
  fi

  # 5. cryptsetup decrypts and is interrupted (SIGINT) past its first block (its header
  #    overwritten by plaintext); ucrypt resumes with --decrypt --uuid and finishes.
  d=$W/l1e
  if check "l1 5: LUKS1 luksFormat + pattern through dm-crypt" l1_fresh "$d"; then
    local uuid
    uuid=$(cryptsetup luksUUID "$d/img")
    (cd "$d" && exec cryptsetup reencrypt -q --decrypt -d "$W/l1.pass" --block-size 1 \
      --write-log img >/dev/null 2>&1) &
    pid=$!
    l1_wait_past "$pid" "$d"
    kill -INT "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "# l1 5: cryptsetup stopped at offset $(l1_offset "$d") of $L1_BYTES"
    check "l1 5: cryptsetup's decryption was interrupted mid-way (header gone, log there)" \
      sh -c "! cryptsetup isLuks '$d/img' && grep -q 'mode = 2' '$d'/LUKS-*.log"
    check "l1 5: ucrypt reencrypt --decrypt --uuid resumes it and finishes" \
      sh -c "cd '$d' && '$UCRYPT' reencrypt -q --decrypt --uuid '$uuid' -d '$W/l1.pass' img"
    check "l1 5: no state files left" sh -c "! ls '$d'/LUKS-* >/dev/null 2>&1"
    check "l1 5: the device is the pattern" cmp -s -n "$L1_BYTES" "$d/img" "$W/l1.pat"
  fi

  # 6. ucrypt encrypts a plaintext device to LUKS1 with --reduce-device-size (backward, the
  #    data moved up by 2 MiB, the header at the head); dm-crypt opens it and reads the
  #    pattern (the device's first 32 MiB, written before as plaintext).
  d=$W/l1f
  rm -rf "$d"; mkdir -p "$d"
  cp "$W/l1.pat" "$d/dev"; truncate -s $((L1_BYTES + (2 << 20))) "$d/dev"
  check "l1 6: ucrypt reencrypt --encrypt --type luks1 --reduce-device-size 2M" \
    sh -c "cd '$d' && '$UCRYPT' reencrypt -q --encrypt --type luks1 --reduce-device-size 2M \
      -d '$W/l1.pass' --pbkdf-force-iterations 1000 dev"
  check "l1 6: no state files left, the device is LUKS1" \
    sh -c "! ls '$d'/LUKS-* >/dev/null 2>&1 && cryptsetup isLuks --type luks1 '$d/dev'"
  check "l1 6: dm-crypt and ucrypt read the pattern" l1_pattern "$d/dev"
  rm -rf "$W"/l1a "$W"/l1b "$W"/l1c "$W"/l1d "$W"/l1e "$W"/l1f "$W"/l1.*
}
