//! Secrets of an unlock never reach freed memory readable: this test binary's allocator
//! looks into every block freed and counts those that still hold a marker passphrase. A
//! passphrase asked for through the prompt, one read from a key file (with an offset, in
//! a buffer that grows), and a LUKS2 unlock with both leave none; a plain `Vec` holding
//! the marker, the control, is seen. (libcryptsetup's own copies live in C's heap, which
//! this does not watch.) One test only: other tests' frees would be counted meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use ucrypt::unlock::{KeyFile, Outcome, Prompt, Request, Secret};

/// The passphrase; in static memory, which is never freed.
static MARKER: &[u8] = b"Zq7-unlock-marker-passphrase-9x";

/// Freed blocks that held the marker.
static SEEN: AtomicUsize = AtomicUsize::new(0);

struct Watch;

// SAFETY: every call is forwarded to the system allocator; `dealloc` only reads the block
// it is given before freeing it.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` is a live block of `layout.size()` bytes until freed below.
        let block = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
        if block.windows(MARKER.len()).any(|w| w == MARKER) {
            SEEN.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static WATCH: Watch = Watch;

struct Answer;

impl Prompt for Answer {
    fn passphrase(&mut self, _prompt: &str) -> ucrypt::Result<Secret> {
        Ok(Secret::copy_of(MARKER))
    }
}

#[test]
fn unlock_secrets_are_zeroed_before_they_are_freed() {
    // The control: a vector holding the marker is seen when freed.
    let before = SEEN.load(Ordering::SeqCst);
    drop(std::hint::black_box(MARKER.to_vec()));
    assert_eq!(
        SEEN.load(Ordering::SeqCst),
        before + 1,
        "the watch sees a freed copy"
    );

    let tmp = tempfile::tempdir().unwrap();
    let img = ucrypt_testkit::image(tmp.path(), "luks2.img", 16 << 20);
    let mut cd = ucrypt_cryptsetup::CryptDevice::init(&img).unwrap();
    cd.set_pbkdf(&ucrypt_cryptsetup::Pbkdf {
        kind: "pbkdf2".into(),
        iterations: Some(1000),
        ..Default::default()
    })
    .unwrap();
    cd.format_luks(
        &ucrypt_cryptsetup::LuksFormat {
            luks2: true,
            cipher: "aes-xts-plain64".into(),
            key_bytes: 64,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    cd.add_keyslot_by_volume_key(Some(0), None, MARKER).unwrap();
    drop(cd);
    // A key file with the passphrase after 5000 bytes of filler: the buffer grows past
    // its first size while reading.
    let kf = tmp.path().join("key");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&kf).unwrap();
        f.write_all(&[b'-'; 5000]).unwrap();
        f.write_all(MARKER).unwrap();
    }
    let before = SEEN.load(Ordering::SeqCst);

    let s = ucrypt::unlock::read_key_file(&kf, 0, 0).unwrap();
    assert!(s.ends_with(MARKER));
    drop(s);
    let mut grown = Secret::new();
    for chunk in MARKER.chunks(3).cycle().take(400) {
        grown.push(chunk);
    }
    drop(grown);

    let asked = Request {
        kind: Some(ucrypt::VolumeType::Luks),
        ..Request::new(&img)
    };
    let Outcome::Unlocked(u, _) = asked.unlock(&mut Answer).unwrap() else {
        panic!("expected the volume");
    };
    drop(u);
    let from_file = Request {
        key: KeyFile {
            path: Some(kf.clone()),
            offset: 5000,
            size: 0,
        },
        ..asked.clone()
    };
    let Outcome::Unlocked(u, _) = from_file.unlock(&mut Answer).unwrap() else {
        panic!("expected the volume");
    };
    drop(u);
    let test = Request {
        test_passphrase: true,
        ..asked.clone()
    };
    assert!(matches!(
        test.unlock(&mut Answer).unwrap(),
        Outcome::Checked
    ));
    assert_eq!(
        SEEN.load(Ordering::SeqCst),
        before,
        "a freed block still held the passphrase"
    );
}
