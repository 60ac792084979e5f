#!/bin/bash
# A throw-away single-node Ceph cluster (Debian 12's ceph 16.2.15 packages: ceph-mon,
# ceph-osd, ceph-common, python3-rados, uuid-runtime) for ucrypt's RBD tests and benchmark:
# one monitor, one OSD (bluestore on a sparse file, or memstore), no mgr, auth none, a pool
# "rbd" of size 1. No systemd, no containers: the daemons are started here, daemonize, and
# write pid files into the cluster's temp dir.
#
#   eval "$(tests/ceph/cluster.sh start)"   # prints export CEPH_CONF=... CEPH_TEST_DIR=...
#   tests/ceph/cluster.sh restart-osd "$CEPH_TEST_DIR"   # SIGKILL the OSD, start it again
#   tests/ceph/cluster.sh stop "$CEPH_TEST_DIR"          # SIGKILL by pid file, rm -rf
#
# Knobs (environment):
#   CEPH_OSD_STORE=bluestore|memstore   default bluestore (memstore keeps data in the OSD's
#                                       heap, loses it when the OSD is killed, and never gives
#                                       freed memory back)
#   CEPH_OSD_SIZE_MB=N                  bluestore file / memstore capacity (8192 / 4096;
#                                       the sparse file grows with overwrites, since bluestore
#                                       allocates fresh extents: 20 GiB filled the host's disk
#                                       during bench/rbd.sh's 1 MiB writes; the tests' images
#                                       are 8-64 MiB)
#   CEPH_WATCH_PID=PID                  a detached watchdog stops the cluster once PID exits
#                                       (the test process: a crashed run leaks nothing)
#   CEPH_START_TIMEOUT=S                per wait step (default 120)
# Facts it relies on (measured, Ceph 16.2.15 on Debian 12):
#   - without a mgr, `ceph pg stat`/`ceph df` hang: readiness comes from the OSD's admin
#     socket (dump_pgstate_history) plus an object written and read back (ctl.py);
#   - the monitor batches OSD-map commits for 1 s each unless paxos propose interval is low;
#   - ceph-mon --mkfs wants a keyring with a mon. key even with auth none;
#   - client admin sockets must be off, or concurrent clients fight over one path;
#   - bluestore must not have its block file at <osd data>/block (it symlinks that: ELOOP);
#   - admin socket paths must fit in 107 bytes: keep TMPDIR short.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[ceph $(date +%T)] $*" >&2; }

ours() {  # pid dir: is the pid a live daemon started with -c dir/ceph.conf?
  local cmd
  cmd=$( { tr '\0' ' ' < "/proc/$1/cmdline"; } 2>/dev/null ) || return 1
  [[ "$cmd" == *" $2/ceph.conf "* ]]
}

kill_pids() {  # dir signal files... : signal the daemons named in the pid files, wait until gone
  local d=$1 sig=$2 f p pids=() i alive; shift 2
  for f in "$@"; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null) || continue
    [[ "$p" =~ ^[0-9]+$ ]] && ours "$p" "$d" && pids+=("$p")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  for p in "${pids[@]}"; do kill "-$sig" "$p" 2>/dev/null || true; done
  for i in $(seq 200); do
    alive=0
    # Gone means reaped or a zombie: its cmdline empties when its memory goes, before
    # its files (and bluestore's lock on its block file) are released.
    for p in "${pids[@]}"; do
      [ -r "/proc/$p/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null && alive=1
    done
    [ $alive = 0 ] && return 0
    sleep 0.05
  done
  for p in "${pids[@]}"; do ours "$p" "$d" && kill -KILL "$p" 2>/dev/null; done
  return 0
}

stop() {
  local d=${1:?usage: cluster.sh stop DIR}
  [ -f "$d/ceph.conf" ] || { log "$d holds no cluster"; return 2; }
  d=$(cd "$d" && pwd)
  if [ -f "$d/run/watchdog.pid" ]; then
    local w; w=$(cat "$d/run/watchdog.pid")
    if [[ "$w" =~ ^[0-9]+$ ]] && [ "$w" != $$ ]; then
      local wc; wc=$( { tr '\0' ' ' < "/proc/$w/cmdline"; } 2>/dev/null ) || wc=
      [[ "$wc" == *"ucrypt-ceph-watchdog"*"$d"* ]] && kill -TERM "$w" 2>/dev/null || true
    fi
  fi
  kill_pids "$d" KILL "$d"/run/osd.*.pid "$d"/run/mon.*.pid
  rm -rf -- "$d"
}

wait_for() {  # what command...
  local what=$1 deadline=$(( $(date +%s) + ${CEPH_START_TIMEOUT:-120} )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || { log "timeout waiting for $what"; return 1; }
    sleep 0.2
  done
}

restart_osd() {
  local d=${1:?usage: cluster.sh restart-osd DIR}
  d=$(cd "$d" && pwd)
  kill_pids "$d" KILL "$d/run/osd.0.pid"
  rm -f "$d/run/osd.0.pid" "$d/run/osd.0.asok"
  # A start can still find the old daemon's lock on its block file (seen under load):
  # try again a few times, and say why on the last failure.
  local i
  for i in $(seq 10); do
    ceph-osd -c "$d/ceph.conf" -i 0 2>>"$d/log/osd-start.err" && break
    if [ "$i" = 10 ]; then
      log "ceph-osd did not start again: $(tail -n 5 "$d/log/osd-start.err" "$d"/log/*osd* 2>/dev/null | tail -n 20)"
      return 1
    fi
    sleep 0.5
  done
  wait_for "osd.0 up" timeout 30 /usr/bin/python3 "$HERE/ctl.py" "$d/ceph.conf" osd-up 0
}

start() {
  local store=${CEPH_OSD_STORE:-bluestore} b
  local size_mb=${CEPH_OSD_SIZE_MB:-$([ "$store" = memstore ] && echo 4096 || echo 8192)}
  for b in ceph-mon ceph-osd monmaptool ceph-authtool uuidgen timeout /usr/bin/python3; do
    command -v "$b" >/dev/null || { log "missing $b (apt-get install ceph-mon ceph-osd ceph-common python3-rados uuid-runtime)"; exit 1; }
  done
  /usr/bin/python3 -c 'import rados' 2>/dev/null || { log "missing python3-rados"; exit 1; }
  local d; d=$(mktemp -d "${TMPDIR:-/tmp}/ucrypt-ceph.XXXXXX")
  mkdir -p "$d"/{run,log,mon.a,osd.0}
  # On failure: the log tails, the daemons killed, the directory kept for a look.
  STARTED=0
  # (the trap sees globals only: start's locals are gone when it runs)
  CEPH_FAILED_DIR=$d
  trap '[ "$STARTED" = 1 ] || { d=$CEPH_FAILED_DIR; for f in "$d"/log/*.err "$d"/log/mon.a.log "$d"/log/osd.0.log; do [ -s "$f" ] && { echo "---- $f" >&2; tail -n 15 "$f" >&2; }; done; kill_pids "$d" KILL "$d"/run/*.pid; log "failed; logs kept in $d"; }' EXIT
  local port; port=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  local fsid osd_uuid; fsid=$(uuidgen); osd_uuid=$(uuidgen)
  local store_lines
  if [ "$store" = bluestore ]; then
    store_lines="osd objectstore = bluestore
bluestore block path = $d/osd.0.block
bluestore block create = true
bluestore block size = $((size_mb << 20))
bluestore block db create = false
bluestore block wal create = false
bluestore fsck on mount = false
bluestore fsck on mkfs = false
bdev enable discard = false
bluestore cache autotune = false
bluestore cache size = 134217728
osd memory target = 939524096"
  elif [ "$store" = memstore ]; then
    store_lines="osd objectstore = memstore
memstore device bytes = $((size_mb << 20))"
  else
    log "CEPH_OSD_STORE must be bluestore or memstore"; exit 1
  fi
  cat > "$d/ceph.conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
mon initial members = a
public addr = 127.0.0.1
public network = 127.0.0.0/8
ms bind ipv6 = false
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
run dir = $d/run
pid file = $d/run/\$name.pid
log file = $d/log/\$name.log
log to stderr = false
err to stderr = true
log to syslog = false
crash dir = $d/log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1
# a killed client's watch (and so its exclusive lock) expires after 15 s, not 30 (clients
# ping their watches every 5 s, objecter tick interval: at 5 s live watches lapsed too)
osd client watch timeout = 15
[client]
admin socket =
log file = $d/log/client.log
client mount timeout = 30
rados mon op timeout = 60
[mon]
admin socket = $d/run/\$name.asok
paxos propose interval = 0.01
mon data = $d/mon.\$id
mon cluster log file = $d/log/cluster.log
[osd]
admin socket = $d/run/\$name.asok
osd data = $d/osd.\$id
$store_lines
osd crush update on start = true
osd op num shards = 1
osd op num threads per shard = 2
CONF
  local conf=$d/ceph.conf ctl="timeout 30 /usr/bin/python3 $HERE/ctl.py $d/ceph.conf"
  ceph-authtool --create-keyring "$d/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$d/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$d/monmap" --keyring "$d/keyring" 2>"$d/log/mon-mkfs.err"
  ceph-mon -c "$conf" -i a 2>"$d/log/mon-start.err"
  wait_for "monitor quorum" $ctl quorum
  local id; id=$($ctl osd-new "$osd_uuid")
  [ "$id" = 0 ] || { log "unexpected OSD id $id"; exit 1; }
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>"$d/log/osd-mkfs.err"
  ceph-osd -c "$conf" -i 0 2>"$d/log/osd-start.err"
  wait_for "osd.0 up" $ctl osd-up 0
  $ctl pool rbd 8
  wait_for "pool rbd active" $ctl ready "$d/run/osd.0.asok" rbd 8
  if [ -n "${CEPH_WATCH_PID:-}" ]; then
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -f "$2/ceph.conf" ]; do sleep 1; done
                    [ -f "$2/ceph.conf" ] && exec "$3" stop "$2"' \
      ucrypt-ceph-watchdog "$CEPH_WATCH_PID" "$d" "$HERE/cluster.sh" \
      </dev/null >"$d/log/watchdog.log" 2>&1 &
    echo $! > "$d/run/watchdog.pid"
  fi
  STARTED=1
  log "cluster up in $d ($store)"
  echo "export CEPH_CONF=$conf"
  echo "export CEPH_TEST_DIR=$d"
}

case "${1:-}" in
  start) start ;;
  stop) stop "${2:-${CEPH_TEST_DIR:-}}" ;;
  restart-osd) restart_osd "${2:-${CEPH_TEST_DIR:-}}" ;;
  *) echo "usage: $0 start | stop DIR | restart-osd DIR" >&2; exit 2 ;;
esac
