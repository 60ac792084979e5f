//! Build facts for `ucrypt --version`: the git commit the binary was built from and the
//! libcryptsetup version it was built against (pkg-config). Either is "unknown" when the
//! tool or the repository is missing (a source tarball), never a build failure.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let commit =
        output("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"]).is_some();
    let cryptsetup = output("pkg-config", &["--modversion", "libcryptsetup"])
        .unwrap_or_else(|| "unknown".into());
    println!(
        "cargo:rustc-env=UCRYPT_GIT_COMMIT={commit}{}",
        if dirty { "-dirty" } else { "" }
    );
    println!("cargo:rustc-env=UCRYPT_LIBCRYPTSETUP_VERSION={cryptsetup}");
    // Rebuild when HEAD moves (the file names the branch; the branch's ref names the commit).
    if let Some(dir) = output("git", &["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(head) = output("git", &["symbolic-ref", "-q", "HEAD"]) {
            if let Some(common) = output("git", &["rev-parse", "--git-common-dir"]) {
                println!("cargo:rerun-if-changed={common}/{head}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
