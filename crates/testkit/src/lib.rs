//! # ucrypt-testkit: what every test suite of the workspace shares
//!
//! * **One skip rule** ([`ci`], [`require`], [`require_that`], [`testdata`]): a test that
//!   needs a tool, a device, a lab or test data it cannot find *skips* with a message on
//!   stderr (`SKIP: ...`) when run by hand, and *fails* under CI (the `CI` environment
//!   variable set to anything but empty, `0` or `false`), where `scripts/setup.sh` installed
//!   everything and a skip would hide a missing check.
//! * **One RNG** ([`Rng`]): xorshift64, deterministic from a printed seed so that a failing
//!   run can be replayed ([`Rng::from_env`]). Not for keys: those come from
//!   [`random_bytes`] (the OS).
//! * **One image helper set** ([`image`], [`image_with`], [`random_bytes`]).
//! * **One way into the VM** ([`run_in_vm`]): a script run as root in a guest of the
//!   repository's harness `tests/lab/run.sh` (Debian's 6.12 kernel), for what needs kernel
//!   drivers (ublk, kernel NBD, dm-crypt, dm-integrity); [`assert_lab_passed`] reads its
//!   verdict.
//! * **One reader of a LUKS2 header's JSON area** ([`luks2_json`]), as the file holds it,
//!   and one way to make a LUKS2 test volume ([`luks2_format_args`], [`CHEAP_PBKDF`],
//!   [`SMALL_LUKS2`]) with cryptsetup or ucrypt.
//!
//! Standard library only, so that every crate (even `ucrypt-crypto`, at the bottom of the
//! layering) can use it without pulling anything in.

use std::fmt::Display;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Whether the tests run under CI: `CI` is set, non-empty, and neither `0` nor `false`.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The one skip rule: `ok` passes through; when it is false, prints `SKIP: {what}` (by
/// hand) or panics naming `what` (under [`ci`]). Returns `ok`, so a test reads
/// `if !require_that(cond, "...") { return; }`.
///
/// # Panics
/// When `ok` is false under CI.
pub fn require_that(ok: bool, what: impl Display) -> bool {
    if !ok {
        assert!(
            !ci(),
            "{what} (CI is set, so a missing requirement fails instead of skipping; \
             scripts/setup.sh installs the tools)"
        );
        eprintln!("SKIP: {what}");
    }
    ok
}

/// Whether `tool` is an executable on `PATH`, by [`require_that`]'s rule.
///
/// # Panics
/// When it is missing under CI.
pub fn require(tool: &str) -> bool {
    require_that(
        on_path(tool),
        format_args!("{tool} not found on PATH (run scripts/setup.sh)"),
    )
}

/// Whether `tool` is an executable file in a `PATH` directory (no skip rule applied).
pub fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The repository's `testdata/` directory.
pub fn testdata_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// `testdata/<rel>` when `testdata/<rel>/<marker>` exists, else `None` by
/// [`require_that`]'s rule (test data belongs in the repository: missing under CI fails).
///
/// # Panics
/// When missing under CI.
pub fn testdata(rel: &str, marker: &str) -> Option<PathBuf> {
    let dir = testdata_root().join(rel);
    let found = dir.join(marker).exists();
    require_that(
        found,
        format_args!("test data {} not found", dir.join(marker).display()),
    )
    .then_some(dir)
}

/// A seed for [`Rng`]: the environment variable `var` (a decimal number) when set, so that
/// a failing run can be replayed, else the clock (odd, never 0).
pub fn seed(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        })
}

/// A deterministic xorshift64 generator (Marsaglia's 13/7/17 triple), replayable from its
/// seed. Test inputs only: never key material.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0, which xorshift cannot leave, is replaced by a constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// A generator seeded from the environment variable `var` (a decimal number) or, when
    /// it is unset, from the clock; the seed is printed so that a failure can be replayed
    /// with `var=<seed>`. Returns the generator and its seed.
    pub fn from_env(var: &str) -> (Self, u64) {
        let seed = seed(var);
        eprintln!("{var}={seed}");
        (Rng::new(seed), seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// An index in `0..n` (0 when `n` is 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Fills `out` with random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let x = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    }
}

/// `n` random bytes from the OS (keys, passphrases).
///
/// # Panics
/// When `/dev/urandom` cannot be read.
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("reading /dev/urandom");
    b
}

/// Creates `dir/name`, a sparse zero-filled image of `bytes`.
///
/// # Panics
/// When the file cannot be created.
pub fn image(dir: &Path, name: &str, bytes: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p)
        .unwrap_or_else(|e| panic!("creating the image {}: {e}", p.display()));
    f.set_len(bytes)
        .unwrap_or_else(|e| panic!("sizing the image {}: {e}", p.display()));
    p
}

/// Creates `dir/name` holding `content`.
///
/// # Panics
/// When the file cannot be written.
pub fn image_with(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content)
        .unwrap_or_else(|e| panic!("writing the image {}: {e}", p.display()));
    p
}

/// The cheapest PBKDF both cryptsetup and ucrypt take (PBKDF2, 1000 iterations):
/// keyslots made in a moment, for tests about anything but the key derivation.
pub const CHEAP_PBKDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// The smallest LUKS2 metadata and keyslots areas (16 KiB of JSON, 512 KiB of keyslots),
/// for a header on a small image.
pub const SMALL_LUKS2: [&str; 4] = [
    "--luks2-metadata-size",
    "16k",
    "--luks2-keyslots-size",
    "512k",
];

/// `luksFormat -q --type luks2` with [`CHEAP_PBKDF`] and the passphrase in `key_file`,
/// then `extra` and `image`: the arguments cryptsetup and ucrypt both take to make a LUKS2
/// test volume in a moment (the program is the caller's).
pub fn luks2_format_args<'a>(key_file: &'a str, extra: &[&'a str], image: &'a str) -> Vec<&'a str> {
    let mut a = vec!["luksFormat", "-q", "--type", "luks2"];
    a.extend(CHEAP_PBKDF);
    a.extend(["--key-file", key_file]);
    a.extend(extra);
    a.push(image);
    a
}

/// The repository's root directory.
///
/// # Panics
/// When it does not exist (the crate is not inside the repository).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root exists")
}

/// Runs `script` with `args` as root in a guest of the repository's VM harness
/// (`tests/lab/run.sh`, described in `tests/lab/README.md`), from the repository's root,
/// which the guest shares read-write; `env` adds the harness's variables (`LAB_TIMEOUT`,
/// `LAB_MODULES`, ...). Prints what the guest printed and returns its output (stdout and
/// stderr together) when the script succeeded. `None` when the guest could not start (the
/// harness's status 125: no QEMU, no kernel), by [`require_that`]'s rule.
///
/// # Panics
/// When the script fails, the guest runs past `LAB_TIMEOUT` (124), or it could not start
/// under CI.
pub fn run_in_vm<I, S>(script: &Path, args: I, env: &[(&str, &str)]) -> Option<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let root = repo_root();
    let out = std::process::Command::new("bash")
        .arg(root.join("tests/lab/run.sh"))
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(&root)
        .output()
        .expect("running tests/lab/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    match out.status.code() {
        Some(0) => Some(stdout),
        Some(125) => {
            require_that(
                false,
                format_args!(
                    "the VM for {} did not start: {}",
                    script.display(),
                    stderr.trim()
                ),
            );
            None
        }
        Some(124) => panic!(
            "{} ran past LAB_TIMEOUT in the VM; output above",
            script.display()
        ),
        status => panic!(
            "{} failed in the VM (status {status:?}); output above",
            script.display()
        ),
    }
}

/// Fails unless a lab script's output (from [`run_in_vm`]) reports its checks (a line
/// `N passed, 0 failed`) and none of them failed (no `not ok` line).
///
/// # Panics
/// When the report is missing or a check failed (the output was printed by [`run_in_vm`]).
pub fn assert_lab_passed(out: &str) {
    assert!(
        out.lines().any(|l| l.ends_with(" passed, 0 failed")),
        "the lab script did not report its checks (output above)"
    );
    assert!(!out.contains("not ok"), "a lab check failed (output above)");
}

/// The JSON text of the LUKS2 header at the start of `path` (the primary copy's JSON area,
/// bytes 4096 to 16384, up to its first NUL), as it is on disk.
///
/// # Panics
/// When the file cannot be read, is shorter than the area, or the text is not UTF-8.
pub fn luks2_json(path: &Path) -> String {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let area = &b[4096..16384];
    let end = area.iter().position(|&c| c == 0).unwrap_or(area.len());
    String::from_utf8(area[..end].to_vec())
        .unwrap_or_else(|e| panic!("{}: the JSON area is not UTF-8: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xorshift64_matches_marsaglias_sequence_and_replays() {
        // x=1: 1 ^ 1<<13 = 8193; ^ >>7 = 8193 ^ 64 = 8257; ^ <<17 = 8257 ^ 1082261504.
        let mut r = Rng::new(1);
        assert_eq!(r.next_u64(), 8257 ^ (8257 << 17));
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        assert!(xs.iter().all(|&x| x == b.next_u64()));
        assert_ne!(Rng::new(0).next_u64(), 0);
        assert_eq!(Rng::new(5).below(0), 0);
        assert!((0..1000).all(|_| a.below(7) < 7));
        let mut buf = [0u8; 13];
        a.fill(&mut buf);
        assert!(buf.iter().any(|&x| x != 0));
    }

    #[test]
    fn the_skip_rule_passes_what_is_there() {
        assert!(require_that(true, "never printed"));
        assert!(require("sh"));
        assert!(!on_path("no-such-tool-ucrypt-testkit"));
        if !ci() {
            assert!(!require_that(
                false,
                "testkit self-test: a skipped requirement"
            ));
            assert!(!require("no-such-tool-ucrypt-testkit"));
        }
    }

    #[test]
    fn a_lab_report_passes_only_with_its_checks_and_no_failure() {
        assert_lab_passed("ok 1 - a\nok 2 - b\n2 passed, 0 failed\n");
        for bad in [
            "ok 1 - a\n",
            "ok 1 - a\nnot ok 2 - b\n1 passed, 1 failed\n",
            "not ok 2 - b\n1 passed, 0 failed\n",
        ] {
            assert!(
                std::panic::catch_unwind(|| assert_lab_passed(bad)).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_luks2_json_area_is_read_up_to_its_first_nul() {
        let dir = std::env::temp_dir().join(format!("ucrypt-testkit-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut hdr = vec![0u8; 16384];
        hdr[4096..4096 + 11].copy_from_slice(b"{\"keyslots\"");
        let p = image_with(&dir, "hdr", &hdr);
        assert_eq!(luks2_json(&p), "{\"keyslots\"");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn images_have_the_asked_size_and_content() {
        let dir = std::env::temp_dir().join(format!("ucrypt-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let p = image(&dir, "a.img", 1 << 20);
        assert_eq!(std::fs::metadata(&p).map(|m| m.len()).ok(), Some(1 << 20));
        let q = image_with(&dir, "b.img", b"abc");
        assert_eq!(std::fs::read(&q).ok().as_deref(), Some(&b"abc"[..]));
        assert_eq!(random_bytes(32).len(), 32);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
