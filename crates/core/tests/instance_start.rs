//! Starting a named instance through the library alone (`ucrypt::instance::start`): the
//! refusals before anything is claimed, the name and the image claimed (a second claim is
//! busy), the description of a table and of an unlocked LUKS2 header, `--persistent`'s
//! flags in the header, and a table instance served until `close`, which releases the
//! name and the image.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;
use ucrypt::config::PerfOptions;
use ucrypt::export::{Endpoint, Exposure, Tls, TlsMode};
use ucrypt::instance::control::{self, Reply, Request};
use ucrypt::instance::frontend::{Choice, FrontendKind};
use ucrypt::instance::runtime::Paths;
use ucrypt::instance::start::{Persist, Serving, Start, What};
use ucrypt::remote_header::Staging;
use ucrypt::unlock::{Prompt, Secret};
use ucrypt::ErrorKind;
use ucrypt_format::Mapping;

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

/// A prompt that asks nothing and keeps the notices.
#[derive(Default)]
struct Quiet {
    notices: Vec<String>,
}

impl Prompt for Quiet {
    fn passphrase(&mut self, _prompt: &str) -> ucrypt::Result<Secret> {
        Err(ucrypt::Error::Invalid("no passphrase here".into()))
    }

    fn notice(&mut self, text: &str) {
        self.notices.push(text.to_string());
    }
}

fn start(name: &str, frontend: FrontendKind) -> Start {
    Start {
        name: name.into(),
        exposure: Exposure {
            endpoint: Endpoint::Private,
            tls: Tls {
                mode: TlsMode::Off,
                certificates: None,
                verify_peer: false,
                psk: None,
            },
            allow_cleartext_tcp: false,
        },
        frontend: Choice::Kind(frontend),
        recover: false,
        fuse_dir: None,
        vhost_socket: None,
        ublk_poll: None,
    }
}

fn table(img: &std::path::Path) -> What {
    let line = format!("0 8192 crypt aes-xts-plain64 {KEY} 0 {} 0", img.display());
    What::Table {
        mapping: Mapping::parse(&line).unwrap(),
        raw: false,
    }
}

fn refusal<T>(r: ucrypt::Result<T>) -> (ErrorKind, String) {
    match r {
        Ok(_) => panic!("expected a refusal"),
        Err(e) => (e.kind(), format!("{e:#}")),
    }
}

#[test]
fn an_instance_is_claimed_locked_described_served_and_released() {
    let tmp = tempfile::tempdir().unwrap();
    // The only test in this binary: nothing else reads the variable meanwhile.
    std::env::set_var("UCRYPT_RUNTIME_DIR", tmp.path().join("run"));
    let img = ucrypt_testkit::image(tmp.path(), "plain.img", 4 << 20);
    let mut prompt = Quiet::default();

    // Refused before anything is claimed: options that do not fit the front end, a bad name.
    let mut s = start("s1", FrontendKind::None);
    s.fuse_dir = Some(tmp.path().join("mnt"));
    assert_eq!(
        refusal(s.claim(&mut prompt)),
        (
            ErrorKind::Invalid,
            "--fuse DIR needs --device fuse (or auto)".into()
        )
    );
    let mut s = start("s1", FrontendKind::None);
    s.vhost_socket = Some(tmp.path().join("vm.sock"));
    assert_eq!(
        refusal(s.claim(&mut prompt)),
        (
            ErrorKind::Invalid,
            "--vhost-socket PATH needs --device vhost-user (or auto)".into()
        )
    );
    let mut s = start("s1", FrontendKind::None);
    s.ublk_poll = Some(std::time::Duration::from_micros(50));
    assert_eq!(
        refusal(s.claim(&mut prompt)),
        (
            ErrorKind::Invalid,
            "--ublk-poll USECS needs --device ublk (the front end here is none)".into()
        )
    );
    assert_eq!(
        refusal(start("a/b", FrontendKind::None).claim(&mut prompt)).0,
        ErrorKind::Invalid
    );
    assert!(!Paths::of("s1").unwrap().dir.exists());

    // Claimed and locked: the description of the table, the name and the image taken.
    let claimed = start("s1", FrontendKind::None).claim(&mut prompt).unwrap();
    assert_eq!(claimed.kind, FrontendKind::None);
    let mut locked = claimed.lock(table(&img), false, false).unwrap();
    assert!(!locked.needs_unlock());
    let d = &locked.desc;
    assert_eq!(
        (d.name.as_str(), d.kind.as_str(), d.frontend.as_str()),
        ("s1", "TABLE", "none")
    );
    assert_eq!(
        PathBuf::from(&d.device),
        std::fs::canonicalize(&img).unwrap()
    );
    assert_eq!(
        (d.size_sectors, d.key_bits, d.from_header),
        (8192, 512, false)
    );
    assert_eq!(
        refusal(start("s1", FrontendKind::None).claim(&mut prompt)).0,
        ErrorKind::Busy
    );
    let other = start("s2", FrontendKind::None).claim(&mut prompt).unwrap();
    let (kind, msg) = refusal(other.lock(table(&img), false, true));
    assert_eq!(kind, ErrorKind::Busy, "{msg}");
    // The refused second instance gave its name back.
    assert!(!Paths::of("s2").unwrap().dir.exists());

    // Served until `close`; then the name and the image are free again.
    let paths = locked.claimed.dir.paths.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let serving = Serving {
            read_only: false,
            cache: ucrypt::open::Cache::Auto,
            allow_large_sectors: false,
            perf: PerfOptions::default(),
            max_connections: 2,
            workers: 2,
            log_errors: false,
            queues: None,
            pid_file: None,
            take_signals: false,
        };
        let r = locked.serve(serving, |shown, link| {
            tx.send((shown.to_string(), link.map(PathBuf::from)))
                .unwrap();
        });
        drop(locked);
        r
    });
    let (uri, link) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(uri.starts_with("nbd+unix:///s1?socket="), "{uri}");
    assert!(link.is_none(), "no node, no stable link: {link:?}");
    let Reply::Status(st) = control::call(
        &paths.control(),
        &Request::Status,
        None,
        Duration::from_secs(30),
    )
    .unwrap() else {
        panic!("no status");
    };
    assert_eq!(
        (st.description.kind.as_str(), st.description.size_sectors),
        ("TABLE", 8192)
    );
    let close = Request::Close {
        force: false,
        deferred: false,
    };
    assert_eq!(
        control::call(&paths.control(), &close, None, Duration::from_secs(30)).unwrap(),
        Reply::Done
    );
    server.join().unwrap().unwrap();
    assert!(
        !paths.dir.exists(),
        "the runtime directory outlived the server"
    );
    let again = start("s1", FrontendKind::None).claim(&mut prompt).unwrap();
    drop(again.lock(table(&img), false, false).unwrap());

    // A LUKS2 header: unlocked by the caller, described, --persistent's flags stored.
    let luks = common::luks_image(tmp.path(), true, 16 << 20, &[b"pw"]);
    let claimed = start("s3", FrontendKind::None).claim(&mut prompt).unwrap();
    let mut locked = claimed
        .lock(
            What::Header {
                device: luks.clone(),
                header: None,
            },
            false,
            false,
        )
        .unwrap();
    assert!(locked.needs_unlock() && locked.desc.from_header);
    let hopts = ucrypt::HeaderOptions {
        kind: ucrypt::VolumeType::Luks2,
        ..ucrypt::HeaderOptions::default()
    };
    let u = ucrypt::unlock(&luks, b"pw", &hopts).unwrap();
    let persist = Persist {
        perf: PerfOptions {
            no_read_workqueue: true,
            ..PerfOptions::default()
        },
        allow_discards: true,
    };
    locked
        .unlocked(u, hopts, Some(persist), &Staging::new())
        .unwrap();
    assert!(!locked.needs_unlock());
    let d = &locked.desc;
    assert_eq!((d.kind.as_str(), d.key_bits), ("LUKS2", 512));
    assert_eq!(
        PathBuf::from(&d.device),
        std::fs::canonicalize(&luks).unwrap()
    );
    assert!(d.uuid.is_some());
    let mut cd = ucrypt::header::crypt_device(&luks, None).unwrap();
    ucrypt::header::load_luks(&mut cd, ucrypt::VolumeType::Luks2).unwrap();
    let (flags, _) = cd.persistent_flags().unwrap();
    assert_eq!(
        flags,
        ucrypt_cryptsetup::ACTIVATE_ALLOW_DISCARDS | ucrypt_cryptsetup::ACTIVATE_NO_READ_WORKQUEUE
    );
    drop(locked);
    assert!(!Paths::of("s3").unwrap().dir.exists());
    assert!(prompt.notices.is_empty(), "{:?}", prompt.notices);
}
