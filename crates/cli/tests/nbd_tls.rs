//! `ucrypt open --tls=...` against libnbd's nbdcopy and nbdinfo over TCP on 127.0.0.1:
//! x509 (certificates made here with `openssl req`/`openssl x509`), client-certificate
//! verification, PSK, and `--tls=require` refusing plaintext. The bytes written over TLS are
//! checked through ucrypt's offline `read` of the table, not through the server. Missing
//! tools skip locally and fail under CI=true.

#![allow(clippy::unwrap_used)]

mod common;
use common::nbd::*;
use common::*;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn tools() -> bool {
    require("nbdcopy") && require("nbdinfo") && require("openssl")
}

/// A test CA with a server certificate (for 127.0.0.1/localhost) and a client certificate.
/// Directories laid out as nbdkit and libnbd expect them: `server/` (ca-cert.pem,
/// server-cert.pem, server-key.pem), `client/` (ca-cert.pem, client-cert.pem,
/// client-key.pem), `nocert/` (ca-cert.pem only: verifies the server, has no identity).
struct Pki {
    server: PathBuf,
    client: PathBuf,
    nocert: PathBuf,
}

fn make_pki(dir: &Path) -> Pki {
    let script = r#"
set -e
EC="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
mkdir -p server client nocert
openssl req -x509 $EC -keyout ca-key.pem -out ca-cert.pem -days 2 -subj /CN=ucrypt-test-ca
openssl req $EC -keyout server/server-key.pem -out server.csr -subj /CN=localhost
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n' > server.ext
openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out server/server-cert.pem -days 2 -extfile server.ext
openssl req $EC -keyout client/client-key.pem -out client.csr -subj /CN=ucrypt-test-client
printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n' > client.ext
openssl x509 -req -in client.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out client/client-cert.pem -days 2 -extfile client.ext
cp ca-cert.pem server/ && cp ca-cert.pem client/ && cp ca-cert.pem nocert/
"#;
    let out = sh(&format!("cd '{}' && {script}", dir.display()));
    run_ok(&out, "making test certificates");
    Pki {
        server: dir.join("server"),
        client: dir.join("client"),
        nocert: dir.join("nocert"),
    }
}

/// A PSK file (`username:hexkey`) with a fresh 256-bit key for `user`.
fn psk_file(dir: &Path, name: &str, user: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{user}:{}\n", hex::encode(random_bytes(32)))).unwrap();
    p
}

/// `nbdcopy SRC DST`, asserting success.
fn nbdcopy(src: &str, dst: &str) {
    let out = std::process::Command::new("nbdcopy")
        .args([src, dst])
        .output()
        .unwrap();
    run_ok(&out, &format!("nbdcopy {src} {dst}"));
}

/// nbdinfo's exit status and output for `uri`.
fn nbdinfo(uri: &str) -> std::process::Output {
    std::process::Command::new("nbdinfo")
        .args(["--json", uri])
        .output()
        .unwrap()
}

/// Fills the whole export (`bytes` = its size) with random data through `uri`, reads it back through `uri`, stops the server, and
/// checks both the read-back and ucrypt's offline view of the table.
fn round_trip(tmp: &Path, served: Served, uri: &str, table: &Path, bytes: usize) {
    let data = random_bytes(bytes);
    let src = tmp.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    nbdcopy(src.to_str().unwrap(), uri);
    let back = tmp.join("back.bin");
    nbdcopy(uri, back.to_str().unwrap());
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data read back over TLS differs"
    );
    assert!(served.stop().success());
    assert!(
        ucrypt_read(table) == data,
        "the plaintext on disk (ucrypt read) differs from what was written over TLS"
    );
}

#[test]
fn x509_round_trip_with_nbdcopy_over_tcp() {
    if !tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = make_pki(tmp.path());
    let img = image(tmp.path(), "disk.img", 16 * MIB);
    let (_, t) = xts_table(tmp.path(), &img, 4096, &[]);
    let server = pki.server.to_str().unwrap();
    let served = Served::start(
        &t,
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls=on",
            "--tls-certificates",
            server,
            // --tls=on still serves plaintext clients: the cleartext guard wants the flag.
            "--allow-cleartext-tcp",
        ],
    );
    assert!(
        served.uri.starts_with("nbds://127.0.0.1:"),
        "{}",
        served.uri
    );
    let uri = format!("{}?tls-certificates={}", served.uri, pki.nocert.display());
    let out = nbdinfo(&uri);
    run_ok(&out, "nbdinfo over TLS");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["TLS"], true, "{v}");
    round_trip(tmp.path(), served, &uri, &t, 16 * MIB as usize);
}

#[test]
fn psk_round_trip_with_nbdcopy() {
    if !tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let keys = psk_file(tmp.path(), "keys.psk", "alice");
    let img = image(tmp.path(), "disk.img", 8 * MIB);
    let (_, t) = xts_table(tmp.path(), &img, 512, &[]);
    let served = Served::start(
        &t,
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls=require",
            "--tls-psk",
            keys.to_str().unwrap(),
        ],
    );
    let hostport = served.uri.strip_prefix("nbds://").unwrap().to_string();
    // libnbd takes the PSK username from the URI's user part.
    let uri = format!("nbds://alice@{hostport}?tls-psk-file={}", keys.display());

    // The right username with another key is refused.
    let wrong = psk_file(tmp.path(), "wrong.psk", "alice");
    let bad = format!("nbds://alice@{hostport}?tls-psk-file={}", wrong.display());
    assert!(!nbdinfo(&bad).status.success(), "a wrong PSK was accepted");

    round_trip(tmp.path(), served, &uri, &t, 8 * MIB as usize);
}

#[test]
fn tls_require_refuses_plaintext_clients_and_serves_tls_ones() {
    if !tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = make_pki(tmp.path());
    let img = image(tmp.path(), "disk.img", 4 * MIB);
    let (_, t) = xts_table(tmp.path(), &img, 4096, &[]);
    let served = Served::start(
        &t,
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls=require",
            "--tls-certificates",
            pki.server.to_str().unwrap(),
        ],
    );
    let plain = served.uri.replacen("nbds://", "nbd://", 1);
    let out = nbdinfo(&plain);
    assert!(
        !out.status.success(),
        "a plaintext client was served under --tls=require: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let uri = format!("{}?tls-certificates={}", served.uri, pki.nocert.display());
    let out = nbdinfo(&uri);
    run_ok(&out, "nbdinfo over TLS");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["TLS"], true);
    assert_eq!(v["exports"][0]["export-size"], 4 * MIB);
    round_trip(tmp.path(), served, &uri, &t, 4 * MIB as usize);
}

#[test]
fn verify_peer_refuses_a_client_without_a_certificate() {
    if !tools() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = make_pki(tmp.path());
    let img = image(tmp.path(), "disk.img", 4 * MIB);
    let (_, t) = xts_table(tmp.path(), &img, 4096, &[]);
    let served = Served::start(
        &t,
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls=require",
            "--tls-certificates",
            pki.server.to_str().unwrap(),
            "--tls-verify-peer",
        ],
    );
    let anonymous = format!("{}?tls-certificates={}", served.uri, pki.nocert.display());
    let out = nbdinfo(&anonymous);
    assert!(
        !out.status.success(),
        "a client without a certificate was served under --tls-verify-peer"
    );
    let uri = format!("{}?tls-certificates={}", served.uri, pki.client.display());
    round_trip(tmp.path(), served, &uri, &t, 4 * MIB as usize);
}

#[test]
fn tls_options_without_credentials_are_refused_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image(tmp.path(), "disk.img", MIB);
    let (_, t) = xts_table(tmp.path(), &img, 512, &[]);
    let t = t.to_str().unwrap();
    let out = ucrypt(&["open", "--table-file", t, "--tls=require"], b"");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-certificates"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let missing = tmp.path().join("nothing-here");
    let out = ucrypt(
        &[
            "open",
            "--table-file",
            t,
            "--tls=on",
            "--tls-certificates",
            missing.to_str().unwrap(),
        ],
        b"",
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("server-cert.pem"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// nbdkit serving `img` with `--tls=require` and `tls_args`, stopped on drop.
struct TlsNbdkit(std::process::Child);

impl TlsNbdkit {
    /// Starts nbdkit on `listen` (`-U SOCKET` or `-i 127.0.0.1 -p PORT`); waits until it
    /// accepts connections.
    fn start(listen: &[&str], tls_args: &[String], img: &Path, probe: &dyn Fn() -> bool) -> Self {
        let child = std::process::Command::new("nbdkit")
            .args(["-f", "--exit-with-parent", "--tls=require"])
            .args(listen)
            .args(tls_args)
            .arg("file")
            .arg(img)
            .spawn()
            .unwrap();
        let up = (0..250).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            probe()
        });
        assert!(up, "nbdkit did not start");
        TlsNbdkit(child)
    }
}

impl Drop for TlsNbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A table line whose device is `uri`, with a fresh key; and the same key over the local
/// `img` (to check the ciphertext nbdkit stored).
fn tables(dir: &Path, img: &Path, uri: &str, name: &str) -> (PathBuf, PathBuf) {
    let (line, local) = xts_table(dir, img, 4096, &[]);
    let remote = dir.join(format!("{name}.table"));
    std::fs::write(&remote, line.replace(img.to_str().unwrap(), uri)).unwrap();
    (remote, local)
}

/// `nbds://` and `nbds+unix://` devices against nbdkit `--tls=require` (GnuTLS): x509
/// over TCP with the server's name checked, and PSK over a unix socket; what ucrypt
/// writes through TLS decrypts from the file nbdkit stored, plaintext and wrong
/// credentials are refused, and a LUKS header command works through TLS too.
#[test]
fn remote_devices_over_tls_to_nbdkit_with_x509_and_psk() {
    if !require("nbdkit") || !require("openssl") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let pki = make_pki(d);
    let data = random_bytes(2 * MIB as usize);
    let write = |table: &Path| ucrypt(&["write", "--table-file", table.to_str().unwrap()], &data);

    // x509 over TCP: the server certificate is for 127.0.0.1, signed by the test CA.
    let img = image(d, "x509.img", 4 * MIB);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let _srv = TlsNbdkit::start(
        &["-i", "127.0.0.1", "-p", &port.to_string()],
        &[format!("--tls-certificates={}", pki.server.display())],
        &img,
        &|| std::net::TcpStream::connect(&addr).is_ok(),
    );
    let uri = format!("nbds://{addr}/?tls-certificates={}", pki.client.display());
    let (remote, local) = tables(d, &img, &uri, "x509");
    ok(write(&remote));
    assert!(
        ucrypt_read(&remote)[..data.len()] == data[..],
        "read back over TLS"
    );
    assert!(
        ucrypt_read(&local)[..data.len()] == data[..],
        "nbdkit's file decrypts"
    );
    // Plaintext to a --tls=require server, and a server certificate checked against the
    // system CAs (a directory without ca-cert.pem), are refused; verify-peer=false is not.
    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (bad, why) in [
        (format!("nbd://{addr}/"), "plaintext"),
        (
            format!("nbds://{addr}/?tls-certificates={}", empty.display()),
            "unknown CA",
        ),
    ] {
        let (t, _) = tables(d, &img, &bad, "bad");
        let out = write(&t);
        assert!(!out.status.success(), "{why} accepted");
    }
    let lax = format!(
        "nbds://{addr}/?tls-certificates={}&tls-verify-peer=false",
        empty.display()
    );
    let (t, _) = tables(d, &img, &lax, "lax");
    ok(write(&t));

    // PSK over a unix socket.
    let img = image(d, "psk.img", 4 * MIB);
    let psk = psk_file(d, "keys.psk", "alice");
    let sock = d.join("psk.sock");
    let _srv = TlsNbdkit::start(
        &["-U", sock.to_str().unwrap()],
        &[format!("--tls-psk={}", psk.display())],
        &img,
        &|| std::os::unix::net::UnixStream::connect(&sock).is_ok(),
    );
    let uri = |user: &str, file: &Path| {
        format!(
            "nbds+unix:///?socket={}&tls-psk-file={}&tls-username={user}",
            sock.display(),
            file.display()
        )
    };
    let (remote, local) = tables(d, &img, &uri("alice", &psk), "psk");
    ok(write(&remote));
    assert!(
        ucrypt_read(&local)[..data.len()] == data[..],
        "nbdkit's file decrypts (PSK)"
    );
    // Another key for alice: the handshake fails; an unknown username fails before it.
    let other = psk_file(d, "other.psk", "alice");
    for (u, f) in [("alice", &other), ("mallory", &psk)] {
        let (t, _) = tables(d, &img, &uri(u, f), "badpsk");
        let out = write(&t);
        assert!(!out.status.success(), "{u} with {} accepted", f.display());
        assert!(!String::from_utf8_lossy(&out.stderr)
            .contains(&std::fs::read_to_string(f).unwrap()[6..]));
    }
    // A header command through TLS: luksFormat on the nbds+unix device, then isLuks.
    if require("cryptsetup") {
        let pass = d.join("pass");
        std::fs::write(&pass, "tls-pass").unwrap();
        let u = uri("alice", &psk);
        ok(ucrypt(
            &[
                "luksFormat",
                "-q",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                pass.to_str().unwrap(),
                &u,
            ],
            b"",
        ));
        let st = std::process::Command::new("cryptsetup")
            .args(["isLuks", img.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(
            st.success(),
            "cryptsetup does not see the header written over TLS"
        );
        ok(ucrypt(&["isLuks", &u], b""));
    }
}
