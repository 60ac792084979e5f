//! The first use of libcryptsetup in a process, from many threads at once.
//!
//! The library brings its crypto backend up lazily and without a lock; CI once saw a test
//! fail with "Requested hash sha256 is not supported" while another thread was half-way
//! through that start. This file is its own test binary so that its one test is the
//! process's first use of the library.

use std::sync::{Arc, Barrier};
use ucrypt_cryptsetup::{CryptDevice, LuksFormat, Pbkdf};

#[test]
fn many_threads_formatting_at_once_on_a_fresh_process_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    const THREADS: usize = 16;
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let img = ucrypt_testkit::image(dir.path(), &format!("t{i}.img"), 4 << 20);
            let start = Arc::clone(&start);
            std::thread::spawn(move || -> Result<(), String> {
                let pbkdf = Pbkdf {
                    kind: "pbkdf2".into(),
                    iterations: Some(1000),
                    ..Pbkdf::default()
                };
                start.wait();
                let mut cd = CryptDevice::init(&img).map_err(|e| e.to_string())?;
                if i % 2 == 1 {
                    // Asks for the hash's size over and over while the others start the
                    // backend by formatting.
                    for _ in 0..200 {
                        cd.set_pbkdf(&pbkdf).map_err(|e| e.to_string())?;
                    }
                    return Ok(());
                }
                cd.set_pbkdf(&pbkdf).map_err(|e| e.to_string())?;
                cd.format_luks(
                    &LuksFormat {
                        luks2: i % 4 == 0,
                        cipher: "aes-xts-plain64".into(),
                        key_bytes: 64,
                        ..LuksFormat::default()
                    },
                    None,
                )
                .map_err(|e| e.to_string())?;
                let slot = cd
                    .add_keyslot_by_volume_key(Some(0), None, b"pass")
                    .map_err(|e| e.to_string())?;
                assert_eq!(slot, 0);
                Ok(())
            })
        })
        .collect();
    for (i, w) in workers.into_iter().enumerate() {
        let r = w.join().expect("worker thread panicked");
        assert_eq!(r, Ok(()), "thread {i}");
    }
}
