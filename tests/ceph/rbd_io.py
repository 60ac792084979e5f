#!/usr/bin/python3
"""librbd's own client-side encryption, through python3-rbd (Ceph 16 API), for the tests:

  rbd_io.py format POOL IMAGE luks1|luks2 PASSFILE        rbd_encryption_format (aes-256)
  rbd_io.py write  POOL IMAGE luks1|luks2|raw PASSFILE OFFSET FILE   FILE's bytes at OFFSET
  rbd_io.py read   POOL IMAGE luks1|luks2|raw PASSFILE OFFSET LENGTH FILE
  rbd_io.py size   POOL IMAGE luks1|luks2|raw PASSFILE     size seen (through encryption)
  rbd_io.py write-unlocked POOL IMAGE OFFSET FILE          a plain write (exit 30: EROFS)

Offsets are in the decrypted view ("raw": no encryption_load). Uses $CEPH_CONF.
"""
import os
import sys

import rados
import rbd

FORMATS = {"luks1": rbd.RBD_ENCRYPTION_FORMAT_LUKS1, "luks2": rbd.RBD_ENCRYPTION_FORMAT_LUKS2}


def main():
    cmd, pool, name = sys.argv[1:4]
    c = rados.Rados(conffile=os.environ["CEPH_CONF"])
    c.connect(timeout=30)
    try:
        with c.open_ioctx(pool) as io, rbd.Image(io, name) as img:
            if cmd == "write-unlocked":
                off, path = int(sys.argv[4]), sys.argv[5]
                try:
                    img.write(open(path, "rb").read(), off)
                    img.flush()
                except rbd.ReadOnlyImage:
                    sys.exit(30)
                return
            fmt, passfile, *rest = sys.argv[4:]
            secret = open(passfile, "rb").read()
            if cmd == "format":
                img.encryption_format(FORMATS[fmt], secret)
                return
            if fmt != "raw":
                img.encryption_load(FORMATS[fmt], secret)
            if cmd == "size":
                print(img.size())
            elif cmd == "write":
                data = open(rest[1], "rb").read()
                assert img.write(data, int(rest[0])) == len(data)
                img.flush()
            elif cmd == "read":
                with open(rest[2], "wb") as f:
                    f.write(img.read(int(rest[0]), int(rest[1])))
            else:
                sys.exit(f"rbd_io.py: unknown command {cmd}")
    finally:
        c.shutdown()


if __name__ == "__main__":
    main()
