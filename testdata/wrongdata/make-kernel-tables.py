#!/usr/bin/env python3
"""Records the dm tables cryptsetup gives the real kernel, for ucrypt's field audit.

Run in the guest of the repository's VM harness, from this directory (it reads
../peer-tests and writes kernel-tables.jsonl and luks2-persistent.hdr.xz here):
    ../../tests/lab/run.sh ./make-kernel-tables.py

Each row: how the volume was made (cryptsetup luksFormat arguments, or a cryptsetup suite
image), how it was opened (`cryptsetup open` arguments), and `dmsetup table --showkeys` of
every device cryptsetup created, with device numbers replaced by names: `<dev>` for the
image's loop device, `/dev/mapper/NAME` for a device-mapper device. Keys held in the kernel
keyring (LUKS2) are recorded as `<keyring>`. The test (`wrongdata.rs`) re-creates each volume
on the host with the same arguments, or opens the same suite image, and requires ucrypt's
`--print-table --showkeys` to be the same table: every header field and every option that
reaches the kernel's table is honoured the same way by ucrypt.
"""
import json, os, re, shutil, subprocess, sys, tarfile, tempfile

os.environ["DM_DISABLE_UDEV"] = "1"
PASS = "ucrypt-wrongdata"
HERE = os.getcwd()
W = tempfile.mkdtemp(prefix="ktables.")
KEY = os.path.join(W, "key")
with open(KEY, "w") as f:
    f.write(PASS)
RAWKEY = os.path.join(W, "rawkey")
with open(RAWKEY, "wb") as f:
    f.write(bytes(range(64)))
FAST = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]


def run(args, stdin=None):
    p = subprocess.run(args, input=stdin, capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{args}: {p.stderr.decode(errors='replace').strip()}")
    return p.stdout.decode()


def dm_name(majmin):
    try:
        with open(f"/sys/dev/block/{majmin}/dm/name") as f:
            return "/dev/mapper/" + f.read().strip()
    except OSError:
        return "<dev>"


def tables(name):
    """dmsetup table --showkeys of NAME and of every dm device it sits on."""
    out = {}
    todo = [name]
    while todo:
        n = todo.pop()
        for line in run(["dmsetup", "table", "--showkeys", n]).splitlines():
            f = line.split()
            if len(f) > 7 and f[2] == "crypt":
                if f[4].startswith(":"):
                    f[4] = "<keyring>"
                dev = dm_name(f[6]) if re.fullmatch(r"\d+:\d+", f[6]) else f[6]
                if dev.startswith("/dev/mapper/"):
                    todo.append(dev[len("/dev/mapper/"):])
                f[6] = dev
            out.setdefault(n, []).append(" ".join(f))
    return out


def close_all(name):
    subprocess.run(["cryptsetup", "close", name], capture_output=True)
    for n in run(["dmsetup", "ls"]).split("\n"):
        n = n.split("\t")[0].strip()
        if n.startswith(name):
            subprocess.run(["dmsetup", "remove", "--retry", n], capture_output=True)


rows = []


def record(row, img, open_args, stdin=None, header=None):
    name = "wd" + re.sub(r"[^a-z0-9]", "", row["id"])[:20]
    args = ["cryptsetup", "open"] + open_args
    if header:
        args += ["--header", header]
    try:
        run(args + [img, name], stdin)
        row["tables"] = tables(name)
        row["name"] = name
    except RuntimeError as e:
        row["kernel_error"] = str(e)
    finally:
        close_all(name)
        subprocess.run(["losetup", "-D"], capture_output=True)
    rows.append(row)
    print(json.dumps(row), flush=True)


# Volumes cryptsetup formats: (id, luksFormat args or None for plain, open args, size MiB).
MADE = [
    ("plain-default", None, ["--type", "plain", "--key-file", "-"], 4),
    ("plain-xts-offsets", None, ["--type", "plain", "-c", "aes-xts-plain64", "-s", "512", "--hash", "sha256",
                                 "--offset", "8", "--skip", "16", "--size", "2048", "--key-file", "-"], 4),
    ("plain-4k", None, ["--type", "plain", "-c", "aes-xts-plain64", "-s", "256", "--hash", "sha512",
                        "--sector-size", "4096", "--offset", "8", "--key-file", "-"], 4),
    ("plain-4k-iv-large", None, ["--type", "plain", "-c", "aes-xts-plain64", "--hash", "sha256",
                                 "--sector-size", "4096", "--iv-large-sectors", "--skip", "8", "--key-file", "-"], 4),
    ("plain-twofish-cbc", None, ["--type", "plain", "-c", "twofish-cbc-essiv:sha256", "-s", "256", "--hash", "sha1",
                                 "--allow-discards", "--key-file", "-"], 4),
    ("plain-raw-keyfile", None, ["--type", "plain", "-c", "serpent-xts-plain64", "-s", "512", "--key-file", RAWKEY,
                                 "--keyfile-offset", "0"], 4),
    ("plain-cbc-plain64", None, ["--type", "plain", "-c", "aes-cbc-plain64", "-s", "128", "--hash", "sha256",
                                 "--key-file", "-"], 4),
    ("plain-keyfile-offset", None, ["--type", "plain", "-c", "aes-xts-plain64", "-s", "256", "--key-file", RAWKEY,
                                    "--keyfile-offset", "5"], 4),
    ("plain-keyfile-size", None, ["--type", "plain", "-c", "aes-xts-plain64", "--hash", "sha256",
                                  "--keyfile-size", "8", "--key-file", "-"], 4),
    ("plain-hash-plain", None, ["--type", "plain", "-c", "aes-cbc-plain", "-s", "128", "--hash", "plain",
                                "--key-file", "-"], 4),
    ("luks1-default", ["--type", "luks1"], ["--key-file", KEY], 4),
    ("luks1-cbc-essiv-offset", ["--type", "luks1", "-c", "aes-cbc-essiv:sha256", "-s", "256", "--offset", "4096"],
     ["--key-file", KEY], 4),
    ("luks1-twofish-xts", ["--type", "luks1", "-c", "twofish-xts-plain64", "-s", "512"], ["--key-file", KEY], 4),
    ("luks1-discards", ["--type", "luks1", "-c", "aes-xts-plain64", "-s", "256"], ["--key-file", KEY, "--allow-discards"], 4),
    ("luks2-512", ["--type", "luks2", "--sector-size", "512", "--luks2-metadata-size", "16k",
                   "--luks2-keyslots-size", "1m"], ["--key-file", KEY], 4),
    ("luks2-4k", ["--type", "luks2", "--sector-size", "4096", "--luks2-metadata-size", "16k",
                  "--luks2-keyslots-size", "1m"], ["--key-file", KEY], 4),
    ("luks2-offset-cbc", ["--type", "luks2", "--sector-size", "512", "--offset", "8192", "-c", "aes-cbc-essiv:sha256",
                          "-s", "256"], ["--key-file", KEY], 8),
    ("luks2-serpent-xts-128", ["--type", "luks2", "--sector-size", "2048", "-c", "serpent-xts-plain64", "-s", "256",
                               "--luks2-metadata-size", "16k", "--luks2-keyslots-size", "1m"], ["--key-file", KEY], 4),
    ("luks2-discards", ["--type", "luks2", "--sector-size", "512", "--luks2-metadata-size", "16k",
                        "--luks2-keyslots-size", "1m"], ["--key-file", KEY, "--allow-discards"], 4),
]

for ident, fmt, open_args, mib in MADE:
    img = os.path.join(W, ident + ".img")
    with open(img, "wb") as f:
        f.truncate(mib << 20)
    row = {"id": ident, "format": fmt, "open": [a if a not in (KEY, RAWKEY) else ("<key>" if a == KEY else "<rawkey>") for a in open_args], "mib": mib}
    stdin = None
    try:
        if fmt is not None:
            run(["cryptsetup", "luksFormat", "-q"] + FAST + ["--key-file", KEY] + fmt + [img])
        else:
            stdin = PASS.encode()
    except RuntimeError as e:
        row["format_error"] = str(e)
        rows.append(row)
        print(json.dumps(row), flush=True)
        continue
    record(row, img, open_args, stdin)
    os.unlink(img)

# A detached LUKS2 header: the data device starts at 0.
img = os.path.join(W, "detached.img")
hdr = os.path.join(W, "detached.hdr")
for p, n in ((img, 4 << 20), (hdr, 16 << 20)):
    with open(p, "wb") as f:
        f.truncate(n)
run(["cryptsetup", "luksFormat", "-q"] + FAST + ["--key-file", KEY, "--type", "luks2", "--header", hdr, img])
record({"id": "luks2-detached", "format": ["--type", "luks2", "--header", "<hdr>"], "open": ["--key-file", "<key>"], "mib": 4},
       img, ["--key-file", KEY], header=hdr)

# LUKS2 persistent flags: set by `cryptsetup open --persistent`, then the volume is opened
# again without options; the header (with the flags) is kept as luks2-persistent.hdr.xz and
# the test opens it as a detached header over a zero data file of the same size.
img = os.path.join(W, "persistent.img")
with open(img, "wb") as f:
    f.truncate(4 << 20)
run(["cryptsetup", "luksFormat", "-q"] + FAST + ["--key-file", KEY, "--type", "luks2", "--sector-size", "512",
     "--luks2-metadata-size", "16k", "--luks2-keyslots-size", "128k", "-s", "256", img])
run(["cryptsetup", "open", "--key-file", KEY, "--persistent", "--allow-discards", "--perf-same_cpu_crypt",
     "--perf-submit_from_crypt_cpus", "--perf-no_read_workqueue", "--perf-no_write_workqueue", img, "wdpersist"])
close_all("wdpersist")
backup = os.path.join(W, "persistent.hdr")
run(["cryptsetup", "luksHeaderBackup", img, "--header-backup-file", backup])
subprocess.run(["xz", "-9", "-f", "-k", backup], check=True)
shutil.move(backup + ".xz", os.path.join(HERE, "luks2-persistent.hdr.xz"))
record({"id": "luks2-persistent-flags", "header_file": "luks2-persistent.hdr.xz", "open": ["--key-file", "<key>"],
        "mib": 4}, img, ["--key-file", KEY])

# cryptsetup's own suite images (BitLocker, FileVault2, TrueCrypt/VeraCrypt cascades).
EXP = json.load(open(os.path.join(HERE, "../peer-tests/cryptsetup/expectations.json")))
WANT = {
    "bitlk/bitlk-aes-cbc-128", "bitlk/bitlk-aes-xts-128", "bitlk/bitlk-aes-xts-128-4k",
    "bitlk/bitlk-togo-aes-xts-128", "bitlk/bitlk-aes-cbc-elephant-128", "bitlk/bitlk-aes-cbc-128-4k",
    "tcrypt/tc_3-ripemd160-xts-aes-twofish-serpent", "tcrypt/tc_3-ripemd160-xts-aes",
    "tcrypt/vc_1-sha512-xts-serpent-twofish-aes", "tcrypt/vc_1-sha512-xts-twofish-aes",
    "tcrypt/tc_3-ripemd160-lrw-aes", "tcrypt/vc_1-sha256-xts-aes-twofish",
    "tcrypt/tc_2-ripemd160-lrw-aes-hidden", "tcrypt/tc_2-ripemd160-lrw-serpent-twofish-aes-hidden",
    "tcrypt/sys_vc_1_mbr_full-sha256-xts-aes", "tcrypt/tc_2-ripemd160-lrw-aes-twofish", "fvault2/small",
}
extracted = set()
for e in EXP["entries"]:
    if e["id"] not in WANT:
        continue
    arch = os.path.join(HERE, "../peer-tests/cryptsetup", e["archive"])
    if arch not in extracted:
        with tarfile.open(arch) as t:
            t.extractall(W)
        extracted.add(arch)
    img = os.path.join(W, e["image"])
    o = e.get("options", {})
    cases = [(e["id"], e["passphrase"], o)]
    for x in e.get("extra_cases", []):
        if x.get("options", {}).get("tcrypt_hidden") and not x.get("must_reject"):
            cases.append((e["id"] + "#hidden", x["passphrase"], x["options"]))
    for ident, passphrase, o in cases:
        args = ["--type", e["format"], "--readonly"]
        if e["format"] == "tcrypt":
            if o.get("veracrypt", e.get("variant") == "veracrypt"):
                args.append("--veracrypt")
            if o.get("hash"):
                args += ["--hash", o["hash"]]
            if o.get("tcrypt_hidden"):
                args.append("--tcrypt-hidden")
            if o.get("tcrypt_system"):
                args.append("--tcrypt-system")
        stdin = passphrase.encode()
        args += ["--key-file", "-"] if e["format"] != "tcrypt" else []
        record({"id": ident, "suite": e["image"], "archive": e["archive"], "open": args, "passphrase": passphrase},
               img, args, stdin)

with open(os.path.join(HERE, "kernel-tables.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r, sort_keys=True) + "\n")
print(f"{len(rows)} rows", file=sys.stderr)
