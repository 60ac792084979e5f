#!/bin/sh
# The CLI's observable behaviour, recorded for comparison across a refactor: runs a fixed
# set of scenarios with one `ucrypt` binary and writes, per scenario, stdout, stderr and
# the exit code to OUTDIR (paths, pids, UUIDs, salts and timings normalized). Run it with
# the binary before and after a change and diff the two directories:
#
#   scripts/cli-compare.sh target/debug/ucrypt /tmp/before
#   ... change, rebuild ...
#   scripts/cli-compare.sh target/debug/ucrypt /tmp/after
#   diff -r /tmp/before /tmp/after
#
# Needs only the binary (no cryptsetup, no kernel module): named instances use
# `--device none` (the NBD socket). `--version` is left out (it names the commit).
set -u

[ $# -eq 2 ] || { echo "usage: $0 UCRYPT_BINARY OUTDIR" >&2; exit 1; }
BIN=$(realpath "$1") || exit 1
OUT=$2
[ -x "$BIN" ] || { echo "$0: $BIN is not executable" >&2; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT" || exit 1
OUT=$(realpath "$OUT")
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/cli-compare.XXXXXX) || exit 1
export UCRYPT_RUNTIME_DIR="$WORK/run"
trap 'for p in "$UCRYPT_RUNTIME_DIR"/*/pid; do [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done; rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
# Called as `ucrypt` whatever the file's name (clap's usage lines show argv[0]).
mkdir bin && ln -s "$BIN" bin/ucrypt && BIN=$WORK/bin/ucrypt

# Normalizes what differs from run to run: the scratch directory, pids, UUIDs, long hex
# strings (salts, digests, keys; base64 ones in LUKS2 JSON), PBKDF timings and
# iterations, and speeds.
norm() {
    sed -e "s|$WORK|WORK|g" \
        -e 's/[0-9a-f]\{8\}-[0-9a-f]\{4\}-[0-9a-f]\{4\}-[0-9a-f]\{4\}-[0-9a-f]\{12\}/UUID/g' \
        -e 's/\([0-9a-f]\{2\}[ :]\)\{7,\}[0-9a-f]\{2\}/HEX/g' \
        -e 's/[0-9a-fA-F]\{32,\}/HEX/g' \
        -e 's/"\(salt\|digest\)":"[^"]*"/"\1":"B64"/g' \
        -e 's/"pid": *[0-9]*/"pid": PID/g' -e 's/pid [0-9]\+/pid PID/g' \
        -e 's/^\([a-z0-9]\+\) \+[0-9]\+ /\1 PID /' \
        -e 's/"started": *[0-9]*/"started": TIME/' \
        -e 's/ *[0-9.]\+ \(MiB\|GiB\|KiB\)\/s/ RATE/g' \
        -e 's/Iterations: *[0-9]\+/Iterations: N/' \
        -e 's/time [0-9]\+m[0-9]\+s/time T/' \
        -e 's/[0-9]\+ ms/N ms/g'
}

# run NAME [STDIN_FILE] -- ARGS...: records one scenario.
run() {
    name=$1; shift
    input=/dev/null
    if [ "$1" != "--" ]; then input=$1; shift; fi
    shift
    "$BIN" "$@" <"$input" >"$WORK/o" 2>"$WORK/e"
    echo $? >"$OUT/$name.rc"
    norm <"$WORK/o" >"$OUT/$name.out"
    norm <"$WORK/e" >"$OUT/$name.err"
}

# Help of the command and of every subcommand it lists.
run help -- --help
"$BIN" --help | sed -n '/^Usage:/,/^Options:/p' | grep -E '^  [a-zA-Z]' | awk '{print $1}' | while read -r c; do
    [ "$c" = help ] && continue
    run "help-$c" -- "$c" --help
done
run no-args --
run unknown-command -- frobnicate
run bad-flag -- open --no-such-flag

# Tables: check, print, write and read through a table (offline).
truncate -s 4M img
KEY=$(printf '%064d' 0)$(printf '%064d' 1)
T="0 8192 crypt aes-xts-plain64 $KEY 0 $WORK/img 0"
printf '%s\n' "$T" >table
run table -- table --table-file table
run table-showkeys -- table --table-file table --showkeys
run table-bad -- table --table "0 8192 crypt nosuch-cipher $KEY 0 img 0"
run table-stdin table -- table --table-file -
run table-missing -- table --table-file nosuchfile
head -c 65536 /dev/zero | tr '\0' 'a' >plain
run write plain -- write --table-file table --offset 4096
run read -- read --table-file table --offset 4096 --length 65536
run read-past-end -- read --table-file table --offset 4194304 --length 512
run read-missing-device -- read --table "0 8192 crypt aes-xts-plain64 $KEY 0 $WORK/nosuch 0"

# LUKS: format, dump, add a key, wrong passphrase, test-passphrase.
truncate -s 32M luks
printf pw >pass
printf pw2 >pass2
printf nope >bad
run luksFormat -- luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --uuid 11111111-2222-3333-4444-555555555555 --key-file pass luks
run luksDump -- luksDump luks
run isLuks -- isLuks -v luks
run isLuks-not -- isLuks -v img
run luksUUID -- luksUUID luks
run luksAddKey -- luksAddKey -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --key-file pass luks pass2
run luksDump-2 -- luksDump luks
run open-wrong-pass -- open luks --test-passphrase --key-file bad
run open-test-pass -- open luks --test-passphrase --key-file pass2
run luksOpen-wrong -- luksOpen luks --print-table --key-file bad
run luksKillSlot-bad -- luksKillSlot -q luks 9 --key-file pass
run luksRemoveKey -- luksRemoveKey -q luks pass2
run luksDump-3 -- luksDump luks
run format-missing -- luksFormat -q --key-file pass nosuchdir/x

# A named instance: open in the background on the NBD socket, status, ls, refusals, close.
run open-named -- open luks vol --device none --key-file pass
run status -- status vol
run status-json -- status vol --json
run ls -- ls
run open-again -- open luks vol2 --device none --key-file pass
run open-same-name -- open luks vol --device none --key-file pass
run luksAddKey-busy -- luksAddKey -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --key-file pass luks pass2
run reencrypt-busy -- reencrypt -q luks --key-file pass
run suspend -- luksSuspend vol
run close-suspended -- close vol
run resume-wrong -- luksResume vol --key-file bad
run resume -- luksResume vol --key-file pass
run close -- close vol
run status-gone -- status vol
run close-gone -- close vol

# Reencryption refusals (nothing written).
run reencrypt-resume-nothing -- reencrypt -q --resume-only luks --key-file pass
run reencrypt-luks1-type -- reencrypt -q --type luks1 luks --key-file pass
run reencrypt-wrong-pass -- reencrypt -q luks --key-file bad
run reencrypt-encrypt-decrypt -- reencrypt -q --encrypt --decrypt luks --key-file pass
run reencrypt-not-luks -- reencrypt -q img --key-file pass

# Reencryption runs (small images, fast PBKDF): re-key, keep-key, new cipher, interrupted
# and resumed, init-only, encrypt and decrypt with a detached header, encrypt with a data
# shift, LUKS1 re-key/encrypt/decrypt, and refusals; each image is read back through
# luksOpen --print-table's table where a run finished.
F="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
rr() { # rr NAME IMAGE [ARGS...]: a run and luksDump after it
    n=$1; i=$2; shift 2
    run "re-$n" -- reencrypt -q "$@"
    run "re-$n-dump" -- luksDump "$i"
}
truncate -s 20M r2
run re-fmt -- luksFormat -q --type luks2 $F --uuid 11111111-2222-3333-4444-666666666666 \
    --key-file pass r2
rr rekey r2 $F --key-file pass r2
rr cipher r2 $F --key-file pass --cipher aes-cbc-essiv:sha256 --key-size 256 r2
rr keepkey-same r2 --key-file pass --keep-key r2
rr keepkey r2 --key-file pass --keep-key --sector-size 512 --cipher aes-xts-plain64 r2
rr stop r2 $F --key-file pass --hotzone-size 1M --debug-stop-after 2M r2
rr init-again r2 --key-file pass --init-only r2
rr resume r2 --key-file pass --resume-only r2
rr init-only r2 $F --key-file pass --init-only --resilience journal r2
rr resume-2 r2 --key-file pass --resume-only --resilience none r2
rr resume-3 r2 --key-file pass --resume-only r2
# Online: the instance re-encrypts while it serves.
run re-online-open -- open r2 rv --device none --key-file pass
rr online-encrypt r2 --key-file pass --active-name rv --encrypt
rr online-size r2 --key-file pass --active-name rv --device-size 1M
rr online-other r2 --key-file pass --active-name rv e2
rr online r2 $F --key-file pass --active-name rv --hotzone-size 1M
rr online-gone r2 --key-file pass --active-name nosuch
run re-online-close -- close rv
run re-two-slots-add -- luksAddKey -q $F --key-file pass r2 pass2
rr two-slots r2 $F --key-file pass r2
rr slot1 r2 $F --key-file pass2 --key-slot 1 r2
rr vkfile r2 $F --key-file pass2 --volume-key-file plain --key-size 256 r2
rr devsize r2 $F --key-file pass2 --device-size 1000 r2
rr devsize-zero r2 $F --key-file pass2 --device-size 0 r2
rr reduce-rekey r2 $F --key-file pass2 --reduce-device-size 1M r2
rr datashift r2 $F --key-file pass2 --resilience datashift r2
rr meta r2 $F --key-file pass2 --luks2-metadata-size 64K r2
rr uuid r2 $F --key-file pass2 --uuid 11111111-2222-3333-4444-777777777777 r2
rr luks1-blocksize r2 $F --key-file pass2 --block-size 2 r2
rr type-x r2 $F --key-file pass2 --type foo r2
rr offset r2 $F --key-file pass2 --offset 8 --hotzone-size 4M r2
rr keep-key-decrypt r2 --key-file pass2 --keep-key --decrypt --header hx r2
rr decrypt-no-header r2 --key-file pass2 --decrypt r2
rr remote r2 --key-file pass2 nbd://127.0.0.1:1/x
# Encryption with a detached header, then decryption of it.
truncate -s 8M e2
printf 'plaintext at the head' | dd of=e2 conv=notrunc 2>/dev/null
rr enc-no-header e2 $F --key-file pass --encrypt e2
rr enc e2-h $F --key-file pass --encrypt --header e2-h --uuid 11111111-2222-3333-4444-888888888888 \
    --label L --subsystem S --cipher aes-xts-plain64 e2
rr enc-again e2-h $F --key-file pass --encrypt --header e2-h e2
run re-enc-read -- luksOpen e2 --header e2-h --print-table --key-file pass
rr dec-cipher e2-h --key-file pass --decrypt --header e2-h --cipher aes-cbc-essiv:sha256 e2
rr dec-none e2-h --key-file pass --decrypt --header e2-h --resilience none e2
rr dec-stop e2-h --key-file pass --decrypt --header e2-h --hotzone-size 1M --debug-stop-after 1M e2
rr dec-encrypt e2-h --key-file pass --encrypt --header e2-h e2
rr dec e2-h --key-file pass --decrypt --header e2-h e2
run re-dec-head -- read --table "0 1 crypt cipher_null-ecb - 0 $WORK/e2 0" --offset 0 --length 21
# Encryption with a data shift (header at the head), then decryption exporting it.
truncate -s 8M s2
printf 'shifted plaintext' | dd of=s2 conv=notrunc 2>/dev/null
rr shift-big s2 $F --key-file pass --encrypt --reduce-device-size 2G s2
rr shift-odd s2 $F --key-file pass --encrypt --reduce-device-size 1000 s2
rr shift-res s2 $F --key-file pass --encrypt --reduce-device-size 4M --resilience journal s2
rr shift-off s2 $F --key-file pass --encrypt --reduce-device-size 4M --offset 8192 s2
rr shift-hdr s2 $F --key-file pass --encrypt --reduce-device-size 4M --header s2-h s2
rr shift s2 $F --key-file pass --encrypt --reduce-device-size 4M --offset 2048 \
    --luks2-keyslots-size 4M --hotzone-size 1M s2
run re-shift-table -- luksOpen s2 --print-table --key-file pass
rr export-none s2 --key-file pass --decrypt --header s2-x --resilience none s2
rr export-size s2 --key-file pass --decrypt --header s2-x --device-size 1M s2
rr export s2 --key-file pass --decrypt --header s2-x s2
run re-export-head -- read --table "0 1 crypt cipher_null-ecb - 0 $WORK/s2 0" --offset 0 --length 17
# LUKS1: re-key, keep-key, interrupted and resumed, decryption, encryption.
mkdir l1 && cd l1 || exit 1
truncate -s 8M r1
run re-l1-fmt -- luksFormat -q --type luks1 $F --key-file ../pass r1
rr l1-rekey r1 $F --key-file ../pass --resilience journal --sector-size 4096 r1
rr l1-type2 r1 $F --key-file ../pass --type luks2 r1
rr l1-active r1 $F --key-file ../pass --type luks1 --active-name x r1
rr l1-block r1 $F --key-file ../pass --block-size 0 r1
rr l1-slot r1 $F --key-file ../pass --key-slot 9 r1
rr l1-reduce r1 $F --key-file ../pass --reduce-device-size 1M r1
rr l1-keepkey r1 $F --key-file ../pass --keep-key --hash sha512 r1
rr l1-stop r1 $F --key-file ../pass --block-size 1 --debug-stop-after 2M r1
ls | norm >"$OUT/re-l1-files.out"
rr l1-resume r1 --key-file ../pass r1
rr l1-uuid r1 --key-file ../pass --decrypt --uuid 11111111-2222-3333-4444-999999999999 r1
rr l1-dec r1 --key-file ../pass --decrypt r1
rr l1-enc-noheader r1 $F --key-file ../pass --encrypt --type luks1 r1
rr l1-enc r1 $F --key-file ../pass --encrypt --type luks1 --reduce-device-size 2M r1
run re-l1-table -- luksOpen r1 --print-table --key-file ../pass
cd .. || exit 1

# The foreground open: where it serves, what it refuses before unlocking, --run's
# environment and status, --raw, a header opened in the foreground; then header commands
# on an NBD URI (the image served raw by a foreground open; staged, written back).
L2="0 2048 crypt aes-xts-plain64 $KEY 0 $WORK/img 0
2048 2048 crypt aes-xts-plain64 $KEY 0 $WORK/img 2048"
printf '%s\n' "$L2" >table2
printf 'alice:0123456789abcdef0123456789abcdef\n' >psk
run fg-run -- open --table-file table --socket "$WORK/fg.sock" --run 'echo "$uri|$nbd|$unixsocket|$exportname|${port:-none}"; exit 3'
run fg-run-signal -- open --table-file table --socket "$WORK/fg.sock" --run 'kill -TERM $$'
run fg-pid -- open --table-file table --socket "$WORK/fg.sock" --pid-file "$WORK/fg.pid" --run "test -s '$WORK/fg.pid' && echo pid written"
run fg-private -- open --table-file table --run 'case "$unixsocket" in */nbd.sock) test -S "$unixsocket" && echo private;; esac'
run fg-listen-clear -- open --table-file table --listen 0
run fg-listen-clear-on -- open --table-file table --listen 127.0.0.1:0 --tls on --tls-psk psk
run fg-listen-tls -- open --table-file table --listen 0 --tls require --tls-psk psk --run 'echo "${uri%%:*}"'
run fg-tls-malformed -- open --table-file table --tls require --tls-psk pass
run fg-listen-allowed -- open --table-file table --listen 0 --allow-cleartext-tcp --run 'echo "${port:+port}|$exportname"'
run fg-listen-bad -- open --table-file table --listen nosuchhost.invalid:1
run fg-tls-off-creds -- open --table-file table --tls-psk pass
run fg-tls-no-creds -- open --table-file table --tls require
run fg-tls-bad-psk -- open --table-file table --tls require --tls-psk nosuchfile
run fg-socket-group -- open --table-file table --socket "$WORK/fg.sock" --socket-group nosuchgroup
run fg-socket-gid -- open --table-file table --socket "$WORK/fg.sock" --socket-group 0 --run 'echo served'
run fg-raw -- open --table-file table --raw --socket "$WORK/fg.sock" --run 'echo raw'
run fg-raw-two -- open --table-file table2 --raw --run 'echo never'
run fg-raw-missing -- open --table "0 8192 crypt aes-xts-plain64 $KEY 0 $WORK/nosuch 0" --raw --run 'echo never'
run fg-table-two -- open --table-file table2 --run 'echo two'
run fg-both -- open --table-file table luks --run 'echo never'
run fg-none -- open --run 'echo never'
run fg-large -- open --table "0 8192 crypt aes-xts-plain64 $KEY 0 $WORK/img 0 1 sector_size:8192" --large-sectors --run 'echo large'
run fg-header -- open luks --key-file pass --socket "$WORK/fg.sock" --run 'echo "$uri"'
run fg-header-wrong -- open luks --key-file bad --run 'echo never'
run fg-header-test -- open luks --key-file pass --test-passphrase --socket "$WORK/fg.sock"
run fg-header-missing -- open nosuch --key-file pass --run 'echo never'
U="nbd+unix:///?socket=$WORK/rh.sock"
cp luks rh
run rh-serve -- open --table "0 65536 crypt aes-xts-plain64 $KEY 0 $WORK/rh 0" --raw --socket "$WORK/rh.sock" --run "
    '$BIN' isLuks -v '$U'; echo rc=\$?
    '$BIN' luksUUID '$U'; echo rc=\$?
    '$BIN' config --label remote '$U'; echo rc=\$?
    '$BIN' luksDump '$U' | grep -E 'Label|Device'; echo rc=\$?
    '$BIN' luksAddKey -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pass '$U' pass2; echo rc=\$?
    '$BIN' open '$U' --test-passphrase --key-file pass2; echo rc=\$?
    '$BIN' luksHeaderBackup '$U' --header-backup-file '$WORK/rh.bak'; echo rc=\$?"
run rh-label -- luksDump rh
run rh-gone -- luksDump "nbd+unix:///?socket=$WORK/nosuch.sock"
run rh-ram -- luksDump ram:1M
run rh-isluks-ram -- isLuks -v ram:1M

# Opening refusals.
run open-plain-stdin -- open img p --type plain --device none
run close-plain -- close p
run open-missing -- open nosuch vol --device none --key-file pass
run open-bad-device-kind -- open luks vol --device nosuch --key-file pass

# The unlock policy: key files with offset and size, standard input, keyslots, tokens,
# --test-passphrase, --volume-key-file, refusals before anything is asked.
printf 'XXpwYY' >passoff
printf 'pw\n' >passline
run unlock-keyfile-offset -- open luks --test-passphrase --key-file passoff --keyfile-offset 2 --keyfile-size 2
run unlock-keyfile-short -- open luks --test-passphrase --key-file passoff --keyfile-offset 2 --keyfile-size 100
run unlock-keyfile-stdin pass -- open luks --test-passphrase --key-file - --keyfile-size 2
run unlock-piped-line passline -- open luks --test-passphrase --tries 3
run unlock-piped-wrong bad -- open luks --test-passphrase --tries 3
run unlock-keyslot-wrong -- luksOpen luks --print-table --key-file pass --key-slot 1
run unlock-keyslot-right -- luksOpen luks --print-table --key-file pass --key-slot 0 vol
run unlock-luksOpen-test-table -- luksOpen luks --test-passphrase --print-table --key-file pass
run unlock-luksOpen-test-plain -- luksOpen img --type plain --test-passphrase --key-file pass
run unlock-token-only -- open luks --test-passphrase --token-only
run unlock-token-only-plain -- open img --type plain --token-only --key-file pass --test-passphrase
run unlock-unbound-plain -- open img --type plain --test-passphrase --unbound --key-file pass
run unlock-offset-luks -- open luks --test-passphrase --offset 8 --key-file pass
run unlock-no-signature -- open img --test-passphrase --key-file pass
run unlock-loopaes-no-keyfile -- open img --type loopaes --device none p2
run unlock-link-bad -- open luks --test-passphrase --key-file pass --link-vk-to-keyring nonsense
run unlock-serialize -- open luks --test-passphrase --key-file pass --serialize-memory-hard-pbkdf
run unlock-vk-dump -- luksDump -q luks --dump-volume-key --volume-key-file vk --key-file pass
run unlock-vk-file -- open luks --test-passphrase --volume-key-file vk
run unlock-vk-file-wrong -- open luks --test-passphrase --volume-key-file pass
run unlock-plain-table -- luksOpen img --type plain --print-table --key-file pass --cipher aes-xts-plain64 --key-size 256
head -c 40 /dev/zero | tr '\0' k >plainkey
run unlock-plain-table-raw -- luksOpen img --type plain --print-table --key-file plainkey --keyfile-offset 8 --cipher aes-xts-plain64 --key-size 256
run unlock-plain-table-hashed pass -- luksOpen img --type plain --print-table --key-file - --hash sha256
# Keyslot commands: which keyslot, what is checked first, what is refused, the last keyslot.
KS="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
truncate -s 32M ks
run ks-fmt -- luksFormat -q --type luks2 $KS --uuid 11111111-2222-3333-4444-777777777777 --key-file pass ks
run ks-add-wrong -- luksAddKey -q $KS --key-file bad ks pass2
run ks-add-v -- luksAddKey -v $KS --key-file pass ks pass2
run ks-add-slot-warn pass -- luksAddKey -v $KS --key-slot 5 ks pass2
run ks-add-out-of-range -- luksAddKey -q $KS --new-key-slot 40 --key-file pass ks pass2
run ks-vk-dump -- luksDump -q ks --dump-volume-key --volume-key-file vkks --key-file pass
run ks-add-vk -- luksAddKey -q -v $KS --volume-key-file vkks ks pass2
run ks-add-vk-wrong -- luksAddKey -q -v $KS --volume-key-file vk ks pass2
run ks-add-unbound -- luksAddKey -q -v $KS --unbound -s 256 ks pass2
run ks-change -- luksChangeKey -v $KS --key-file pass2 ks pass
run ks-change-wrong -- luksChangeKey -q $KS --key-file bad ks pass
run ks-convert -- luksConvertKey -v --pbkdf pbkdf2 --pbkdf-force-iterations 1001 -S 0 --key-file pass ks
run ks-convert-inactive -- luksConvertKey -q -S 9 --key-file pass ks
run ks-dump -- luksDump ks
run ks-dump-json -- luksDump ks --dump-json-metadata
run ks-dump-vk -- luksDump -q ks --dump-volume-key --key-file pass
run ks-dump-vk-unconfirmed -- luksDump ks --dump-volume-key --key-file pass
run ks-dump-vk-wrong -- luksDump -q ks --dump-volume-key --key-file bad
run ks-dump-vkfile-alone -- luksDump ks --volume-key-file vk-alone
run ks-dump-unbound -- luksDump -q ks --unbound -S 3 --key-file pass2
run ks-dump-unbound-file -- luksDump -q ks --unbound -S 3 --key-file pass2 --volume-key-file ubk
run ks-dump-unbound-exists -- luksDump -q ks --unbound -S 3 --key-file pass2 --volume-key-file ubk
run ks-dump-not-unbound -- luksDump -q ks --unbound -S 0 --key-file pass
truncate -s 32M ks1
run ks1-fmt -- luksFormat -q --type luks1 $KS --uuid 11111111-2222-3333-4444-888888888888 --key-file pass ks1
run ks1-keyslot-cipher -- luksAddKey -q $KS --keyslot-cipher aes-xts-plain64 --keyslot-key-size 512 --key-file pass ks1 pass2
truncate -s 32M kk
run kk-fmt -- luksFormat -q --type luks2 $KS --uuid 11111111-2222-3333-4444-999999999999 --key-file pass kk
run kk-add -- luksAddKey -q $KS --key-file pass kk pass2
run kk-add-2 -- luksAddKey -q $KS --key-file pass kk pass2
run kk-kill-itself -- luksKillSlot kk 1 --key-file pass2
run kk-kill-wrong -- luksKillSlot kk 1 --key-file bad
run kk-kill-inactive -- luksKillSlot kk 3 --key-file pass
run kk-kill-invalid -- luksKillSlot kk 99 --key-file pass
run kk-kill -- luksKillSlot -v kk 1 --key-file pass
run kk-kill-batch -- luksKillSlot -q -v kk 2
run kk-kill-last -- luksKillSlot kk 0
run kk-remove-last -- luksRemoveKey kk pass
run kk-remove-wrong -- luksRemoveKey -q -v kk bad
run kk-remove -- luksRemoveKey -q -v kk pass
run kk-dump -- luksDump kk
# Header-wide actions and tokens: what each refuses, asks and writes.
truncate -s 32M hh
run hh-fmt -- luksFormat -q --type luks2 $KS --uuid 11111111-2222-3333-4444-aaaaaaaaaaaa --key-file pass hh
run hh-config-nothing -- config hh
run hh-config-priority -- config hh --label data --priority often -S 0
run hh-config -- config hh --label data --subsystem sys --priority prefer -S 0
run hh-token-add-nodesc -- token add hh
run hh-token-export-noid -- token export hh
run hh-token-unbound-import -- token import hh --unbound
run hh-token-add -- token add -v hh --key-description ucrypt:test -S 0
run hh-token-add-taken -- token add hh --key-description x --token-id 0
run hh-token-add-inactive -- token add hh --key-description x -S 7
run hh-token-export -- token export hh --token-id 0
run hh-token-export-file -- token export hh --token-id 0 --json-file tok.json
run hh-token-unassign -- token unassign -v hh --token-id 0 -S 0
run hh-token-unassign-again -- token unassign hh --token-id 0 -S 0
run hh-token-import-inactive -- token import hh -S 7 --json-file tok.json
run hh-token-import tok.json -- token import -v hh --token-id 3 -S 0
run hh-token-remove -- token remove -v hh --token-id 3
run hh-token-remove-again -- token remove hh --token-id 3
run hh-token-export-none -- token export hh --token-id 3
run hh-dump-tokens -- luksDump hh
run hh-backup -- luksHeaderBackup hh --header-backup-file hh.bak
run hh-backup-exists -- luksHeaderBackup hh --header-backup-file hh.bak
run hh-restore-unconfirmed -- luksHeaderRestore hh --header-backup-file hh.bak
run hh-convert-bad -- convert hh --type luks3
run hh-convert-same -- convert -q hh --type luks2
run hh-convert-unconfirmed -- convert hh --type luks1
run hh-erase-unconfirmed -- erase hh
run hh-erase -- erase -q hh
run hh-erased-open -- open hh --test-passphrase --key-file pass
run hh-restore -- luksHeaderRestore -q hh --header-backup-file hh.bak
run hh-restored-open -- open hh --test-passphrase --key-file pass
run hh-repair-unconfirmed -- repair hh
run hh-repair -- repair -q hh
run hh-convert -- convert -q hh --type luks1
run hh-dump-luks1 -- luksDump hh
TC=$REPO/testdata/peer-tests/cryptsetup/tcrypt-images.tar.xz
if [ -f "$TC" ] && tar xJf "$TC" tcrypt-images/tc_2-ripemd160-cbc-aes-hidden 2>/dev/null; then
    TI=tcrypt-images/tc_2-ripemd160-cbc-aes-hidden
    printf 'aaaaaaaaaaaa\n' >tcpass
    printf 'bbbbbbbbbbbb\n' >tchidden
    run unlock-tcrypt-test tcpass -- open "$TI" --type tcrypt --test-passphrase --hash ripemd160 --cipher aes
    run unlock-tcrypt-table tchidden -- luksOpen "$TI" --type tcrypt --print-table --tcrypt-hidden --hash ripemd160 --cipher aes tc
    run unlock-tcrypt-wrong tcpass -- luksOpen "$TI" --type tcrypt --print-table --tcrypt-hidden --hash ripemd160 --cipher aes tc
    run unlock-tcrypt-stdin tcpass -- luksOpen "$TI" --type tcrypt --print-table --key-file - --hash ripemd160 --cipher aes
    run unlock-tcrypt-dump tcpass -- tcryptDump "$TI" --hash ripemd160 --cipher aes
    run unlock-tcrypt-dump-key tcpass -- tcryptDump "$TI" -q --dump-volume-key --hash ripemd160 --cipher aes
    run unlock-tcrypt-dump-unconfirmed tcpass -- tcryptDump "$TI" --dump-volume-key --hash ripemd160 --cipher aes
    run unlock-tcrypt-dump-wrong tchidden -- tcryptDump "$TI" --hash ripemd160 --cipher aes
    TS=$(( $(stat -c %s "$TI") / 512 ))
    run unlock-tcrypt-dump-remote tcpass -- open --table "0 $TS crypt aes-xts-plain64 $KEY 0 $WORK/$TI 0" --raw \
        --socket "$WORK/tc.sock" --run "'$BIN' tcryptDump 'nbd+unix:///?socket=$WORK/tc.sock' --hash ripemd160 --cipher aes"
    run unlock-tcrypt-pim tcpass -- open "$TI" --type tcrypt --test-passphrase --veracrypt-query-pim --hash ripemd160
fi
exit 0
