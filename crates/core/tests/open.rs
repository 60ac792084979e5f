//! What an `open` serves and how, through the library alone: `ucrypt::open::open_source`
//! (a table input, `--raw`, a header unlocked by the policy, `--test-passphrase`) and
//! `ucrypt::export` (the exposure rule for TCP and TLS, the endpoints, the pid file, a
//! server in the foreground until a stop request or while a command runs). The kinds of
//! the errors are what the command turns into cryptsetup's exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::VecDeque;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use ucrypt::export::{Ended, Endpoint, Exposure, ServeOptions, Shutdown, Tls, TlsMode};
use ucrypt::open::{open_source, Backend, Opened, Source};
use ucrypt::prompt::Prompt;
use ucrypt::secret::Secret;
use ucrypt::unlock::{KeyFile, Request};
use ucrypt::{ErrorKind, OpenOptions, VolumeType};

/// A prompt that answers from a script and records what it was asked and warned of.
#[derive(Default)]
struct Script {
    answers: VecDeque<&'static [u8]>,
    asked: Vec<String>,
    warnings: Vec<String>,
}

impl Prompt for Script {
    fn passphrase(&mut self, prompt: &str) -> ucrypt::Result<Secret> {
        self.asked.push(prompt.to_string());
        match self.answers.pop_front() {
            Some(a) => Ok(Secret::copy_of(a)),
            None => Err(ucrypt::Error::Invalid(
                "the script has no more answers".into(),
            )),
        }
    }

    fn warning(&mut self, text: &str) {
        self.warnings.push(text.to_string());
    }
}

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn line(device: &Path, offset: u64, extra: &str) -> String {
    format!(
        "0 64 crypt aes-xts-plain64 {KEY} 0 {} {offset}{extra}",
        device.display()
    )
}

fn mapping(text: &str) -> ucrypt::format::Mapping {
    ucrypt::format::Mapping::parse(text).unwrap()
}

fn volume(o: Opened) -> (std::sync::Arc<dyn Backend>, String) {
    match o {
        Opened::Volume {
            volume,
            description,
        } => (volume, description),
        Opened::Checked => panic!("expected a volume, got Checked"),
    }
}

#[test]
fn a_table_opens_its_volume_and_a_large_sector_is_warned_of_once_it_opened() {
    let dir = tempfile::tempdir().unwrap();
    let img = ucrypt_testkit::image(dir.path(), "img", 1 << 20);
    let mut p = Script::default();
    let (v, description) = volume(
        open_source(
            Source::Table(mapping(&line(&img, 0, ""))),
            OpenOptions::default(),
            &mut p,
        )
        .unwrap(),
    );
    assert_eq!(v.info().size_bytes, 64 * 512);
    assert!(description.contains("aes-xts-plain64"), "{description}");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);

    let big = line(&img, 0, " 1 sector_size:8192");
    let opts = OpenOptions {
        allow_large_sectors: true,
        ..OpenOptions::default()
    };
    open_source(Source::Table(mapping(&big)), opts, &mut p).unwrap();
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert!(
        p.warnings[0].contains("sector_size 8192"),
        "{:?}",
        p.warnings
    );

    // Refused (large sectors not allowed): its error alone, no warning.
    let mut q = Script::default();
    let e = open_source(Source::Table(mapping(&big)), OpenOptions::default(), &mut q)
        .err()
        .expect("a sector size above 4096 without allow_large_sectors");
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e:#}");
    assert!(q.warnings.is_empty(), "{:?}", q.warnings);
}

#[test]
fn a_missing_device_is_a_device_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nosuch");
    for source in [
        Source::Table(mapping(&line(&missing, 0, ""))),
        Source::Raw(mapping(&line(&missing, 0, ""))),
    ] {
        let e = open_source(source, OpenOptions::default(), &mut Script::default())
            .err()
            .expect("a missing device");
        assert_eq!(e.kind(), ErrorKind::Device, "{e:#}");
        assert!(format!("{e:#}").contains("nosuch"), "{e:#}");
    }
}

#[test]
fn raw_serves_the_ciphertext_of_a_one_line_table_only() {
    let dir = tempfile::tempdir().unwrap();
    let img = ucrypt_testkit::image(dir.path(), "img", 1 << 20);
    let table = line(&img, 8, "");
    let (decrypted, _) = volume(
        open_source(
            Source::Table(mapping(&table)),
            OpenOptions::default(),
            &mut Script::default(),
        )
        .unwrap(),
    );
    decrypted.write_at(&[0x5a; 4096], 0, false).unwrap();
    decrypted.flush().unwrap();
    let (raw, description) = volume(
        open_source(
            Source::Raw(mapping(&table)),
            OpenOptions::default(),
            &mut Script::default(),
        )
        .unwrap(),
    );
    assert_eq!(
        description,
        format!("ucrypt raw export of {}", img.display())
    );
    let mut through_raw = vec![0u8; 4096];
    raw.read_at(&mut through_raw, 8 * 512).unwrap();
    let file = std::fs::read(&img).unwrap();
    assert!(through_raw[..] == file[8 * 512..8 * 512 + 4096]);
    assert!(through_raw != [0x5a; 4096], "raw served plaintext");

    let two = format!("{}\n{}", line(&img, 0, ""), {
        let l = line(&img, 64, "");
        l.replacen("0 64", "64 64", 1)
    });
    let e = open_source(
        Source::Raw(mapping(&two)),
        OpenOptions::default(),
        &mut Script::default(),
    )
    .err()
    .expect("two targets");
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert!(e.to_string().contains("one-line table"), "{e}");
}

#[test]
fn a_header_is_unlocked_by_the_policy_and_test_passphrase_serves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(dir.path(), true, 20 << 20, &[b"right"]);
    let header = |test_passphrase| {
        Source::Header(Box::new(Request {
            kind: Some(VolumeType::Luks),
            test_passphrase,
            ..Request::new(&img)
        }))
    };
    let mut p = Script {
        answers: [&b"right"[..]].into_iter().collect(),
        ..Script::default()
    };
    assert!(matches!(
        open_source(header(true), OpenOptions::default(), &mut p).unwrap(),
        Opened::Checked
    ));
    assert_eq!(p.asked.len(), 1);

    let mut p = Script {
        answers: [&b"wrong"[..]].into_iter().collect(),
        ..Script::default()
    };
    let e = open_source(header(false), OpenOptions::default(), &mut p)
        .err()
        .expect("a wrong passphrase");
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:#}");

    let mut p = Script {
        answers: [&b"right"[..]].into_iter().collect(),
        ..Script::default()
    };
    let (v, description) =
        volume(open_source(header(false), OpenOptions::default(), &mut p).unwrap());
    assert!(
        description.starts_with("ucrypt LUKS2 aes-xts-plain64"),
        "{description}"
    );
    v.write_at(b"through the header", 0, false).unwrap();
    let mut back = [0u8; 18];
    v.read_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"through the header");

    // A key file that is not there: the unlock's error, nothing asked.
    let mut p = Script::default();
    let source = Source::Header(Box::new(Request {
        kind: Some(VolumeType::Luks),
        key: KeyFile {
            path: Some(dir.path().join("nokey")),
            ..KeyFile::default()
        },
        ..Request::new(&img)
    }));
    assert!(open_source(source, OpenOptions::default(), &mut p).is_err());
    assert!(p.asked.is_empty());
}

fn exposure(endpoint: Endpoint, tls: Tls, allow: bool) -> Exposure {
    Exposure {
        endpoint,
        tls,
        allow_cleartext_tcp: allow,
    }
}

#[test]
fn plaintext_on_a_tcp_port_is_refused_unless_asked_for_and_then_warned_of() {
    let tcp = || Endpoint::Tcp("0".into());
    let mut p = Script::default();
    let e = exposure(tcp(), Tls::default(), false)
        .check(&mut p)
        .expect_err("cleartext TCP");
    assert_eq!(e.kind(), ErrorKind::Invalid);
    let msg = e.to_string();
    assert!(
        msg.contains("127.0.0.1:0")
            && msg.contains("TLS is off")
            && msg.contains("every local user"),
        "{msg}"
    );
    assert!(p.warnings.is_empty());

    assert!(exposure(tcp(), Tls::default(), true)
        .check(&mut p)
        .unwrap()
        .is_none());
    assert_eq!(p.warnings.len(), 1);
    assert!(p.warnings[0].contains("without authentication on 127.0.0.1:0"));

    // Unix sockets are the owner's: nothing to judge, nothing warned of.
    let mut q = Script::default();
    for e in [
        Endpoint::Private,
        Endpoint::Unix {
            path: "/nonexistent/s".into(),
            group: None,
        },
    ] {
        assert!(exposure(e, Tls::default(), false)
            .check(&mut q)
            .unwrap()
            .is_none());
    }
    assert!(q.warnings.is_empty());
}

#[test]
fn tls_needs_both_a_mode_and_credentials_and_reads_them_before_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let psk = dir.path().join("keys.psk");
    let mut p = Script::default();
    let cases = [
        (
            Tls {
                psk: Some(psk.clone()),
                ..Tls::default()
            },
            "need --tls=on or --tls=require",
        ),
        (
            Tls {
                mode: TlsMode::Require,
                ..Tls::default()
            },
            "needs --tls-certificates DIR or --tls-psk FILE",
        ),
    ];
    for (tls, why) in cases {
        let e = exposure(Endpoint::Private, tls, false)
            .check(&mut p)
            .expect_err(why);
        assert_eq!(e.kind(), ErrorKind::Invalid);
        assert!(e.to_string().contains(why), "{e}");
    }
    // A PSK file that is not there fails before any address is judged.
    let e = exposure(
        Endpoint::Tcp("0".into()),
        Tls {
            mode: TlsMode::Require,
            psk: Some(psk.clone()),
            ..Tls::default()
        },
        false,
    )
    .check(&mut p)
    .expect_err("a missing PSK file");
    assert!(format!("{e:#}").contains("keys.psk"), "{e:#}");
    // Required TLS with its keys makes TCP acceptable.
    std::fs::write(&psk, "alice:0123456789abcdef0123456789abcdef\n").unwrap();
    let tls = exposure(
        Endpoint::Tcp("0".into()),
        Tls {
            mode: TlsMode::Require,
            psk: Some(psk),
            ..Tls::default()
        },
        false,
    )
    .check(&mut p)
    .unwrap();
    assert!(tls.is_some() && p.warnings.is_empty());
}

#[test]
fn a_private_socket_lives_in_its_own_directory_and_goes_with_the_pid_file() {
    let dir = tempfile::tempdir().unwrap();
    let pid = dir.path().join("server.pid");
    let mut bound = Endpoint::Private.bind(false).unwrap();
    let socket = bound
        .listener
        .unix_path()
        .expect("a unix socket")
        .to_path_buf();
    let home = socket.parent().unwrap().to_path_buf();
    assert_eq!(
        std::fs::metadata(&home).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(bound.uri.starts_with("nbd+unix://"), "{}", bound.uri);
    bound.cleanup.write_pid_file(&pid).unwrap();
    assert_eq!(
        std::fs::read_to_string(&pid).unwrap().trim(),
        std::process::id().to_string()
    );
    drop(bound);
    assert!(!home.exists() && !pid.exists());

    let tls = Endpoint::Private.bind(true).unwrap();
    assert!(tls.uri.starts_with("nbds+unix://"), "{}", tls.uri);
    let e = Endpoint::Unix {
        path: dir.path().join("s.sock"),
        group: Some("no-such-group-here".into()),
    }
    .bind(false)
    .err()
    .expect("an unknown group");
    assert_eq!(e.kind(), ErrorKind::Invalid);
}

#[test]
fn a_foreground_server_ends_with_its_command_or_its_stop_request() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    let export: std::sync::Arc<dyn Backend> =
        ucrypt::open::open_ram("ram:1M").unwrap() as std::sync::Arc<dyn Backend>;
    let socket = dir.path().join("fg.sock");
    let bound = Endpoint::Unix {
        path: socket.clone(),
        group: None,
    }
    .bind(false)
    .unwrap();
    let uri = bound.uri.clone();
    let cmd = format!(
        "echo \"$uri|$nbd|$unixsocket|$exportname|${{port:-none}}\" > {}; exit 3",
        seen.display()
    );
    let ended = bound
        .serve(export.clone(), ServeOptions::default(), Some(&cmd))
        .unwrap();
    assert_eq!(ended, Ended::Command(3));
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap().trim(),
        format!("{uri}|{uri}|{}||none", socket.display())
    );
    assert!(!socket.exists(), "the socket outlived its server");

    // A command killed by a signal: 128 + the signal, as the shell says.
    let bound = Endpoint::Private.bind(false).unwrap();
    let ended = bound
        .serve(
            export.clone(),
            ServeOptions::default(),
            Some("kill -TERM $$"),
        )
        .unwrap();
    assert_eq!(ended, Ended::Command(128 + 15));

    // Without a command: until the stop request.
    let shutdown = Shutdown::default();
    let stop = shutdown.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        stop.trigger();
    });
    let bound = Endpoint::Private.bind(false).unwrap();
    let opts = ServeOptions {
        shutdown,
        ..ServeOptions::default()
    };
    assert_eq!(bound.serve(export, opts, None).unwrap(), Ended::Stopped);
    stopper.join().unwrap();
}

#[test]
fn remote_devices_get_more_nbd_threads() {
    use ucrypt::export::default_workers;
    assert_eq!(default_workers(None), 8);
    assert_eq!(default_workers(Some(Path::new("/dev/sda"))), 8);
    assert_eq!(default_workers(Some(Path::new("ram:1G"))), 8);
    assert_eq!(default_workers(Some(Path::new("rbd:pool/img"))), 32);
    assert_eq!(
        default_workers(Some(Path::new("nbd+unix:///?socket=/tmp/s"))),
        32
    );
}
