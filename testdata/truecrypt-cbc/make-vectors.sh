#!/bin/sh
# Rebuilds vectors.jsonl: sectors encrypted by TrueCrypt 4.3a's own EncryptSectors (Common/Crypto.c)
# in its legacy CBC modes (CBC, outer-CBC cascades, inner-CBC Blowfish chains).
#
# usage: make-vectors.sh TC_SRC > vectors.jsonl
#   TC_SRC: a TrueCrypt 4.3a source tree (its Common/ and Crypto/ folders), e.g. the commit
#   "TrueCrypt Source Version 4.3a" (0296212) of the FreeApophis/TrueCrypt repository.
# The TrueCrypt sources are compiled in a scratch folder and never copied here; only
# tc43-oracle.c (ucrypt's driver) is ours. Needs gcc.
set -eu
src=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
b=$(mktemp -d)
trap 'rm -rf "$b"' EXIT
cd "$b"
# The sources name their headers in mixed case (Crypto.h, Common/Endian.h) while the release
# has CRYPTO.H, ENDIAN.H...: link every included name to the file that matches it ignoring
# case (not lower-case copies of everything, which would hide system headers like endian.h).
mkdir Common
for inc in $(cat "$src"/Common/* "$src"/Crypto/* "$here/tc43-oracle.c" 2>/dev/null \
        | sed -n 's/^#[[:space:]]*include "\([^"]*\)".*/\1/p' | sort -u); do
    case "$inc" in ../*) continue ;; esac
    base=$(basename "$inc")
    for d in Common Crypto; do
        f=$(ls "$src/$d" | grep -ix "$base" | head -1 || true)
        if [ -n "$f" ]; then ln -sf "$src/$d/$f" "$inc"; break; fi
    done
done
for f in CRYPTO.C CRC.C ENDIAN.C GfMul.c; do ln -sf "$src/Common/$f" "c_$f.c"; done
for f in Aescrypt.c Aeskey.c Aestab.c BF_ECB.C BF_ENC.C BF_SKEY.C C_ECB.C C_ENC.C C_SKEY.C \
         DES_ENC.C ECB3_ENC.C SET_KEY.C Serpent.c Twofish.c; do
    ln -sf "$src/Crypto/$f" "k_$f.c"
done
# DES's SP table sits in a header that no compiled file of the release includes.
printf '#include "Des.h"\n#include "DES_LOCL.H"\n#include "SPR.H"\n' > spr_tab.c
ln -sf "$src/Crypto/DES_LOCL.H" DES_LOCL.H
ln -sf "$src/Crypto/SPR.H" SPR.H
gcc -x c -w -O1 -I. -D__int8=char -D__int16=short -D__int32=int '-D__int64=long long' \
    -DBOOL=int -DTRUE=1 -DFALSE=0 -o oracle "$here/tc43-oracle.c" c_*.c k_*.c spr_tab.c
./oracle
