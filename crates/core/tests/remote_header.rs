//! Header commands on a remote device through the library alone
//! (`ucrypt::remote_header::Staging`): an NBD export (served here, in-process, from a
//! LUKS2 image) is staged once per URI, libcryptsetup changes the staged copy, and only the
//! write-back changes the server's bytes; the errors have the kinds the command turns into
//! exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use ucrypt::export::{Listener, ServeOptions, Shutdown};
use ucrypt::header::{crypt_device, load_luks};
use ucrypt::open::Device;
use ucrypt::remote_header::Staging;
use ucrypt::{ErrorKind, VolumeType};

fn label(path: &Path) -> Option<String> {
    let mut cd = crypt_device(path, None).unwrap();
    load_luks(&mut cd, VolumeType::Luks2).unwrap();
    cd.info().label.filter(|l| !l.is_empty())
}

#[test]
fn a_staged_header_reaches_the_server_only_when_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let img = crate::common::luks_image(dir.path(), true, 16 << 20, &[b"pw"]);
    let before = std::fs::read(&img).unwrap();
    let export = ucrypt::open::open_device(
        &Device::parse(img.to_str().unwrap()),
        false,
        ucrypt::open::Cache::Auto,
    )
    .unwrap();
    let listener = Listener::bind_unix(dir.path().join("nbd.sock")).unwrap();
    let uri = listener.uri();
    let shutdown = Shutdown::default();
    let opts = ServeOptions {
        shutdown: shutdown.clone(),
        ..ServeOptions::default()
    };
    let server = std::thread::spawn(move || ucrypt::export::serve(listener, export, opts));

    let staging = Staging::new();
    let local = staging.local_path(Path::new(&uri), true).unwrap();
    assert_ne!(local, Path::new(&uri));
    assert_eq!(
        staging.local_path(Path::new(&uri), true).unwrap(),
        local,
        "staged twice"
    );
    assert_eq!(
        staging.shown(format!("Device:\t{}\n", local.display())),
        format!("Device:\t{uri}\n")
    );
    let mut cd = crypt_device(&local, None).unwrap();
    load_luks(&mut cd, VolumeType::Luks2).unwrap();
    cd.set_label(Some("remote"), None).unwrap();
    drop(cd);
    assert_eq!(label(&local).as_deref(), Some("remote"));
    assert!(
        std::fs::read(&img).unwrap() == before,
        "the server's bytes changed before the write-back"
    );

    staging.write_back().unwrap();
    assert_eq!(label(&img).as_deref(), Some("remote"));
    // Nothing is staged any more: a second write-back sends nothing.
    let after = std::fs::read(&img).unwrap();
    staging.write_back().unwrap();
    assert!(std::fs::read(&img).unwrap() == after);

    shutdown.trigger();
    server.join().unwrap().unwrap();
}

#[test]
fn local_paths_pass_memory_devices_hold_no_header_and_absent_servers_are_device_errors() {
    let dir = tempfile::tempdir().unwrap();
    let staging = Staging::new();
    let file = dir.path().join("disk.img");
    assert_eq!(staging.local_path(&file, true).unwrap(), file);

    let e = staging
        .local_path(Path::new("ram:1M"), true)
        .expect_err("a memory device's header");
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e:#}");
    // Its size alone (the data device of a detached header) is fine.
    assert!(staging.local_path(Path::new("ram:1M"), false).is_ok());

    let gone = format!(
        "nbd+unix:///?socket={}",
        dir.path().join("nosuch.sock").display()
    );
    let e = staging
        .local_path(Path::new(&gone), true)
        .expect_err("no server");
    assert_eq!(e.kind(), ErrorKind::Device, "{e:#}");
    staging.write_back().unwrap();
}
