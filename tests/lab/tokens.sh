#!/bin/bash
# LUKS2 tokens bound to a TPM 2.0 (swtpm, LAB_TPM=1), enrolled by the tools users have and
# opened by ucrypt. Runs as root in the guest of tests/lab/run.sh, started by
# crates/cli/tests/lab_tokens.rs:
#   tokens.sh UCRYPT
# On one ucrypt-formatted LUKS2 image: `systemd-cryptenroll --tpm2-device=auto` (a
# systemd-tpm2 token, through libcryptsetup's plugin) and `clevis luks bind ... tpm2 '{}'`
# (a clevis token, through clevis decrypt's tpm2 pin); each token alone gives the volume key
# cryptsetup dumps with the passphrase, and a named instance opens with --token-only.
# Prints one "ok - ..." line per check and "N passed, M failed" at the end.
set -u
UCRYPT=$1
PASS=0 FAIL=0
ok() { echo "ok - $*"; PASS=$((PASS + 1)); }
bad() { echo "not ok - $*"; FAIL=$((FAIL + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
W=$(mktemp -d /tmp/ucrypt-tokens.XXXXXX)
export UCRYPT_RUNTIME_DIR=$W/run
P='lab passphrase'

check "the guest has a TPM 2.0" test "$(cat /sys/class/tpm/tpm0/tpm_version_major 2>/dev/null)" = 2
truncate -s 32M "$W/v.img"
printf '%s' "$P" > "$W/pass"
"$UCRYPT" luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -d "$W/pass" "$W/v.img" ||
  { echo "luksFormat failed"; exit 1; }
# The volume key as cryptsetup dumps it with the passphrase.
WANT=$(cryptsetup luksDump --dump-volume-key -q --key-file "$W/pass" "$W/v.img" |
  sed -n '/MK dump:/,$p' | sed 's/MK dump://' | tr -d ' \t\n')
key_of() { "$UCRYPT" luksOpen --print-table --showkeys "$@" "$W/v.img" | awk '{print $5}'; }

# systemd-tpm2.
check "systemd-cryptenroll --tpm2-device=auto enrols" \
  env PASSWORD="$P" systemd-cryptenroll --tpm2-device=auto "$W/v.img"
check "cryptsetup opens it by the systemd-tpm2 token" \
  cryptsetup open --test-passphrase --token-only --token-type systemd-tpm2 "$W/v.img"
out=$("$UCRYPT" open --test-passphrase --token-only --token-type systemd-tpm2 -v "$W/v.img" 2>&1)
check "ucrypt opens it by the systemd-tpm2 token ($out)" grep -q "(systemd-tpm2) unlocked" <<<"$out"
check "the systemd-tpm2 token gives cryptsetup's volume key" \
  test "$(key_of --token-only --token-type systemd-tpm2)" = "$WANT"

# clevis tpm2 pin.
check "clevis luks bind ... tpm2 '{}' binds" \
  bash -c "printf '%s' '$P' | clevis luks bind -y -k - -d '$W/v.img' tpm2 '{}'"
check "the clevis token gives cryptsetup's volume key" \
  test "$(key_of --token-only --token-type clevis)" = "$WANT"
out=$("$UCRYPT" open --test-passphrase --token-only -v "$W/v.img" 2>&1)
check "--token-only without a type: the first token unlocks ($out)" grep -q "unlocked the volume key" <<<"$out"

# A named instance opened by a token alone, then closed.
check "open NAME --token-only --token-type clevis serves it" \
  "$UCRYPT" open "$W/v.img" tok --device none --token-only --token-type clevis
check "status says it is active" "$UCRYPT" status tok
check "close" "$UCRYPT" close tok

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
