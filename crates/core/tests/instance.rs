//! A named instance started and stopped through the library alone (no command line): the
//! server built from a table line, served with no front end, driven over its control
//! socket with the typed protocol (status, suspend, resume, resize, refusals, close), and
//! gone afterwards. The NBD socket is read by a real peer (`nbdcopy`; skipped by the
//! workspace's rule when it is missing, a failure under CI).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;
use ucrypt::instance::control::{self, Reply, Request};
use ucrypt::instance::runtime::{Description, InstanceDir};
use ucrypt::instance::server::{self, Input};
use ucrypt::{ErrorKind, OpenOptions};
use ucrypt_device::FrontendKind;
use ucrypt_format::Mapping;
use ucrypt_nbd::{Listener, Shutdown};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn call(path: &std::path::Path, r: &Request, secret: Option<&[u8]>) -> Reply {
    control::call(path, r, secret, Duration::from_secs(30)).unwrap()
}

fn refused(reply: Reply) -> (ErrorKind, String) {
    match reply {
        Reply::Refused { kind, message } => (kind, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_instance_starts_answers_its_control_socket_and_stops() {
    let tmp = tempfile::tempdir().unwrap();
    // The only test in this binary: nothing else reads the variable meanwhile.
    std::env::set_var("UCRYPT_RUNTIME_DIR", tmp.path().join("run"));
    let img = tmp.path().join("img");
    std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    let line = format!("0 8192 crypt aes-xts-plain64 {KEY} 0 {} 0", img.display());

    let dir = InstanceDir::create("lib-test", false).unwrap();
    let paths = dir.paths.clone();
    // The name is claimed: a second instance of it is refused as busy.
    let again = InstanceDir::create("lib-test", false).unwrap_err();
    assert_eq!(ucrypt::Error::from(again).kind(), ErrorKind::Busy);

    let opts = OpenOptions::default();
    let built = server::build(Input::Table(Mapping::parse(&line).unwrap()), opts).unwrap();
    let desc = Description {
        name: "lib-test".into(),
        frontend: "none".into(),
        size_sectors: 8192,
        kind: "TABLE".into(),
        ..Description::default()
    };
    let listener = Listener::bind_unix(paths.socket()).unwrap();
    let config = server::Config {
        frontend: FrontendKind::None,
        opts,
        raw: false,
        max_connections: 4,
        workers: 2,
        log_errors: false,
        tls: None,
        fuse_dir: None,
        recover: false,
        vhost_socket: None,
        ublk_poll: None,
        queues: None,
        signals: None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let r = server::serve(
            &dir,
            desc,
            built,
            listener,
            config,
            Shutdown::default(),
            |s| {
                tx.send(s.to_string()).unwrap();
                Ok(())
            },
        );
        drop(dir);
        r
    });
    let uri = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(uri.starts_with("nbd+unix:///lib-test?socket="), "{uri}");
    let ctl = paths.control();

    let Reply::Status(st) = call(&ctl, &Request::Status, None) else {
        panic!("no status");
    };
    assert_eq!(st.description.name, "lib-test");
    assert_eq!(st.description.uri, uri);
    assert_eq!(st.description.pid, std::process::id());
    assert!(!st.suspended && !st.in_use && st.nbd_connections == 0);
    assert!(st.reencryption.is_none());
    // status --json's keys come from this serialization: the description's, flattened.
    let v = serde_json::to_value(&st).unwrap();
    for k in [
        "name",
        "type",
        "uri",
        "in_use",
        "suspended",
        "deferred_close",
    ] {
        assert!(v.get(k).is_some(), "{k} missing in {v}");
    }

    // A real NBD peer reads the plaintext view (zeroes on disk decrypt to noise, not zeroes).
    if ucrypt_testkit::require("nbdcopy") {
        let out = tmp.path().join("plain");
        let st = std::process::Command::new("nbdcopy")
            .arg(&uri)
            .arg(&out)
            .status()
            .unwrap();
        assert!(st.success());
        let plain = std::fs::read(&out).unwrap();
        assert_eq!(plain.len(), 4 << 20);
        assert!(plain.iter().any(|&b| b != 0));
    }

    assert_eq!(call(&ctl, &Request::Suspend, None), Reply::Done);
    let (kind, msg) = refused(call(&ctl, &Request::Suspend, None));
    assert_eq!(
        (kind, msg.as_str()),
        (ErrorKind::Invalid, "lib-test is already suspended")
    );
    let close = Request::Close {
        force: false,
        deferred: false,
    };
    let (kind, msg) = refused(call(&ctl, &close, None));
    assert_eq!(kind, ErrorKind::Busy);
    assert!(msg.contains("suspended"), "{msg}");
    // Resume needs the table line again; garbage is refused, the line resumes.
    let resume = Request::Resume {
        link_vk_to_keyring: None,
    };
    let (kind, msg) = refused(call(&ctl, &resume, None));
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("needs a passphrase or table line"), "{msg}");
    let (kind, msg) = refused(call(&ctl, &resume, Some(b"not a table")));
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.starts_with("parsing the table"), "{msg}");
    assert_eq!(
        call(&ctl, &resume, Some(line.as_bytes())),
        Reply::Resized { size_sectors: 8192 }
    );
    // Resize to half.
    assert_eq!(
        call(
            &ctl,
            &Request::Resize { size: Some(4096) },
            Some(line.as_bytes())
        ),
        Reply::Resized { size_sectors: 4096 }
    );
    let Reply::Status(st) = call(&ctl, &Request::Status, None) else {
        panic!("no status");
    };
    assert_eq!((st.description.size_sectors, st.suspended), (4096, false));
    // A table instance has no header to re-encrypt.
    let (kind, msg) = refused(call(
        &ctl,
        &Request::Reencrypt { hotzone: None },
        Some(b"pw"),
    ));
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.contains("LUKS2 header"), "{msg}");
    // A request the protocol does not have.
    let mut s = UnixStream::connect(&ctl).unwrap();
    writeln!(s, r#"{{"op":"frobnicate"}}"#).unwrap();
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).unwrap();
    let (kind, msg) = refused(serde_json::from_str(answer.trim()).unwrap());
    assert_eq!(kind, ErrorKind::Invalid);
    assert!(msg.starts_with("malformed request"), "{msg}");

    assert_eq!(call(&ctl, &close, None), Reply::Done);
    server.join().unwrap().unwrap();
    assert!(
        !paths.dir.exists(),
        "the runtime directory outlived the server"
    );
}
