#!/usr/bin/env bash
# Installs what ucrypt's build and tests need on Debian 12. Idempotent: safe to run again.
#   - gcc/make/pkg-config: aws-lc-sys builds its C with the cc crate
#   - keyutils: keyctl, for the kernel-keyring key tests
#   - libcryptsetup-dev: LUKS headers and keyslots go through libcryptsetup (-lcryptsetup);
#     python3-cryptography (independent AES-XTS) and tmux (no-echo prompt) for LUKS tests
#   - peers used by interop tests and benchmarks: cryptsetup, qemu-utils, nbdkit, libnbd
#     tools, fio, fuse3
#   - NBD interop: nbdinfo/nbdcopy/nbdfuse (all in libnbd-bin on Debian 12), qemu-img and
#     qemu-io (qemu-utils), fio's nbd engine; the filesystem test adds e2fsprogs (mkfs.ext4)
#     and util-linux (losetup, mount); the nbdkit baselines in bench/ use its luks filter
#   - fuse2fs: mounts an ext4 file system on the FUSE front end's file without root (the
#     README's way for users; Debian 12 ships it apart from e2fsprogs)
#   - libssl-dev: NBD TLS goes through the system's OpenSSL (the openssl crate);
#     openssl (the tool) makes the TLS tests' certificates
#   - strace: the reencryption interop test kills ucrypt and cryptsetup at a chosen write
#     (SIGKILL injected on syscall entry) to leave a real crashed hotzone
#   - systemd: systemd-analyze verify checks the units ucrypt's crypttab generator writes
#   - tcplay: made the TrueCrypt cascade images in testdata/wrongdata (make-images.sh, in the
#     kernel lab); xz-utils unpacks the committed images
#   - libclang-dev: libublk-rs-sys (the ublk front end) generates its kernel bindings with
#     bindgen at build time
#   - the VM harness tests/lab/run.sh (ublk, kernel NBD, dm-crypt and dm-integrity tests,
#     bench/lab-blockdev.sh): qemu-system-x86 (installed in the same apt-get call as
#     qemu-utils, or it replaces a newer qemu-utils), busybox-static, cpio, kmod; swtpm and
#     swtpm-tools for its TPM 2.0 (LAB_TPM=1); nbd-client and dmsetup inside the guest. At the
#     end the harness downloads Debian's 6.12 kernel into its cache (once)
#   - LUKS2 tokens (crates/cli/tests/tokens.rs): clevis, clevis-luks (clevis luks bind;
#     pulls jose, luksmeta, curl) and tang (tangd, served on a loopback port through socat);
#     clevis-tpm2 and tpm2-tools (clevis's tpm2 pin, in the kernel lab with LAB_TPM=1);
#     softhsm2 and opensc (pkcs11-tool) for a PKCS#11 token systemd-cryptenroll enrols;
#     systemd (systemd-cryptenroll and libcryptsetup's systemd-* token plugins) is the base
#     system's
#   - Ceph RBD (crates/cli/tests/rbd.rs, bench/rbd.sh, tests/ceph/cluster.sh): a
#     single-node cluster from ceph-mon, ceph-osd, ceph-common (rbd, monmaptool,
#     ceph-authtool) and uuid-runtime; python3-rados/python3-rbd drive the bootstrap and
#     librbd's own encryption; librbd1 is what ucrypt dlopens (no -dev package: the few
#     declarations are hand-written); qemu-block-extra gives qemu-nbd its rbd driver
#     (the NBD-export baseline of bench/rbd.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential pkg-config libssl-dev openssl
  keyutils libcryptsetup-dev python3-cryptography tmux
  cryptsetup-bin qemu-utils nbdkit libnbd-bin fio fuse3 e2fsprogs fuse2fs util-linux
  tcplay xz-utils strace
  systemd
  libclang-dev qemu-system-x86 busybox-static cpio kmod swtpm swtpm-tools nbd-client dmsetup
  ceph-mon ceph-osd ceph-common librbd1 python3-rados python3-rbd uuid-runtime qemu-block-extra
  clevis clevis-luks clevis-tpm2 tpm2-tools tang socat softhsm2 opensc
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# qemu-system-x86 alone would swap qemu-utils for the archive's (older) build: name both.
case " ${missing[*]} " in *" qemu-system-x86 "*) case " ${missing[*]} " in *" qemu-utils "*) ;; *) missing+=(qemu-utils) ;; esac ;; esac

if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    # A newer qemu-utils (a backport, as some images ship) Breaks the archive's
    # qemu-system-common, and apt will not downgrade on its own: take both from the release
    # that has qemu-system-x86 (the lab needs the system emulator; qemu-img/qemu-io/qemu-nbd
    # of that release serve every test).
    release=$(apt-cache policy qemu-system-x86 | awk '/^ +[0-9]+ http/ {print $3; exit}' | cut -d/ -f1)
    echo "setup: retrying with qemu-utils/${release:-stable} (downgrade allowed)"
    pkgs=()
    for p in "${missing[@]}"; do
      if [ "$p" = qemu-utils ] && [ -n "$release" ]; then pkgs+=("qemu-utils/$release"); else pkgs+=("$p"); fi
    done
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends --allow-downgrades "${pkgs[@]}" >/dev/null
  fi
else
  echo "setup: system packages present"
fi

# The VM harness boots linux-image-6.12.*+deb12-amd64-unsigned: make sure the apt lists name
# it, then let the harness download and unpack it into its cache (a no-op once cached).
if ! apt-cache pkgnames linux-image-6.12 2>/dev/null | grep -qE '^linux-image-6\.12\.[0-9.]+\+deb12-amd64-unsigned$' &&
  ! ls -d "${LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ucrypt-lab}"/linux-image-6.12*/.complete >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
fi
if ! tests/lab/run.sh --prepare; then
  # Without the kernel the VM tests skip by hand and fail under CI: say so now.
  echo "setup: tests/lab/run.sh --prepare failed (see above)" >&2
  case ${CI:-} in "" | 0 | false) ;; *) exit 1 ;; esac
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust stable) is required and was not found" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt 2>/dev/null || true
echo "setup: $(cargo --version)"
