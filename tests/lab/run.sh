#!/usr/bin/env bash
# The project's VM harness: runs SCRIPT as root inside a QEMU guest (TCG) booted with
# Debian's 6.12 distribution kernel, whose root filesystem is this machine's own / (read-only,
# under a tmpfs overlay) and whose working directory is this one, shared read-write at the
# same path. Prints the script's output (stdout and stderr together) and exits with its status.
#
#   tests/lab/run.sh [--smp N] [--mem MIB] SCRIPT [ARGS...]
#   tests/lab/run.sh --prepare          # download the kernel and build the initrd, then exit
#
# Exit status: the script's; 124 when the guest ran past LAB_TIMEOUT; 125 when the guest
# could not be started (a missing tool, no kernel). tests/lab/README.md has the details and
# the environment variables (LAB_CACHE, LAB_KERNEL, LAB_MODULES, LAB_TIMEOUT, LAB_CONSOLE,
# LAB_TPM, LAB_TPM_STATE, LAB_SHARED_MEM, LAB_QEMU_ARGS, LAB_BOOT_RETRIES).
set -euo pipefail

HARNESS_FAILED=125

say() { echo "lab: $*" >&2; }
fail() { say "$*"; exit "$HARNESS_FAILED"; }

# What the tests need at boot. Aliases (crc32c, ...) are resolved by modprobe, so the list
# does not depend on which implementation the kernel builds. The AEAD and HMAC modules are
# what dm-integrity and `cryptsetup luksFormat --integrity` ask for; virtio_blk is the guest
# side of a vhost-user-blk device. LAB_TPM=1 adds tpm_tis, the emulated TPM's driver.
DEFAULT_MODULES="crc32c xts aesni_intel ecb cbc ext4 loop brd nbd ublk_drv
  dm_mod dm_crypt dm_integrity authenc gcm chacha20poly1305 hmac sha256_generic
  sha512_generic virtio_blk"

smp=2 mem=2048 prepare_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --smp) smp=${2:?--smp needs a number}; shift 2 ;;
    --mem) mem=${2:?--mem needs a size in MiB}; shift 2 ;;
    --prepare) prepare_only=1; shift ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) fail "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
if [ "$prepare_only" = 0 ]; then
  [ $# -ge 1 ] || fail "no script given (usage: tests/lab/run.sh [--smp N] [--mem MIB] SCRIPT [ARGS...])"
  [ -f "$1" ] || fail "script $1 not found"
fi
case $smp$mem in *[!0-9]*) fail "--smp and --mem take plain numbers" ;; esac

for tool in qemu-system-x86_64 busybox cpio gzip xz depmod modprobe flock; do
  command -v "$tool" >/dev/null ||
    fail "needs $tool on PATH (scripts/setup.sh installs qemu-system-x86, qemu-utils, busybox-static, cpio, kmod)"
done

cache=${LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ucrypt-lab}
mkdir -p "$cache" || fail "cannot create the cache directory $cache"

# --- the kernel: Debian 12's linux-image-6.12.*+deb12-amd64-unsigned, unpacked once ---------

kernel_pattern='^linux-image-6\.12\.[0-9.]+\+deb12-amd64-unsigned$'

newest_in_apt() {
  apt-cache pkgnames linux-image-6.12 2>/dev/null | grep -E "$kernel_pattern" | sort -V | tail -n 1
}

choose_kernel() {
  if [ -n "${LAB_KERNEL:-}" ]; then echo "$LAB_KERNEL"; return; fi
  # A kernel already unpacked wins: later runs must not depend on the archive (which keeps
  # only its latest builds) nor on the network.
  local have
  have=$(find "$cache" -mindepth 1 -maxdepth 1 -type d -name 'linux-image-6.12*' -printf '%f\n' |
    grep -E "$kernel_pattern" | sort -V | tail -n 1 || true)
  if [ -n "$have" ] && [ -f "$cache/$have/.complete" ]; then echo "$have"; return; fi
  local pkg
  pkg=$(newest_in_apt || true)
  if [ -z "$pkg" ] && [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    pkg=$(newest_in_apt || true)
  fi
  echo "$pkg"
}

# Holds the cache's lock while unpacking and building, so that two runs started together
# (two test binaries, a test and a bench) do not both download.
exec 9>"$cache/.lock"
flock 9

pkg=$(choose_kernel)
[ -n "$pkg" ] || fail "no linux-image-6.12.*+deb12-amd64-unsigned in the apt lists (run apt-get update, or set LAB_KERNEL)"
kdir=$cache/$pkg
if [ ! -f "$kdir/.complete" ]; then
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
    fail "no cached kernel, and fetching $pkg needs apt-get and dpkg-deb"
  say "downloading $pkg into $cache (once; about 100 MB)"
  rm -rf "$kdir" "$cache/$pkg"_*.deb
  (cd "$cache" && apt-get download "$pkg" >/dev/null 2>"$cache/download.err") ||
    fail "apt-get download $pkg failed: $(tail -n 3 "$cache/download.err")"
  mkdir -p "$kdir.part"
  dpkg-deb -x "$cache/$pkg"_*.deb "$kdir.part" || fail "cannot unpack $pkg"
  rm -rf "$kdir.part/usr" "$cache/$pkg"_*.deb "$cache/download.err"
  mv "$kdir.part" "$kdir"
  touch "$kdir/.complete"
fi
kver=$(find "$kdir/lib/modules" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | head -n 1)
[ -n "$kver" ] && [ -f "$kdir/boot/vmlinuz-$kver" ] || fail "$kdir holds no kernel (remove it and run again)"
[ -f "$kdir/lib/modules/$kver/modules.dep.bin" ] || depmod -b "$kdir" "$kver"

# --- the initrd: busybox, the modules that reach the root (9p, overlay), and stage one -----
#
# Stage one mounts the host's / (9p, read-only) under a tmpfs overlay, fresh tmpfs on /run
# and /tmp, this run's directory (tag `lab`) at /run/ucrypt-lab and the kernel's module tree
# (tag `modules`) at /lib/modules/KVER, then hands over to the run's own stage two.

stage_one='#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for ko in $(cat /early/order); do insmod "/early/$ko" || echo "lab: insmod $ko failed"; done
nine="-t 9p -o trans=virtio,version=9p2000.L"
mount $nine,ro,cache=loose host /host || { echo "lab: cannot mount the host root"; sleep 1; exit 1; }
mount -t tmpfs -o size=75% upper /upper
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/host,upperdir=/upper/data,workdir=/upper/work root /root
mount -t tmpfs -o mode=0755 run /root/run
mount -t tmpfs -o mode=1777 tmp /root/tmp
mkdir -p /root/run/ucrypt-lab /root/lib/modules/KVER
mount $nine lab /root/run/ucrypt-lab
mount $nine,ro modules /root/lib/modules/KVER
for fs in proc sys dev; do mount --move /$fs /root/$fs; done
exec switch_root /root /bin/bash /run/ucrypt-lab/stage-two'
stage_one=${stage_one//KVER/$kver}

stamp=$(printf '%s\n%s\n' "$stage_one" "$(busybox 2>&1 | head -n 1)" | sha256sum | cut -c1-12)
initrd=$cache/initrd-$kver-$stamp.cpio.gz
if [ ! -f "$initrd" ]; then
  tree=$(mktemp -d)
  mkdir -p "$tree"/{bin,dev,proc,sys,host,upper,root,early}
  cp "$(command -v busybox)" "$tree/bin/busybox"
  for applet in sh mount mkdir cat insmod sleep switch_root; do ln -s busybox "$tree/bin/$applet"; done
  # modprobe lists what 9p and overlay need, dependencies first.
  modprobe -d "$kdir" -S "$kver" --show-depends -a 9p 9pnet_virtio overlay |
    awk '$1 == "insmod" { print $2 }' | awk '!seen[$0]++' > "$tree/early/paths"
  : > "$tree/early/order"
  while read -r ko; do
    name=$(basename "$ko"); name=${name%.xz}
    case $ko in *.xz) xz -dc "$ko" > "$tree/early/$name" ;; *) cp "$ko" "$tree/early/$name" ;; esac
    echo "$name" >> "$tree/early/order"
  done < "$tree/early/paths"
  rm "$tree/early/paths"
  [ -s "$tree/early/order" ] || { rm -rf "$tree"; fail "modprobe found no 9p/overlay modules in $kdir"; }
  printf '%s\n' "$stage_one" > "$tree/init"
  chmod 755 "$tree/init"
  (cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1 > "$initrd.part") && mv "$initrd.part" "$initrd"
  rm -rf "$tree"
  find "$cache" -maxdepth 1 -name "initrd-*.cpio.gz" ! -name "$(basename "$initrd")" -delete
fi
flock -u 9
exec 9>&-

if [ "$prepare_only" = 1 ]; then
  say "ready: $pkg (kernel $kver) and its initrd in $cache"
  exit 0
fi

# --- this run ---------------------------------------------------------------------------

script=$(realpath "$1"); shift
here=$PWD
run=$(mktemp -d "${TMPDIR:-/tmp}/ucrypt-lab-run.XXXXXX")
tpm_pid=
cleanup() {
  [ -n "$tpm_pid" ] && kill "$tpm_pid" 2>/dev/null
  rm -rf "$run"
}
trap cleanup EXIT
cp "$script" "$run/script"
chmod 755 "$run/script"


modules=$(echo $DEFAULT_MODULES ${LAB_MODULES:-})
qemu=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem"
  -display none -monitor none -nic none -no-reboot
  -serial "file:$run/console" -kernel "$kdir/boot/vmlinuz-$kver" -initrd "$initrd"
  -append "console=ttyS0 panic=-1 quiet"
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap
  -virtfs "local,path=$kdir/lib/modules/$kver,mount_tag=modules,security_model=none,readonly=on"
  -virtfs "local,path=$run,mount_tag=lab,security_model=none"
  -virtfs "local,path=$here,mount_tag=work,security_model=none")

if [ "${LAB_TPM:-0}" = 1 ]; then
  command -v swtpm >/dev/null || fail "LAB_TPM=1 needs swtpm (scripts/setup.sh installs swtpm swtpm-tools)"
  tpm_state=${LAB_TPM_STATE:-$run/tpm}
  mkdir -p "$tpm_state"
  swtpm socket --tpm2 --tpmstate "dir=$tpm_state" --ctrl "type=unixio,path=$run/tpm.sock" \
    --flags startup-clear --daemon --pid "file=$run/tpm.pid" --log "file=$run/tpm.log" ||
    fail "swtpm did not start"
  tpm_pid=$(cat "$run/tpm.pid")
  modules="$modules tpm_tis"
  qemu+=(-chardev "socket,id=tpmchr,path=$run/tpm.sock" -tpmdev emulator,id=tpm0,chardev=tpmchr
    -device tpm-tis,tpmdev=tpm0)
fi
if [ "${LAB_SHARED_MEM:-0}" = 1 ]; then
  # A vhost-user back end maps the guest's memory: it must be a shared file, not anonymous.
  qemu+=(-object "memory-backend-memfd,id=ram0,size=${mem}M,share=on" -machine memory-backend=ram0)
fi
if [ -n "${LAB_QEMU_ARGS:-}" ]; then
  read -r -a extra <<< "$LAB_QEMU_ARGS"
  qemu+=("${extra[@]}")
fi

# Stage two runs in the guest as PID 1 on the overlay root: the devices udev would make,
# the working directory, the modules, then the script. Its arguments are quoted by printf
# %q, which bash reads back verbatim.
{
  echo '#!/bin/bash'
  echo 'export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LAB_GUEST=1'
  echo 'cut -d" " -f1 /proc/uptime > /run/ucrypt-lab/booted'
  echo 'mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs shm /dev/shm'
  echo 'ln -sfn /proc/self/fd /dev/fd; ln -sf fd/0 /dev/stdin; ln -sf fd/1 /dev/stdout; ln -sf fd/2 /dev/stderr'
  printf 'mkdir -p %q && mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 work %q\n' "$here" "$here"
  # About 10 s under TCG (one modprobe -a of the whole list is no faster).
  printf 'for m in %s; do modprobe "$m" 2>/dev/null || echo "$m" >> /run/ucrypt-lab/modules-failed; done\n' \
    "$modules"

  echo 'cut -d" " -f1 /proc/uptime > /run/ucrypt-lab/ready'
  printf 'cd %q\n' "$here"
  if [ "${LAB_EXEC:-0}" = 1 ]; then
    # The script becomes PID 1 (it may exec an init system); it writes status and
    # finished itself and powers the guest off.
    printf 'exec /run/ucrypt-lab/script'; printf ' %q' "$@"; echo ' > /run/ucrypt-lab/output 2>&1 < /dev/null'
  fi
  printf '/run/ucrypt-lab/script'; printf ' %q' "$@"; echo ' > /run/ucrypt-lab/output 2>&1 < /dev/null'
  echo 'echo $? > /run/ucrypt-lab/status'
  echo 'cut -d" " -f1 /proc/uptime > /run/ucrypt-lab/finished'
  # Power off through sysrq: the host's poweroff may want an init system the guest lacks.
  echo 'sync; echo o > /proc/sysrq-trigger; sleep 60'
} > "$run/stage-two"
chmod 755 "$run/stage-two"

limit=${LAB_TIMEOUT:-1800}
started=$(date +%s)
# A guest that dies before its script starts (a kernel crash during the emulated boot:
# seen once in a CI run, "Fatal exception in interrupt" 3 s into the boot) has run none of
# the test, so it is booted once more (LAB_BOOT_RETRIES). A guest that reached the script
# is never run again: its failures are the test's.
tries=$((1 + ${LAB_BOOT_RETRIES:-1}))
while :; do
  set +e
  timeout --kill-after=10 "$limit" "${qemu[@]}" < /dev/null > "$run/qemu.log" 2>&1
  qemu_status=$?
  set -e
  tries=$((tries - 1))
  [ -f "$run/ready" ] || [ "$qemu_status" = 124 ] || [ "$qemu_status" = 137 ] && break
  [ "$tries" -gt 0 ] || break
  say "the guest stopped before its script started (qemu status $qemu_status); its console:"
  (tail -n 8 "$run/console" 2>/dev/null || true) | sed 's/^/lab: console: /' >&2
  say "booting it once more"
  rm -f "$run/console" "$run/booted" "$run/modules-failed"
done
elapsed=$(($(date +%s) - started))

[ -n "${LAB_CONSOLE:-}" ] && cp "$run/console" "$LAB_CONSOLE"
[ -f "$run/output" ] && cat "$run/output"
if [ -s "$run/modules-failed" ]; then
  say "modules that did not load: $(tr '\n' ' ' < "$run/modules-failed")"
fi
if [ -f "$run/status" ]; then
  say "$(awk -v k="$kver" -v up="$(cat "$run/booted")" -v ready="$(cat "$run/ready")" \
    -v end="$(cat "$run/finished" 2>/dev/null || echo 0)" -v all="$elapsed" 'BEGIN {
      printf "kernel %s: booted in %.1f s, modules loaded in %.1f s, the script ran %.0f s, %d s in all",
        k, up, ready - up, end - ready, all }')"
  exit "$(cat "$run/status")"
fi
if [ "$qemu_status" = 124 ] || [ "$qemu_status" = 137 ]; then
  say "the guest ran past LAB_TIMEOUT=$limit s and was stopped"
  tail -n 20 "$run/console" | sed 's/^/lab: console: /' >&2
  exit 124
fi
say "the guest did not run the script (qemu status $qemu_status); its console and qemu's messages:"
(tail -n 25 "$run/console" 2>/dev/null || true) | sed 's/^/lab: console: /' >&2
sed 's/^/lab: qemu: /' "$run/qemu.log" >&2
exit "$HARNESS_FAILED"
