//! LUKS2 tokens enrolled by the tools users have, opened by ucrypt: `clevis luks bind` with
//! a tang server on a loopback port (tangd behind socat), `systemd-cryptenroll` recovery
//! keys and PKCS#11 (SoftHSM2, with a key and certificate written by pkcs11-tool), FIDO2
//! and TPM2 tokens on a machine with neither (they must be passed over), and `token
//! export`/`import` of all of them byte for byte against cryptsetup's. Each volume key a
//! token gives is compared with the one cryptsetup dumps with the passphrase.
//!
//! Every enrolment is done by the real peer on an image ucrypt formatted; the TPM2 pins
//! (systemd-tpm2 with a TPM, clevis tpm2) run in the kernel lab (`tests/lab/tokens.sh`).

#![allow(clippy::unwrap_used)]

mod common;

use common::cmd::{piped, s};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PASS: &str = "correct horse battery";

/// A LUKS2 image formatted by ucrypt (fast PBKDF2 keyslot), its passphrase in `pass`.
struct Vol {
    _dir: tempfile::TempDir,
    img: PathBuf,
    pass: PathBuf,
}

impl Vol {
    fn new() -> Vol {
        let dir = tempfile::tempdir().unwrap();
        let img = common::image(dir.path(), "vol.img", 32 << 20);
        let pass = dir.path().join("pass");
        std::fs::write(&pass, PASS).unwrap();
        common::ok(common::ucrypt(
            &[
                "luksFormat",
                "-q",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                s(&pass),
                s(&img),
            ],
            b"",
        ));
        Vol {
            _dir: dir,
            img,
            pass,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.img.parent().unwrap().join(name)
    }

    /// The volume key as cryptsetup dumps it with the passphrase (lowercase hex).
    fn cryptsetup_key(&self) -> String {
        let out = common::cmd::ok(
            "cryptsetup",
            &[
                "luksDump",
                "--dump-volume-key",
                "-q",
                "--key-file",
                s(&self.pass),
                s(&self.img),
            ],
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let dump = text.split("MK dump:").nth(1).expect("an MK dump");
        dump.split_whitespace()
            .take_while(|w| w.len() == 2 && w.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect()
    }

    /// The tokens in the header: (id, type).
    fn tokens(&self) -> Vec<(u32, String)> {
        let out = common::cmd::ok(
            "cryptsetup",
            &["luksDump", "--dump-json-metadata", s(&self.img)],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut t: Vec<(u32, String)> = v["tokens"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, t)| (k.parse().unwrap(), t["type"].as_str().unwrap().to_string()))
            .collect();
        t.sort();
        t
    }

    fn token_id(&self, kind: &str) -> u32 {
        self.tokens()
            .into_iter()
            .find(|(_, k)| k == kind)
            .unwrap_or_else(|| panic!("no {kind} token in {:?}", self.tokens()))
            .0
    }
}

/// ucrypt with `args` and `stdin`, extra environment `env`.
fn uc(args: &[&str], stdin: &[u8], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    common::ucrypt_env(args, stdin, env)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The volume key of the table `luksOpen --print-table --showkeys` prints (the fifth field).
fn table_key(out: &Output) -> String {
    assert!(
        out.status.success(),
        "luksOpen --print-table failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
        .split_whitespace()
        .nth(4)
        .unwrap()
        .to_string()
}

/// `luksOpen --print-table --showkeys` of `img` with `extra` options.
fn print_table(
    img: &Path,
    extra: &[&str],
    stdin: &[u8],
    env: &[(&str, &std::ffi::OsStr)],
) -> Output {
    let mut args = vec!["luksOpen", "--print-table", "--showkeys"];
    args.extend_from_slice(extra);
    args.push(s(img));
    uc(&args, stdin, env)
}

/// A tang server on a free loopback port: `tangd` run by socat per connection.
struct Tang {
    child: std::process::Child,
    url: String,
    _keys: tempfile::TempDir,
}

impl Tang {
    fn start() -> Tang {
        let keys = tempfile::tempdir().unwrap();
        common::cmd::ok("/usr/libexec/tangd-keygen", &[s(keys.path())]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!("EXEC:/usr/libexec/tangd {}", s(keys.path())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "tang did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Tang {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _keys: keys,
        }
    }
}

impl Drop for Tang {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have_tang() -> bool {
    common::require("clevis")
        && common::require("socat")
        && common::require("cryptsetup")
        && common::require_that(
            Path::new("/usr/libexec/tangd").exists(),
            "tangd not found (Debian: tang; run scripts/setup.sh)",
        )
}

/// `clevis luks bind` of `vol` to `tang` (the existing passphrase on stdin).
fn bind_tang(vol: &Vol, tang: &Tang) {
    let cfg = format!("{{\"url\":\"{}\"}}", tang.url);
    let out = piped(
        Command::new("clevis").args([
            "luks",
            "bind",
            "-y",
            "-k",
            "-",
            "-d",
            s(&vol.img),
            "tang",
            &cfg,
        ]),
        PASS.as_bytes(),
    );
    assert!(
        out.status.success(),
        "clevis luks bind: {}",
        text(&out.stderr)
    );
}

#[test]
fn clevis_tang_token_opens_and_falls_through_when_tang_is_gone() {
    if !have_tang() {
        return;
    }
    let vol = Vol::new();
    let tang = Tang::start();
    bind_tang(&vol, &tang);
    let id = vol.token_id("clevis");
    let want = vol.cryptsetup_key();

    // The token alone gives the volume key cryptsetup dumps with the passphrase.
    let out = print_table(&vol.img, &["--token-only", "-v"], b"", &[]);
    assert_eq!(table_key(&out), want);
    assert!(
        text(&out.stderr).contains(&format!("Token {id} (clevis) unlocked")),
        "{}",
        text(&out.stderr)
    );
    // clevis itself agrees on the passphrase: its keyslot opens with `clevis luks pass`.
    let slot = {
        let json = common::cmd::ok(
            "cryptsetup",
            &[
                "token",
                "export",
                "--token-id",
                &id.to_string(),
                s(&vol.img),
            ],
        );
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        v["keyslots"][0].as_str().unwrap().to_string()
    };
    let pass = common::cmd::ok("clevis", &["luks", "pass", "-d", s(&vol.img), "-s", &slot]).stdout;
    let by_pass = print_table(&vol.img, &["--key-file", "-", "-S", &slot], &pass, &[]);
    assert_eq!(table_key(&by_pass), want);
    // --token-type and --token-id select it; another type finds nothing.
    for sel in [["--token-type", "clevis"], ["--token-id", &id.to_string()]] {
        let out = uc(
            &[
                "open",
                "--test-passphrase",
                "--token-only",
                sel[0],
                sel[1],
                s(&vol.img),
            ],
            b"",
            &[],
        );
        assert!(out.status.success(), "{sel:?}: {}", text(&out.stderr));
    }
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--token-only",
            "--token-type",
            "luks2-keyring",
            "-v",
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    // Without clevis on PATH: passed over with one line, the passphrase still opens.
    let no_clevis = std::ffi::OsString::from("/nonexistent");
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "-v",
            "--key-file",
            s(&vol.pass),
            s(&vol.img),
        ],
        b"",
        &[("PATH", &no_clevis)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("Token {id} (clevis): clevis is not installed")),
        "{}",
        text(&out.stderr)
    );
    // --disable-external-tokens: clevis is not tried either.
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--token-only",
            "-v",
            "--disable-external-tokens",
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--disable-external-tokens"),
        "{}",
        text(&out.stderr)
    );

    // tang gone: one line for the token, then the passphrase; --token-only fails as
    // cryptsetup fails when no token is usable (exit 1).
    drop(tang);
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "-v",
            "--key-file",
            s(&vol.pass),
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with(&format!("Token {id} (clevis)")))
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("clevis decrypt failed"), "{err}");
    let out = uc(
        &["open", "--test-passphrase", "--token-only", s(&vol.img)],
        b"",
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // --token-timeout: tried again until the time is up, then the same failure.
    let t0 = Instant::now();
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--token-only",
            "--token-timeout",
            "2",
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
fn clevis_token_comes_back_when_tang_starts_within_the_token_timeout() {
    if !have_tang() {
        return;
    }
    let vol = Vol::new();
    let tang = Tang::start();
    bind_tang(&vol, &tang);
    let want = vol.cryptsetup_key();
    // The same keys on another port later: rebinding is not needed, tang's URL is in the
    // JWE, so the server is stopped and started again on its port.
    let url = tang.url.clone();
    let port = url.rsplit(':').next().unwrap().to_string();
    let keys = tang._keys.path().to_path_buf();
    let mut tang = tang;
    let _ = tang.child.kill();
    let _ = tang.child.wait();
    let restart = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!("EXEC:/usr/libexec/tangd {}", keys.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    });
    let out = print_table(
        &vol.img,
        &["--token-only", "--token-timeout", "20"],
        b"",
        &[],
    );
    let mut later = restart.join().unwrap();
    let _ = later.kill();
    let _ = later.wait();
    assert_eq!(table_key(&out), want);
    drop(tang);
}

#[test]
fn clevis_bind_on_an_image_in_use_by_ucrypt() {
    if !have_tang() {
        return;
    }
    let vol = Vol::new();
    let tang = Tang::start();
    let run = vol.path("run");
    let env = [("UCRYPT_RUNTIME_DIR", run.as_os_str())];
    let out = uc(
        &[
            "open",
            s(&vol.img),
            "inuse",
            "--device",
            "none",
            "--key-file",
            s(&vol.pass),
        ],
        b"",
        &env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // clevis (through cryptsetup) changes the header of the image ucrypt serves.
    bind_tang(&vol, &tang);
    let out = uc(&["close", "inuse"], b"", &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = uc(
        &[
            "open",
            s(&vol.img),
            "inuse",
            "--device",
            "none",
            "--token-only",
        ],
        b"",
        &env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = uc(&["close", "inuse"], b"", &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn systemd_recovery_key_is_a_passphrase_and_its_token_is_passed_over() {
    if !common::require("systemd-cryptenroll") || !common::require("cryptsetup") {
        return;
    }
    let vol = Vol::new();
    let out = Command::new("systemd-cryptenroll")
        .args(["--recovery-key", s(&vol.img)])
        .env("PASSWORD", PASS)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "systemd-cryptenroll: {}",
        text(&out.stderr)
    );
    let key = text(&out.stdout).trim().to_string();
    assert_eq!(key.len(), 71, "{key}");
    let id = vol.token_id("systemd-recovery");
    let out = print_table(&vol.img, &["--key-file", "-"], key.as_bytes(), &[]);
    assert_eq!(table_key(&out), vol.cryptsetup_key());
    // --token-only: the recovery token holds no secret; one line says so, exit 1 as
    // cryptsetup's.
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--token-only",
            "-v",
            s(&vol.img),
        ],
        b"",
        &[],
    );
    let cs = common::cmd::run(
        "cryptsetup",
        &["open", "--test-passphrase", "--token-only", s(&vol.img)],
    );
    assert_eq!(out.status.code(), cs.status.code(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("Token {id} (systemd-recovery): holds no secret")),
        "{}",
        text(&out.stderr)
    );
}

/// A SoftHSM2 token with an RSA key and its certificate (what systemd-cryptenroll
/// --pkcs11-token-uri needs), in a private token directory.
struct Hsm {
    dir: tempfile::TempDir,
    conf: PathBuf,
}

const HSM_PIN: &str = "1234";

impl Hsm {
    /// Whether the tools a SoftHSM2 token and its enrolment need are here (a message
    /// names what is missing; under CI a missing tool fails the test).
    fn available() -> bool {
        common::require("systemd-cryptenroll")
            && common::require("softhsm2-util")
            && common::require("pkcs11-tool")
            && common::require("openssl")
            && common::require("cryptsetup")
            && common::require_that(
                Path::new(SOFTHSM).exists(),
                "SoftHSM2 module missing (Debian: softhsm2)",
            )
    }

    /// Enrols this token into VOL's LUKS2 header with systemd-cryptenroll, as a user would.
    fn enroll(&self, vol: &Vol) {
        let out = self
            .cmd("systemd-cryptenroll")
            .args(["--pkcs11-token-uri=pkcs11:token=ucrypt-test", s(&vol.img)])
            .env("PASSWORD", PASS)
            .env("PIN", HSM_PIN)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "systemd-cryptenroll: {}",
            text(&out.stderr)
        );
    }

    fn new() -> Hsm {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        std::fs::create_dir(d.join("tokens")).unwrap();
        let conf = d.join("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                d.join("tokens").display()
            ),
        )
        .unwrap();
        let hsm = Hsm { dir, conf };
        hsm.ok(
            "softhsm2-util",
            &[
                "--init-token",
                "--free",
                "--label",
                "ucrypt-test",
                "--pin",
                HSM_PIN,
                "--so-pin",
                "5678",
            ],
        );
        let p = |n: &str| d.join(n).display().to_string();
        hsm.ok(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &p("key.pem"),
                "-out",
                &p("cert.pem"),
                "-subj",
                "/CN=ucrypt-test",
                "-days",
                "3650",
            ],
        );
        hsm.ok(
            "openssl",
            &[
                "pkcs8",
                "-topk8",
                "-nocrypt",
                "-in",
                &p("key.pem"),
                "-outform",
                "DER",
                "-out",
                &p("key.der"),
            ],
        );
        hsm.ok(
            "openssl",
            &[
                "x509",
                "-in",
                &p("cert.pem"),
                "-outform",
                "DER",
                "-out",
                &p("cert.der"),
            ],
        );
        for (file, kind) in [("key.der", "privkey"), ("cert.der", "cert")] {
            hsm.ok(
                "pkcs11-tool",
                &[
                    "--module",
                    SOFTHSM,
                    "--token-label",
                    "ucrypt-test",
                    "--login",
                    "--pin",
                    HSM_PIN,
                    "--write-object",
                    &p(file),
                    "--type",
                    kind,
                    "--id",
                    "01",
                    "--label",
                    "ucrypt",
                ],
            );
        }
        hsm
    }

    fn env(&self) -> [(&'static str, &std::ffi::OsStr); 1] {
        [("SOFTHSM2_CONF", self.conf.as_os_str())]
    }

    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.env("SOFTHSM2_CONF", &self.conf)
            .current_dir(self.dir.path());
        c
    }

    fn ok(&self, prog: &str, args: &[&str]) -> Output {
        let out = self
            .cmd(prog)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{prog} {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        out
    }
}

const SOFTHSM: &str = "/usr/lib/softhsm/libsofthsm2.so";

#[test]
fn pkcs11_token_from_systemd_cryptenroll_with_softhsm() {
    if !Hsm::available() {
        return;
    }
    let hsm = Hsm::new();
    let vol = Vol::new();
    hsm.enroll(&vol);
    let id = vol.token_id("systemd-pkcs11");
    let want = vol.cryptsetup_key();
    let env = hsm.env();

    // The PIN asked for (here one line of standard input, as cryptsetup reads it).
    let pin = format!("{HSM_PIN}\n");
    let out = print_table(&vol.img, &["--token-only"], pin.as_bytes(), &env);
    assert_eq!(table_key(&out), want);
    let out = print_table(
        &vol.img,
        &["--token-type", "systemd-pkcs11"],
        pin.as_bytes(),
        &env,
    );
    assert_eq!(table_key(&out), want);
    // The PIN from the key file under --token-only.
    let pin_file = vol.path("pin");
    std::fs::write(&pin_file, &pin).unwrap();
    let out = print_table(
        &vol.img,
        &["--token-only", "--key-file", s(&pin_file)],
        b"",
        &env,
    );
    assert_eq!(table_key(&out), want);

    // A wrong PIN, and no PIN at all: exit codes as cryptsetup's.
    for (stdin, what) in [(&b"9999\n"[..], "wrong PIN"), (&b""[..], "no PIN")] {
        let args = [
            "open",
            "--test-passphrase",
            "--token-only",
            "--token-id",
            &id.to_string(),
            s(&vol.img),
        ];
        let ours = uc(&args, stdin, &env);
        let theirs = piped(hsm.cmd("cryptsetup").args(args), stdin);
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{what}: {}",
            text(&ours.stderr)
        );
        assert!(!ours.status.success(), "{what}");
    }
    // After the failures the right PIN still opens it.
    let out = print_table(&vol.img, &["--token-only"], pin.as_bytes(), &env);
    assert_eq!(table_key(&out), want);

    // No token named: the token that needs a PIN is passed over (one line) for the passphrase.
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "-v",
            "--key-file",
            s(&vol.pass),
            s(&vol.img),
        ],
        b"",
        &env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("Token {id} (systemd-pkcs11): needs a PIN")),
        "{}",
        text(&out.stderr)
    );
}

/// A `systemd-fido2` token as systemd-cryptenroll writes it (the credential of a key that
/// is not here) and a `systemd-tpm2` one (sealed for a TPM that is not here), on a keyslot
/// with a passphrase of their own.
fn absent_device_tokens(vol: &Vol) -> (u32, u32) {
    let key2 = vol.path("key2");
    std::fs::write(&key2, "second").unwrap();
    common::cmd::ok(
        "cryptsetup",
        &[
            "luksAddKey",
            "-q",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            s(&vol.pass),
            s(&vol.img),
            s(&key2),
        ],
    );
    let b64 = "6n4XgFbEyz4FA2FvfVxKgBJgHiBj26DpSP5yVWBVyiE=";
    let hex = "e87d7b24cf657e5b97934f589344dc9b768a6fe8837473bd548be61715eb354c";
    let fido2 = format!(
        r#"{{"type":"systemd-fido2","keyslots":["1"],"fido2-credential":"{b64}","fido2-salt":"{b64}","fido2-rp":"io.systemd.cryptsetup","fido2-clientPin-required":false,"fido2-up-required":true,"fido2-uv-required":false}}"#
    );
    let tpm2 = format!(
        r#"{{"type":"systemd-tpm2","keyslots":["1"],"tpm2-blob":"{b64}","tpm2-pcrs":[7],"tpm2-pcr-bank":"sha256","tpm2-primary-alg":"ecc","tpm2-policy-hash":"{hex}","tpm2-pin":false}}"#
    );
    for json in [&fido2, &tpm2] {
        let out = piped(
            Command::new("cryptsetup").args(["token", "import", s(&vol.img)]),
            json.as_bytes(),
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    (vol.token_id("systemd-fido2"), vol.token_id("systemd-tpm2"))
}

#[test]
fn fido2_and_tpm2_tokens_without_their_device_fall_through() {
    if !common::require("cryptsetup")
        || !common::require_that(
            Path::new("/usr/lib/x86_64-linux-gnu/cryptsetup/libcryptsetup-token-systemd-fido2.so")
                .exists(),
            "systemd's libcryptsetup token plugins are missing (Debian: systemd)",
        )
    {
        return;
    }
    // The host has neither a FIDO2 key nor a TPM: check, or the test says nothing.
    let fido2 = common::cmd::run("systemd-cryptenroll", &["--fido2-device=list"]);
    if !common::require_that(
        fido2.stdout.is_empty() && Path::new("/dev/tpmrm0").metadata().is_err(),
        "a FIDO2 key or a TPM is present here; this test needs a machine without",
    ) {
        return;
    }
    let vol = Vol::new();
    let (f, t) = absent_device_tokens(&vol);
    // Falls through to the passphrase, one line each.
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "-v",
            "--key-file",
            s(&vol.pass),
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "Token {f} (systemd-fido2): no FIDO2 security key found."
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("Token {t} (systemd-tpm2): no TPM2 device found.")),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.starts_with("Token ")).count(),
        2,
        "{err}"
    );
    // Without -v: nothing about tokens.
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--key-file",
            s(&vol.pass),
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert!(out.status.success());
    assert!(
        !text(&out.stderr).contains("Token "),
        "{}",
        text(&out.stderr)
    );
    // --token-only: exit codes as cryptsetup's, for all tokens and each one.
    for extra in [
        vec![],
        vec!["--token-id".to_string(), f.to_string()],
        vec!["--token-type".into(), "systemd-tpm2".into()],
    ] {
        let mut args = vec!["open", "--test-passphrase", "--token-only"];
        args.extend(extra.iter().map(String::as_str));
        args.push(s(&vol.img));
        let ours = uc(&args, b"", &[]);
        let theirs = common::cmd::run("cryptsetup", &args);
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{args:?}: {}",
            text(&ours.stderr)
        );
    }
    // --token-timeout: a missing device is waited for, then the same failure.
    let t0 = Instant::now();
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--token-only",
            "--token-timeout",
            "2",
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    // --disable-external-tokens: no plugin is loaded; the tokens are unusable.
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--token-only",
            "-v",
            "--disable-external-tokens",
            s(&vol.img),
        ],
        b"",
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not usable here"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn token_export_and_import_round_trip_byte_for_byte() {
    if !have_tang() || !common::require("systemd-cryptenroll") {
        return;
    }
    let vol = Vol::new();
    let tang = Tang::start();
    bind_tang(&vol, &tang);
    let out = Command::new("systemd-cryptenroll")
        .args(["--recovery-key", s(&vol.img)])
        .env("PASSWORD", PASS)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    absent_device_tokens(&vol);
    let tokens = vol.tokens();
    assert_eq!(tokens.len(), 4, "{tokens:?}");
    for (id, kind) in tokens {
        let id_s = id.to_string();
        let theirs = common::cmd::ok(
            "cryptsetup",
            &["token", "export", "--token-id", &id_s, s(&vol.img)],
        )
        .stdout;
        let ours = common::ok(uc(
            &["token", "export", "--token-id", &id_s, s(&vol.img)],
            b"",
            &[],
        ));
        assert_eq!(ours, theirs, "token {id} ({kind}) exported");
        // Removed by cryptsetup, imported back by ucrypt at the same id: cryptsetup
        // exports the same bytes, and the token is assigned as before.
        let file = vol.path(&format!("token{id}.json"));
        common::ok(uc(
            &[
                "token",
                "export",
                "--token-id",
                &id_s,
                "--json-file",
                s(&file),
                s(&vol.img),
            ],
            b"",
            &[],
        ));
        assert_eq!(
            std::fs::read(&file).unwrap(),
            theirs,
            "token {id} ({kind}) --json-file"
        );
        common::cmd::ok(
            "cryptsetup",
            &["token", "remove", "--token-id", &id_s, s(&vol.img)],
        );
        common::ok(uc(
            &[
                "token",
                "import",
                "--token-id",
                &id_s,
                "--json-file",
                s(&file),
                s(&vol.img),
            ],
            b"",
            &[],
        ));
        let again = common::cmd::ok(
            "cryptsetup",
            &["token", "export", "--token-id", &id_s, s(&vol.img)],
        )
        .stdout;
        assert_eq!(again, theirs, "token {id} ({kind}) imported");
    }
    // The clevis token imported by ucrypt still opens the volume.
    let out = print_table(
        &vol.img,
        &["--token-only", "--token-type", "clevis"],
        b"",
        &[],
    );
    assert_eq!(table_key(&out), vol.cryptsetup_key());
    drop(tang);
}

#[test]
fn crypttab_line_with_no_key_opens_by_clevis_token() {
    if !have_tang() {
        return;
    }
    let vol = Vol::new();
    let tang = Tang::start();
    bind_tang(&vol, &tang);
    let run = vol.path("run");
    let env = [("UCRYPT_RUNTIME_DIR", run.as_os_str())];
    // headless: never a passphrase prompt, so only the token can open it.
    let tab = vol.path("crypttab");
    std::fs::write(
        &tab,
        format!(
            "tv {} none luks,headless,x-ucrypt-device=none\n",
            s(&vol.img)
        ),
    )
    .unwrap();
    let out = uc(&["crypttab", "open", "--file", s(&tab), "tv"], b"", &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status = uc(&["status", "tv", "--json"], b"", &env);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let out = uc(&["crypttab", "close", "--file", s(&tab), "tv"], b"", &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // tang gone: the headless line fails (no passphrase to fall back to), nothing is left.
    drop(tang);
    let out = uc(&["crypttab", "open", "--file", s(&tab), "tv"], b"", &env);
    assert!(!out.status.success());
    let status = uc(&["status", "tv"], b"", &env);
    assert_eq!(status.status.code(), Some(4), "{}", text(&status.stderr));
}

/// `status NAME --json` of the instance under `env`.
fn status(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> serde_json::Value {
    let out = uc(&["status", name, "--json"], b"", env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn clevis_token_resumes_resizes_and_refreshes_a_running_instance() {
    if !have_tang() {
        return;
    }
    let vol = Vol::new();
    let tang = Tang::start();
    bind_tang(&vol, &tang);
    let id = vol.token_id("clevis");
    let run = vol.path("run");
    let env = [("UCRYPT_RUNTIME_DIR", run.as_os_str())];
    let ok = |args: &[&str]| {
        let out = uc(args, b"", &env);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stderr)
    };
    ok(&[
        "open",
        s(&vol.img),
        "tk",
        "--device",
        "none",
        "--key-file",
        s(&vol.pass),
    ]);
    let full = status("tk", &env)["size_sectors"].as_u64().unwrap();

    // No passphrase anywhere: the clevis token (tang) gives the key the server checks.
    ok(&["luksSuspend", "tk"]);
    assert_eq!(status("tk", &env)["suspended"], true);
    let err = ok(&["luksResume", "tk", "--token-only", "-v"]);
    assert!(
        err.contains(&format!("Token {id} (clevis) unlocked")),
        "{err}"
    );
    assert_eq!(status("tk", &env)["suspended"], false);
    ok(&["resize", "tk", "--size", "2048", "--token-only"]);
    assert_eq!(status("tk", &env)["size_sectors"], 2048);
    ok(&["resize", "tk", "--token-type", "clevis", "--token-only"]);
    assert_eq!(status("tk", &env)["size_sectors"].as_u64(), Some(full));
    ok(&[
        "refresh",
        "tk",
        "--allow-discards",
        "--token-id",
        &id.to_string(),
        "--token-only",
    ]);
    assert_eq!(status("tk", &env)["allow_discards"], true);

    // A token of another type or id: nothing unlocks, nothing asked, still suspended.
    ok(&["luksSuspend", "tk"]);
    let out = uc(
        &[
            "luksResume",
            "tk",
            "--token-only",
            "--token-type",
            "systemd-tpm2",
        ],
        b"",
        &env,
    );
    assert!(!out.status.success(), "resumed by a token of no such type");
    assert_eq!(status("tk", &env)["suspended"], true);

    // tang gone: --token-only fails and the volume stays suspended; without it the token
    // is passed over and the key file opens.
    drop(tang);
    let out = uc(&["luksResume", "tk", "--token-only"], b"", &env);
    assert!(!out.status.success(), "resumed with tang gone");
    assert_eq!(status("tk", &env)["suspended"], true);
    ok(&["luksResume", "tk", "--key-file", s(&vol.pass)]);
    assert_eq!(status("tk", &env)["suspended"], false);
    ok(&["close", "tk"]);
}

/// How many times systemd's PKCS#11 plugin logged into the token (it says so on stderr
/// once per call that reaches the card).
fn logins(out: &Output) -> usize {
    text(&out.stderr)
        .matches("Successfully logged into security token")
        .count()
}

/// The plaintext of `img` through the table line `table` (one line, key shown).
fn plaintext(table: &str, len: usize) -> Vec<u8> {
    let out = common::ucrypt(
        &[
            "read",
            "--table",
            table.trim(),
            "--length",
            &len.to_string(),
        ],
        b"",
    );
    assert!(out.status.success(), "read: {}", text(&out.stderr));
    out.stdout
}

#[test]
fn pkcs11_token_reencrypts_with_one_login_per_unlock() {
    if !Hsm::available() {
        return;
    }
    let hsm = Hsm::new();
    let vol = Vol::new();
    hsm.enroll(&vol);
    let id = vol.token_id("systemd-pkcs11");
    let env = hsm.env();
    let pin = format!("{HSM_PIN}\n");
    let pin_file = vol.path("pin");
    std::fs::write(&pin_file, &pin).unwrap();

    // One unlock, one login: libcryptsetup 2.6's keyslot-context path logs in twice
    // (once for the passphrase it then drops, once for the key); cryptsetup's own
    // activation logs in once.
    let args = ["open", "--test-passphrase", "--token-only", s(&vol.img)];
    let ours = uc(&args, pin.as_bytes(), &env);
    assert!(ours.status.success(), "{}", text(&ours.stderr));
    let theirs = piped(hsm.cmd("cryptsetup").args(args), pin.as_bytes());
    assert!(theirs.status.success(), "{}", text(&theirs.stderr));
    assert_eq!((logins(&ours), logins(&theirs)), (1, 1));
    let out = print_table(&vol.img, &["--token-only"], pin.as_bytes(), &env);
    assert_eq!(logins(&out), 1, "{}", text(&out.stderr));
    let before = text(&out.stdout);

    // Some data, to be found again after the re-key.
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let w = common::ucrypt(&["write", "--table", before.trim()], &data);
    assert!(w.status.success(), "write: {}", text(&w.stderr));

    // The volume has two keyslots (the passphrase's and the token's): the token's is
    // kept; its passphrase comes from the token, the PIN from the key file.
    let out = uc(
        &[
            "reencrypt",
            "-q",
            "-v",
            "--token-only",
            "--key-slot",
            "1",
            "--key-file",
            s(&pin_file),
            s(&vol.img),
        ],
        b"",
        &env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(logins(&out), 1, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("Token {id} (systemd-pkcs11) unlocked")),
        "{}",
        text(&out.stderr)
    );
    // The new volume key is in the new keyslot, which the token now names: cryptsetup
    // opens it through the token, and ucrypt's table has a new key over the same data.
    let theirs = piped(
        hsm.cmd("cryptsetup").args([
            "open",
            "--test-passphrase",
            "--token-only",
            "-v",
            s(&vol.img),
        ]),
        pin.as_bytes(),
    );
    assert!(theirs.status.success(), "{}", text(&theirs.stderr));
    assert_eq!(
        vol.tokens(),
        vec![(id, "systemd-pkcs11".to_string())],
        "the token survives"
    );
    let out = print_table(&vol.img, &["--token-only"], pin.as_bytes(), &env);
    let after = text(&out.stdout);
    assert_ne!(table_key(&out), before.split_whitespace().nth(4).unwrap());
    assert_eq!(plaintext(&after, data.len()), data);
    // The passphrase's keyslot is gone, as cryptsetup's --key-slot leaves it.
    let out = uc(
        &[
            "open",
            "--test-passphrase",
            "--key-file",
            s(&vol.pass),
            s(&vol.img),
        ],
        b"",
        &env,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // Again, now with one keyslot (no --key-slot needed), the PIN typed; a resumed run
    // (--init-only, then --resume-only) unlocks through the token both times.
    for stage in ["--init-only", "--resume-only"] {
        let out = uc(
            &[
                "reencrypt",
                "-q",
                stage,
                "--token-type",
                "systemd-pkcs11",
                s(&vol.img),
            ],
            pin.as_bytes(),
            &env,
        );
        assert!(out.status.success(), "{stage}: {}", text(&out.stderr));
        assert_eq!(logins(&out), 1, "{stage}: {}", text(&out.stderr));
    }
    let out = print_table(&vol.img, &["--token-only"], pin.as_bytes(), &env);
    assert_eq!(plaintext(&text(&out.stdout), data.len()), data);

    // No token unlocks (a wrong PIN): nothing is asked, nothing changes.
    let key = table_key(&out);
    let out = uc(
        &["reencrypt", "-q", "--token-only", s(&vol.img)],
        b"9999\n",
        &env,
    );
    assert!(!out.status.success(), "re-keyed with a wrong PIN");
    let out = print_table(&vol.img, &["--token-only"], pin.as_bytes(), &env);
    assert_eq!(table_key(&out), key);
    // A new header has no token to use.
    let plain = vol.path("plain.img");
    std::fs::write(&plain, vec![0u8; 4 << 20]).unwrap();
    let out = uc(
        &[
            "reencrypt",
            "-q",
            "--encrypt",
            "--header",
            s(&vol.path("new.hdr")),
            "--token-only",
            s(&plain),
        ],
        b"",
        &env,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("unlock an existing LUKS2 header"),
        "{}",
        text(&out.stderr)
    );
}

/// Runs `keyctl ARGS`, returning its trimmed stdout.
fn keyctl(args: &[&str]) -> String {
    let out = common::cmd::ok("keyctl", args);
    text(&out.stdout).trim().to_string()
}

/// The keyslot `open --test-passphrase -v --token-only EXTRA` unlocks for ucrypt and for
/// cryptsetup (None: it failed), and both exit codes agree.
fn token_slot(img: &Path, extra: &[&str]) -> Option<u32> {
    let mut args = vec!["open", "--test-passphrase", "-v", "--token-only"];
    args.extend_from_slice(extra);
    args.push(s(img));
    let ours = uc(&args, b"", &[]);
    let theirs = common::cmd::run("cryptsetup", &args);
    assert_eq!(
        ours.status.code(),
        theirs.status.code(),
        "{extra:?}\nucrypt: {}\ncryptsetup: {}",
        text(&ours.stderr),
        text(&theirs.stderr)
    );
    let slot = |t: &str, before: &str, after: &str| -> Option<u32> {
        let i = t.find(before)? + before.len();
        t[i..].split(after).next()?.trim().parse().ok()
    };
    let mine = slot(
        &text(&ours.stderr),
        "unlocked the volume key (keyslot ",
        ")",
    );
    let cs = slot(&text(&theirs.stdout), "Key slot ", " unlocked");
    assert_eq!(mine, cs, "{extra:?}: {}", text(&ours.stderr));
    mine
}

#[test]
fn tokens_are_tried_in_cryptsetups_order_by_keyslot_priority() {
    if !common::require("cryptsetup") || !common::require("keyctl") {
        return;
    }
    let vol = Vol::new();
    let tag = format!("ucrypt-prio-{}", std::process::id());
    // Keyslots 1 and 2, each with its own passphrase in the keyring and a luks2-keyring
    // token: token 0 opens keyslot 1 only, token 1 keyslot 2 only.
    let mut keys = Vec::new();
    for slot in ["1", "2"] {
        let pass = vol.path(&format!("pass{slot}"));
        std::fs::write(&pass, format!("passphrase {slot}")).unwrap();
        common::cmd::ok(
            "cryptsetup",
            &[
                "luksAddKey",
                "-q",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-slot",
                slot,
                "--key-file",
                s(&vol.pass),
                s(&vol.img),
                s(&pass),
            ],
        );
        let desc = format!("{tag}-{slot}");
        common::cmd::ok(
            "cryptsetup",
            &[
                "token",
                "add",
                "--key-description",
                &desc,
                "--key-slot",
                slot,
                s(&vol.img),
            ],
        );
        keys.push(keyctl(&[
            "add",
            "user",
            &desc,
            &format!("passphrase {slot}"),
            "@u",
        ]));
    }
    let priority = |slot: &str, p: &str| {
        common::cmd::ok(
            "cryptsetup",
            &["config", "--priority", p, "--key-slot", slot, s(&vol.img)],
        );
    };
    // Both normal: the header's first token.
    assert_eq!(token_slot(&vol.img, &[]), Some(1));
    // Keyslot 2 preferred: token 1 goes first.
    priority("2", "prefer");
    assert_eq!(token_slot(&vol.img, &[]), Some(2));
    assert_eq!(
        token_slot(&vol.img, &["--token-type", "luks2-keyring"]),
        Some(2)
    );
    // Keyslot 2 ignored: only by its token's id.
    priority("2", "ignore");
    assert_eq!(token_slot(&vol.img, &[]), Some(1));
    assert_eq!(token_slot(&vol.img, &["--token-id", "1"]), Some(2));
    // Both ignored: no token is tried unless named.
    priority("1", "ignore");
    assert_eq!(token_slot(&vol.img, &[]), None);
    assert_eq!(token_slot(&vol.img, &["--token-id", "0"]), Some(1));
    // Preferred beats the header's order; one that fails falls to the normal ones.
    priority("1", "normal");
    priority("2", "prefer");
    keyctl(&["unlink", &keys[1], "@u"]);
    assert_eq!(token_slot(&vol.img, &[]), Some(1));
    keyctl(&["unlink", &keys[0], "@u"]);
    assert_eq!(token_slot(&vol.img, &[]), None);
}
