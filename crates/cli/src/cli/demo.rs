//! `ucrypt demo`: the product at work with built-in defaults, for someone who just built
//! it. It runs the commands a user would type (this same binary, each shown before it
//! runs): a small LUKS2 image in a fresh directory, `open` with the automatic front end,
//! an ext4 file system made on the node and a file written into it and read back (with
//! e2fsprogs' `mke2fs` and `debugfs`, which need no root and no mount: the node of a user
//! is a FUSE file), the image checked to hold only ciphertext, `status`, `close`; then
//! where the binary is and what to try next. Without e2fsprogs, or without a node (`--device
//! none`), a sector of text goes through instead, and the demo says why. The image and
//! its key file stay, so the next commands work on them.

use super::{CliError, WithCode, EXIT_DEVICE, EXIT_PARAMS};
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use ucrypt::instance::frontend::Choice;
use ucrypt::open::Backend;

/// `println!` that ignores a closed standard output (`ucrypt demo | head`): the demo still
/// closes its instance.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// Arguments of `ucrypt demo`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Directory to make the demo image in (default: a new one under $TMPDIR or /tmp).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Front end to open the volume with (default auto: what works here).
    #[arg(long, value_name = "KIND", default_value = "auto",
          value_parser = super::open::frontend_parser(&DEMO_FRONTENDS))]
    device: Choice,
}

/// The front ends the demo offers (those that give this host a node, or none).
const DEMO_FRONTENDS: [&str; 5] = {
    use ucrypt::instance::frontend::FrontendKind as K;
    [
        Choice::NAMES[0],
        K::Ublk.as_str(),
        K::Nbd.as_str(),
        K::Fuse.as_str(),
        K::None.as_str(),
    ]
};

/// The demo volume's passphrase (in the key file, so nothing is asked).
const PASSPHRASE: &str = "ucrypt demo passphrase";
/// The image's size: the LUKS2 header's 16 MiB and 16 MiB of data.
const IMAGE_BYTES: u64 = 32 << 20;
/// One encryption sector (LUKS2's default for a file) of text.
const BLOCK: usize = 4096;

/// Runs this binary with `args`, shown first as the user would type it; its standard
/// output is returned (and shown), its standard error passes through.
fn step(args: &[&str]) -> Result<String, CliError> {
    say!("$ ucrypt {}", args.join(" "));
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("finding this program's own path: {e}"))
        .code(EXIT_PARAMS)?;
    let out = Command::new(exe)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| anyhow::anyhow!("running ucrypt {}: {e}", args[0]))
        .code(EXIT_PARAMS)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in stdout.lines() {
        say!("  {line}");
    }
    if !out.status.success() {
        let code = out
            .status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(EXIT_PARAMS);
        return Err(anyhow::anyhow!(
            "the demo stopped: `ucrypt {}` failed (exit {code})",
            args[0]
        ))
        .code(code);
    }
    Ok(stdout)
}

/// The demo's instance: closed however the demo ends.
struct OpenInstance(Option<String>);

impl OpenInstance {
    /// `ucrypt close NAME`, and the check that the instance is gone.
    fn close(mut self) -> Result<(), CliError> {
        let Some(name) = self.0.take() else {
            return Ok(());
        };
        step(&["close", &name])?;
        let dir = ucrypt::instance::runtime::Paths::of(&name)
            .map(|p| p.dir)
            .unwrap_or_default();
        if dir.exists() {
            return Err(anyhow::anyhow!(
                "instance {name} is still there after close ({})",
                dir.display()
            ))
            .code(EXIT_DEVICE);
        }
        Ok(())
    }
}

impl Drop for OpenInstance {
    fn drop(&mut self) {
        if let Some(name) = self.0.take() {
            if let Err(e) = step(&["close", &name]) {
                eprintln!("ucrypt: {}", super::error_line(&e.err));
            }
        }
    }
}

/// Writes `block` at offset 0 of the node (a device or FUSE file, or an NBD URI) and reads
/// it back.
fn write_and_read(node: &str, block: &[u8]) -> Result<Vec<u8>, CliError> {
    let mut back = vec![0u8; block.len()];
    if node.starts_with("nbd") {
        let nbd = ucrypt::open::NbdBackend::connect(node, ucrypt::open::RemoteOptions::default())
            .map_err(|e| anyhow::anyhow!("connecting to {node}: {e}"))
            .code(EXIT_DEVICE)?;
        nbd.write_at(block, 0, true)
            .and_then(|()| nbd.read_at(&mut back, 0))
            .map_err(|e| anyhow::anyhow!("I/O through {node}: {e}"))
            .code(EXIT_DEVICE)?;
        return Ok(back);
    }
    let io = |e: std::io::Error| anyhow::anyhow!("I/O through {node}: {e}");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(node)
        .map_err(io)
        .code(EXIT_DEVICE)?;
    f.write_all_at(block, 0)
        .and_then(|()| f.sync_all())
        .map_err(io)
        .code(EXIT_DEVICE)?;
    drop(f);
    let f = std::fs::File::open(node).map_err(io).code(EXIT_DEVICE)?;
    f.read_exact_at(&mut back, 0)
        .map_err(io)
        .code(EXIT_DEVICE)?;
    Ok(back)
}

/// e2fsprogs' `mke2fs` and `debugfs`, on `PATH` or in the sbin directories a user's `PATH`
/// often lacks.
fn e2fsprogs() -> Option<(PathBuf, PathBuf)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .collect();
    let find = |tool: &str| {
        dirs.iter().map(|d| d.join(tool)).find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    };
    Some((find("mke2fs")?, find("debugfs")?))
}

/// Runs an e2fsprogs tool in `dir`, shown first; its standard output, or an error with its
/// standard error.
fn tool(dir: &Path, exe: &Path, shown: &str, args: &[&str]) -> Result<String, CliError> {
    say!("$ {shown}");
    let out = Command::new(exe)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| anyhow::anyhow!("running {}: {e}", exe.display()))
        .code(EXIT_DEVICE)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // debugfs exits 0 when a request fails, saying so on stderr after its banner.
    let failed = stderr
        .lines()
        .any(|l| !l.starts_with("debugfs ") && !l.starts_with("Allocated inode"));
    if !out.status.success() || failed {
        return Err(anyhow::anyhow!(
            "the demo stopped: `{shown}` failed: {}",
            stderr.trim()
        ))
        .code(EXIT_DEVICE);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An ext4 file system made on `node` and `text` written into it as `hello.txt`, then read
/// back: what it read.
fn through_a_file_system(
    dir: &Path,
    node: &str,
    text: &str,
    (mke2fs, debugfs): (&Path, &Path),
) -> Result<String, CliError> {
    let io = |e: std::io::Error| anyhow::anyhow!("writing {}: {e}", dir.display());
    std::fs::write(dir.join("hello.txt"), text)
        .map_err(io)
        .code(EXIT_PARAMS)?;
    tool(
        dir,
        mke2fs,
        &format!("mke2fs -q -t ext4 -E root_owner -F {node}"),
        &["-q", "-t", "ext4", "-E", "root_owner", "-F", node],
    )?;
    tool(
        dir,
        debugfs,
        &format!("debugfs -w -R 'write hello.txt hello.txt' {node}"),
        &["-w", "-R", "write hello.txt hello.txt", node],
    )?;
    let back = tool(
        dir,
        debugfs,
        &format!("debugfs -R 'cat hello.txt' {node}"),
        &["-R", "cat hello.txt", node],
    )?;
    Ok(back)
}

/// Whether `needle` occurs anywhere in the file at `path`.
fn file_contains(path: &Path, needle: &[u8]) -> std::io::Result<bool> {
    let data = std::fs::read(path)?;
    Ok(data.windows(needle.len()).any(|w| w == needle))
}

/// `ucrypt demo`.
pub(crate) fn run(a: Args) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let dir = match a.dir {
        Some(d) => {
            std::fs::create_dir_all(&d)
                .map_err(|e| anyhow::anyhow!("creating {}: {e}", d.display()))
                .code(EXIT_PARAMS)?;
            d
        }
        None => tempfile::Builder::new()
            .prefix("ucrypt-demo-")
            .tempdir()
            .map_err(|e| anyhow::anyhow!("creating a directory in $TMPDIR: {e}"))
            .code(EXIT_PARAMS)?
            .keep(),
    };
    let image = dir.join("disk.img");
    let key = dir.join("passphrase");
    let shown = |p: &Path| p.display().to_string();
    say!(
        "ucrypt demo: a {} MiB LUKS2 volume in {}, opened, a file written and read through it, closed.\n",
        IMAGE_BYTES >> 20,
        dir.display()
    );
    let file = std::fs::File::create(&image)
        .and_then(|f| f.set_len(IMAGE_BYTES).map(|()| f))
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", image.display()))
        .code(EXIT_PARAMS)?;
    drop(file);
    std::fs::write(&key, PASSPHRASE)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", key.display()))
        .code(EXIT_PARAMS)?;
    say!(
        "1. Format it as LUKS2 (cryptsetup's defaults, but a cheap Argon2id cost so the demo \
         is quick;\n   the passphrase is in {}):",
        key.display()
    );
    step(&[
        "luksFormat",
        "-q",
        "--pbkdf-memory",
        "65536",
        "--pbkdf-force-iterations",
        "4",
        "--key-file",
        &shown(&key),
        &shown(&image),
    ])?;
    let name = format!("demo-{}", std::process::id());
    say!("\n2. Open it as instance {name} (a server in the background; it prints the node):");
    let out = step(&[
        "open",
        "--device",
        a.device.as_str(),
        "--key-file",
        &shown(&key),
        &shown(&image),
        &name,
    ])?;
    let instance = OpenInstance(Some(name.clone()));
    let node = out.lines().last().unwrap_or_default().trim().to_string();

    let text = format!(
        "Hello from ucrypt: written through {node}, stored encrypted in {}.\n",
        image.display()
    );
    let tools = e2fsprogs();
    let why_not = match &tools {
        _ if node.starts_with("nbd") => Some("the front end gives no node, only an NBD socket"),
        None => Some("e2fsprogs (mke2fs, debugfs) is not installed: apt-get install e2fsprogs"),
        Some(_) => None,
    };
    let made_fs = why_not.is_none();
    if let (None, Some((mke2fs, debugfs))) = (why_not, &tools) {
        say!(
            "\n3. Make an ext4 file system on the node and write a file into it (no root, no \
             mount: e2fsprogs\n   works on the node directly), then read the file back:"
        );
        let back = through_a_file_system(&dir, &node, &text, (mke2fs, debugfs))?;
        if back != text {
            return Err(anyhow::anyhow!(
                "hello.txt read back from the file system on {node} is not the one written"
            ))
            .code(EXIT_DEVICE);
        }
        say!("  wrote and read back hello.txt: {}", text.trim_end());
    } else {
        let mut block = text.clone().into_bytes();
        block.resize(BLOCK, 0);
        say!(
            "\n3. Write a sector of text through the node and read it back (no file system: {}):",
            why_not.unwrap_or_default()
        );
        let back = write_and_read(&node, &block)?;
        if back != block {
            return Err(anyhow::anyhow!(
                "the sector read back through {node} is not the one written"
            ))
            .code(EXIT_DEVICE);
        }
        say!("  wrote and read back: {}", text.trim_end());
    }
    let plain_on_disk = file_contains(&image, text.trim_end().as_bytes())
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", image.display()))
        .code(EXIT_DEVICE)?;
    if plain_on_disk {
        return Err(anyhow::anyhow!(
            "{} holds the text in the clear: it was not encrypted",
            image.display()
        ))
        .code(EXIT_DEVICE);
    }
    say!(
        "  {} does not contain the text: only its ciphertext is on disk.",
        image.display()
    );

    say!("\n4. What the instance looks like:");
    step(&["status", &name])?;
    say!("\n5. Close it (flush, detach, stop the server):");
    instance.close()?;

    let exe = std::env::current_exe().map_or_else(|_| "ucrypt".into(), |p| shown(&p));
    let mut o = std::io::stdout().lock();
    let _ = writeln!(
        o,
        "\nDone in {:.1} s: the volume opened, served what was written through it, and kept \
         only ciphertext on disk.\n\
         The binary is {exe}\n\
         (`cargo install --locked --path crates/cli` puts it in ~/.cargo/bin as `ucrypt`).\n\
         \nNext, try it on the same image (the passphrase is \"{PASSPHRASE}\"):\n\
         \n  ucrypt open {img} mine\
         \n  ucrypt status mine{mkfs}\
         \n  mount NODE /mnt                  # NODE: what open printed; as root (a FUSE file:\
         \n                                   # mount -o loop NODE /mnt)\
         \n  fuse2fs NODE ~/mnt               # without root: the FUSE file{ls}\
         \n  umount /mnt; ucrypt close mine   # (fusermount3 -u ~/mnt for fuse2fs)\
         \n  ucrypt --help                    # every command; man pages: ucrypt man DIR\
         \n\nThe README and docs/ say more. The demo's files: rm -r {dir}",
        started.elapsed().as_secs_f64(),
        img = image.display(),
        dir = dir.display(),
        mkfs = if made_fs {
            ""
        } else {
            "\n  mkfs.ext4 -q -E root_owner NODE  # root_owner: the top directory is yours"
        },
        ls = if made_fs {
            "\n  ls -l ~/mnt                      # hello.txt, which the demo wrote"
        } else {
            ""
        },
    );
    Ok(())
}
