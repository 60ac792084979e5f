#!/usr/bin/python3
"""Cluster bootstrap steps for cluster.sh, through python3-rados (the `ceph` CLI costs about
a second per call and its pg/df commands hang without a mgr).

  ctl.py CONF quorum                 exit 0 once the monitor answers
  ctl.py CONF osd-new UUID           registers an OSD, prints its id
  ctl.py CONF osd-up ID              exit 0 once osd.ID is up in the OSD map
  ctl.py CONF pool POOL PGS          replicated pool of size 1 with the rbd application
  ctl.py CONF ready ASOK POOL PGS    exit 0 once the OSD (admin socket ASOK) has PGS active
                                     PGs of POOL and an object written there reads back
"""
import json
import socket
import struct
import sys

import rados


def cluster(conf):
    t = "10"
    c = rados.Rados(conffile=conf, conf={"client_mount_timeout": t,
                                         "rados_mon_op_timeout": t,
                                         "rados_osd_op_timeout": t})
    c.connect(timeout=10)
    return c


def mon(c, **cmd):
    ret, out, err = c.mon_command(json.dumps(cmd), b"", timeout=10)
    if ret != 0:
        sys.exit(f"ctl.py: {cmd['prefix']}: {ret} {err}")
    return out


def admin_socket(path, prefix):
    """One admin-socket command: JSON plus NUL in, 4-byte big-endian length plus JSON out."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(json.dumps({"prefix": prefix}).encode() + b"\0")
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
            got = s.recv(65536)
            if not got:
                break
            data += got
    return json.loads(data[4:])


def main():
    conf, what, *args = sys.argv[1:]
    if what == "ready":
        asok, pool, want = args[0], args[1], int(args[2])
        pgs = admin_socket(asok, "dump_pgstate_history")["pgs"]
    c = cluster(conf)
    try:
        if what == "quorum":
            mon(c, prefix="quorum_status", format="json")
        elif what == "osd-new":
            print(json.loads(mon(c, prefix="osd new", uuid=args[0], format="json"))["osdid"])
        elif what == "osd-up":
            osds = json.loads(mon(c, prefix="osd dump", format="json"))["osds"]
            sys.exit(0 if any(o["osd"] == int(args[0]) and o["up"] for o in osds) else 1)
        elif what == "pool":
            pool, n = args[0], int(args[1])
            mon(c, prefix="osd pool create", pool=pool, pg_num=n, pgp_num=n,
                pool_type="replicated", size=1)
            mon(c, prefix="osd pool application enable", pool=pool, app="rbd",
                yes_i_really_mean_it=True)
        elif what == "ready":
            pid = str(c.pool_lookup(pool))
            active = [p for p in pgs
                      if p["pg"].split(".")[0] == pid and "/Active" in p["currently"]]
            if len(active) < want:
                sys.exit(1)
            with c.open_ioctx(pool) as io:
                io.write_full("ucrypt-probe", b"probe")
                ok = io.read("ucrypt-probe") == b"probe"
                io.remove_object("ucrypt-probe")
            sys.exit(0 if ok else 1)
        else:
            sys.exit(f"ctl.py: unknown step {what}")
    finally:
        c.shutdown()


if __name__ == "__main__":
    try:
        main()
    except rados.Error as e:
        sys.exit(f"ctl.py: {e}")
