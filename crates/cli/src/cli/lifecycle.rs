//! The commands that talk to a running instance by name: `status`, `ls`, `close`,
//! `luksSuspend`, `luksResume`, `resize`, `refresh` (through its control socket, see
//! `ucrypt::instance::control`).

use super::exit::{code_of, instance_error, EXIT_BUSY};
use super::prompt::Terminal;
use super::secret::KeyFileArgs;
use super::{CliError, PerfArgs, TableArg, WithCode, EXIT_DEVICE};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use ucrypt::instance::control::{self, Reply, Request};
use ucrypt::instance::rekey;
use ucrypt::instance::runtime::{self, Debris, InstanceError, Paths, Probe};

/// `ucrypt status [NAME] [--json]`.
#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// The instance (all of them without it).
    name: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `ucrypt ls [--json]`.
#[derive(clap::Args)]
pub(crate) struct LsArgs {
    /// Print JSON.
    #[arg(long, conflicts_with = "names")]
    json: bool,
    /// The live instances' names, one a line, and nothing else: what shell completion
    /// offers (nothing is cleaned up or asked of a server).
    #[arg(long, hide = true)]
    names: bool,
}

/// `ucrypt close NAME`.
#[derive(clap::Args)]
pub(crate) struct CloseArgs {
    /// The instance.
    name: String,
    /// Close even while in use: the users' I/O fails from then on.
    #[arg(long, conflicts_with = "deferred")]
    force: bool,
    /// Close once the last user is gone (at once if there is none).
    #[arg(long)]
    deferred: bool,
    /// Cancel a pending --deferred close (the instance stays open).
    #[arg(long, conflicts_with_all = ["deferred", "force"])]
    cancel_deferred: bool,
}

impl CloseArgs {
    /// A plain `close NAME` (`crypttab close`).
    pub(crate) fn of(name: String) -> CloseArgs {
        CloseArgs {
            name,
            force: false,
            deferred: false,
            cancel_deferred: false,
        }
    }

    /// `close NAME` with `--deferred` or `--cancel-deferred` (`integritysetup close`).
    pub(crate) fn deferred(name: String, deferred: bool, cancel_deferred: bool) -> CloseArgs {
        CloseArgs {
            name,
            force: false,
            deferred,
            cancel_deferred,
        }
    }
}

/// `ucrypt luksSuspend NAME`.
#[derive(clap::Args)]
pub(crate) struct SuspendArgs {
    /// The instance.
    name: String,
}

/// The secret that rebuilds an instance's volume: the passphrase (header instances) or
/// the table line (table instances).
#[derive(clap::Args)]
pub(crate) struct SecretArgs {
    #[command(flatten)]
    key: KeyFileArgs,
    /// For an instance opened from a table line: the line again.
    #[arg(long, conflicts_with = "table_file")]
    table: Option<String>,
    /// For an instance opened from a table line: a file holding it ('-': standard input).
    #[arg(long, value_name = "PATH")]
    table_file: Option<std::path::PathBuf>,
    /// LUKS2 tokens are tried before any passphrase, as by `open` (and cryptsetup's
    /// luksResume, resize and refresh); `--token-only` asks for none (a key file then
    /// holds a token PIN).
    #[command(flatten)]
    token: super::token::UnlockArgs,
}

/// `ucrypt luksResume NAME`.
#[derive(clap::Args)]
pub(crate) struct ResumeArgs {
    /// The instance.
    name: String,
    #[command(flatten)]
    secret: SecretArgs,
    /// How often to ask for the passphrase on a terminal (cryptsetup's default 3; a key
    /// file or a pipe is tried once).
    #[arg(short = 'T', long, default_value_t = 3, value_name = "N")]
    tries: u32,
    /// Accepted as cryptsetup's; the instance already knows its detached header.
    #[arg(long, value_name = "FILE")]
    #[allow(dead_code)]
    header: Option<std::path::PathBuf>,
    /// KEYRING::KEY: add the volume key, once the passphrase opened it, to a kernel keyring
    /// (forms as `open --link-vk-to-keyring`), as cryptsetup 2.7's luksResume. The serving
    /// process adds it, so @s, @u and @us are the keyrings it was started with; a failure
    /// leaves the volume suspended.
    #[arg(long, value_name = "KEYRING::KEY")]
    link_vk_to_keyring: Option<String>,
}

/// `ucrypt resize NAME [--size SECTORS]`.
#[derive(clap::Args)]
pub(crate) struct ResizeArgs {
    /// The instance.
    name: String,
    /// New size in 512-byte sectors (default: all the device holds).
    #[arg(short = 'b', long)]
    size: Option<u64>,
    #[command(flatten)]
    secret: SecretArgs,
}

/// `ucrypt refresh NAME [--perf-*] [--allow-discards]`.
#[derive(clap::Args)]
pub(crate) struct RefreshArgs {
    /// The instance.
    name: String,
    /// Pass discards down (otherwise only the header's persistent flags apply).
    #[arg(long)]
    allow_discards: bool,
    #[command(flatten)]
    perf: PerfArgs,
    #[command(flatten)]
    secret: SecretArgs,
}

/// The live instance `name`, or exit 4 ("NAME is inactive").
pub(crate) fn live(name: &str) -> Result<(Paths, u32), CliError> {
    let p = Paths::of(name).map_err(instance_error)?;
    match runtime::probe(&p).map_err(instance_error)? {
        Probe::Live { pid } => Ok((p, pid)),
        Probe::Dead(debris) => {
            eprintln!("ucrypt: {name}: {debris}");
            Err(instance_error(InstanceError::NotActive(name.to_string())))
        }
        Probe::Absent => Err(instance_error(InstanceError::NotActive(name.to_string()))),
    }
}

/// Sends a request; a refusal becomes an error with the exit code of its kind.
pub(crate) fn call(
    p: &Paths,
    request: &Request,
    secret: Option<&[u8]>,
    timeout: Duration,
) -> Result<Reply, CliError> {
    let reply = control::call(&p.control(), request, secret, timeout)
        .map_err(anyhow::Error::from)
        .code(EXIT_DEVICE)?;
    match reply {
        Reply::Refused { kind, message } => Err(anyhow::anyhow!("{message}")).code(code_of(kind)),
        other => Ok(other),
    }
}

/// The live status of `p` (the description alone if the server does not answer).
fn status_of(p: &Paths) -> Value {
    match call(p, &Request::Status, None, Duration::from_secs(10)) {
        Ok(Reply::Status(st)) => {
            serde_json::to_value(st).unwrap_or_else(|_| json!({"name": p.name}))
        }
        _ => serde_json::to_value(p.read_description().unwrap_or_default())
            .unwrap_or_else(|_| json!({"name": p.name})),
    }
}

fn text(v: &Value, k: &str) -> String {
    match &v[k] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// cryptsetup's `status` layout, plus the front end, node and socket.
fn print_status(v: &Value) {
    let name = text(v, "name");
    let busy = v["in_use"].as_bool() == Some(true);
    if let Ok(st) =
        serde_json::from_value::<ucrypt::integrity::Status>(v["integrity_target"].clone())
    {
        // `integritysetup open`'s instance: integritysetup's layout.
        print!(
            "{}",
            st.text(&ucrypt::integrity::Active {
                name: &name,
                in_use: busy,
                device: &text(v, "device"),
                size_sectors: v["size_sectors"].as_u64().unwrap_or(0),
                read_only: v["read_only"].as_bool() == Some(true),
                failures: v["integrity_failures"].as_u64().unwrap_or(0),
                allow_discards: v["allow_discards"].as_bool() == Some(true),
            })
        );
        print_serving(v);
        return;
    }
    println!(
        "{name} is active{}.",
        if busy { " and is in use" } else { "" }
    );
    println!("  type:    {}", text(v, "type"));
    println!("  cipher:  {}", text(v, "cipher"));
    println!("  keysize: {} bits", text(v, "key_bits"));
    let suspended = v["suspended"].as_bool() == Some(true);
    println!(
        "  key location: {}",
        if suspended {
            "none (suspended: wiped from the server's memory)".to_string()
        } else {
            format!("ucrypt server (pid {})", text(v, "pid"))
        }
    );
    // As cryptsetup status prints a volume with integrity; the failure count is ucrypt's
    // (integritysetup status prints the same count for dm-integrity's own tags).
    if !text(v, "integrity").is_empty() {
        println!("  integrity: {}", text(v, "integrity"));
    }
    if let Some(bits) = v["integrity_key_bits"].as_u64() {
        println!("  integrity keysize: {bits} bits");
    }
    if let Some(n) = v["integrity_failures"].as_u64() {
        println!("  integrity failures: {n}");
    }
    println!("  device:  {}", text(v, "device"));
    if !text(v, "header").is_empty() {
        println!("  header:  {}", text(v, "header"));
    }
    println!("  sector size:  {}", text(v, "sector_size"));
    println!("  offset:  {} sectors", text(v, "offset_sectors"));
    println!("  size:    {} sectors", text(v, "size_sectors"));
    let mode = if v["read_only"].as_bool() == Some(true) {
        "readonly"
    } else {
        "read/write"
    };
    println!(
        "  mode:    {mode}{}",
        if suspended { " (suspended)" } else { "" }
    );
    if v["allow_discards"].as_bool() == Some(true) {
        println!("  flags:   discards");
    }
    print_serving(v);
}

/// The front end, node and socket lines of `status`.
fn print_serving(v: &Value) {
    println!("  front end: {}", text(v, "frontend"));
    let node = text(v, "node");
    println!(
        "  node:    {}",
        if node.is_empty() { "(none)" } else { &node }
    );
    let link = text(v, "link");
    if !link.is_empty() {
        println!("  link:    {link}");
    }
    println!("  nbd:     {}", text(v, "uri"));
    if let Some(n) = v["nbd_connections"].as_u64() {
        println!("  nbd connections: {n}");
    }
}

pub(crate) fn status(a: StatusArgs) -> Result<(), CliError> {
    let Some(name) = a.name else {
        return ls(LsArgs {
            json: a.json,
            names: false,
        });
    };
    let p = Paths::of(&name).map_err(instance_error)?;
    let pid = match runtime::probe(&p).map_err(instance_error)? {
        Probe::Live { pid } => pid,
        Probe::Dead(debris) if !debris.devices.is_empty() => {
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&dead_json(&debris)).unwrap_or_default()
                );
            } else {
                print_dead(&debris);
            }
            return Err(quiet(EXIT_DEVICE));
        }
        dead_or_absent => {
            if let Probe::Dead(debris) = dead_or_absent {
                eprintln!("ucrypt: {name}: {debris}");
            }
            if a.json {
                println!("{}", json!({"name": name, "active": false}));
            } else {
                println!("{name} is inactive.");
            }
            return Err(quiet(EXIT_DEVICE));
        }
    };
    let mut v = status_of(&p);
    if v["pid"].as_u64().unwrap_or(0) == 0 {
        v["pid"] = json!(pid);
    }
    if a.json {
        v["active"] = json!(true);
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print_status(&v);
    }
    Ok(())
}

/// What `status --json` and `ls --json` say of a dead instance whose kernel device
/// remains.
fn dead_json(d: &Debris) -> Value {
    let first = d.devices.first();
    json!({
        "name": d.name,
        "active": false,
        "dead": true,
        "pid": d.pid,
        "frontend": first.map(|o| o.kind.as_str()).unwrap_or_default(),
        "node": first.map(|o| o.node.display().to_string()).unwrap_or_default(),
        "device": d.image,
        "devices": d.devices.iter().map(|o| json!({
            "node": o.node.display().to_string(),
            "frontend": o.kind.as_str(),
            "state": o.state,
        })).collect::<Vec<_>>(),
        "recover": d.recoverable()
            .then(|| format!("ucrypt open --recover {} {}", d.image_or_placeholder(), d.name)),
        "remove": format!("ucrypt close {}", d.name),
    })
}

/// `status NAME` of a dead instance whose kernel device remains.
fn print_dead(d: &Debris) {
    if d.pid == 0 {
        println!("{} is inactive: its server died.", d.name);
    } else {
        println!("{} is inactive: its server (pid {}) died.", d.name, d.pid);
    }
    if !d.image.is_empty() {
        println!("  device:  {}", d.image);
    }
    for o in &d.devices {
        println!(
            "  left:    {} ({}: {})",
            o.node.display(),
            o.kind.as_str(),
            o.state
        );
    }
    if d.recoverable() {
        println!(
            "  recover: ucrypt open --recover {} {}",
            d.image_or_placeholder(),
            d.name
        );
    }
    println!("  remove:  ucrypt close {}", d.name);
}

/// An error whose message was already printed (cryptsetup prints "NAME is inactive." on
/// stdout and exits 4): keep the code, print nothing more.
fn quiet(code: u8) -> CliError {
    CliError {
        code,
        err: anyhow::Error::new(super::Printed),
    }
}

pub(crate) fn ls(a: LsArgs) -> Result<(), CliError> {
    if a.names {
        for n in runtime::live_names() {
            println!("{n}");
        }
        return Ok(());
    }
    let mut all: Vec<Value> = Vec::new();
    for (p, probe) in runtime::scan() {
        match probe {
            Probe::Live { .. } => all.push(status_of(&p)),
            Probe::Dead(debris) => {
                eprintln!("ucrypt: {}: {debris}", p.name);
                if !debris.devices.is_empty() {
                    all.push(dead_json(&debris));
                }
            }
            Probe::Absent => {}
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
        return Ok(());
    }
    if all.is_empty() {
        return Ok(());
    }
    println!(
        "{:<16} {:>8} {:<10} {:<10} {:<30} DEVICE",
        "NAME", "PID", "FRONT", "STATE", "NODE"
    );
    for v in all {
        let state = if v["dead"].as_bool() == Some(true) {
            "dead"
        } else if v["suspended"].as_bool() == Some(true) {
            "suspended"
        } else if v["in_use"].as_bool() == Some(true) {
            "in use"
        } else {
            "active"
        };
        let node = text(&v, "node");
        println!(
            "{:<16} {:>8} {:<10} {:<10} {:<30} {}",
            text(&v, "name"),
            text(&v, "pid"),
            text(&v, "frontend"),
            state,
            if node.is_empty() {
                text(&v, "uri")
            } else {
                node
            },
            text(&v, "device")
        );
    }
    Ok(())
}

pub(crate) fn close(a: CloseArgs) -> Result<(), CliError> {
    // A dead server's instance: its debris (directory, FUSE mount, the kernel device it
    // left, unless that is in use and not --force) is what there is to close; once it is
    // taken away, the close is done.
    let p = Paths::of(&a.name).map_err(instance_error)?;
    if let Some(debris) = runtime::close_dead(&p, a.force).map_err(instance_error)? {
        eprintln!("ucrypt: {}: {debris}", a.name);
        return Ok(());
    }
    let (p, _) = live(&a.name)?;
    if a.cancel_deferred {
        call(&p, &Request::CancelDeferred, None, Duration::from_secs(30))?;
        return Ok(());
    }
    let reply = call(
        &p,
        &Request::Close {
            force: a.force,
            deferred: a.deferred,
        },
        None,
        Duration::from_secs(120),
    )?;
    if matches!(reply, Reply::Deferred { .. }) {
        return Ok(()); // closes by itself once unused, as cryptsetup close --deferred
    }
    // Wait for the server to be gone (flushed, socket and directory removed).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if matches!(runtime::probe(&p), Ok(Probe::Absent | Probe::Dead(_))) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "{} was told to close but its server is still running after 60 s",
                a.name
            ))
            .code(EXIT_BUSY);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn suspend(a: SuspendArgs) -> Result<(), CliError> {
    let (p, _) = live(&a.name)?;
    call(&p, &Request::Suspend, None, Duration::from_secs(300))?;
    Ok(())
}

/// Reads what rebuilds the volume of `p`: its passphrase, or its table line.
/// A passphrase (locked in RAM) or a table text, zeroed on drop either way.
enum Payload {
    Passphrase(super::secret::Secret),
    Table(zeroize::Zeroizing<String>),
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Payload::Passphrase(s) => s,
            Payload::Table(t) => t.as_bytes(),
        }
    }
}

fn read_secret(p: &Paths, s: &SecretArgs) -> Result<Payload, CliError> {
    let desc = p.read_description().unwrap_or_default();
    let table = s.table.is_some() || s.table_file.is_some();
    match rekey::secret(&desc, &p.name, table).map_err(super::exit::lib_error)? {
        rekey::Secret::Table => Ok(Payload::Table(
            TableArg {
                table: s.table.clone(),
                table_file: s.table_file.clone(),
            }
            .text()?,
        )),
        rekey::Secret::Passphrase { device } => {
            super::secret::existing(&s.key, &device).map(Payload::Passphrase)
        }
    }
}

/// The volume key of `p`'s volume through one of its LUKS2 tokens ([`rekey::token_key`]),
/// or None to go on with the passphrase or table line. `tries`: how often a PIN is asked.
fn token_key(
    p: &Paths,
    s: &SecretArgs,
    tries: u32,
) -> Result<Option<ucrypt::luks::VolumeKey>, CliError> {
    let mut tokens = s.token.tokens();
    tokens.pin_tries = tries;
    rekey::token_key(
        &p.read_description().unwrap_or_default(),
        &p.name,
        s.table.is_some() || s.table_file.is_some(),
        tokens,
        s.key.inputs(),
        &mut super::prompt::Terminal::default(),
    )
    .map_err(super::exit::lib_error)
}

/// Sends `request` with the volume key a token gave.
fn call_with_key(
    p: &Paths,
    request: &Request,
    key: &ucrypt::luks::VolumeKey,
) -> Result<(), CliError> {
    let reply = control::call_with_volume_key(
        &p.control(),
        request,
        key.as_bytes(),
        Duration::from_secs(600),
    )
    .map_err(anyhow::Error::from)
    .code(EXIT_DEVICE)?;
    match reply {
        Reply::Refused { kind, message } => Err(anyhow::anyhow!("{message}")).code(code_of(kind)),
        _ => Ok(()),
    }
}

pub(crate) fn resume(a: ResumeArgs) -> Result<(), CliError> {
    let (p, _) = live(&a.name)?;
    if let Some(spec) = &a.link_vk_to_keyring {
        super::unlock_opts::check_link_spec(spec)?;
    }
    let request = Request::Resume {
        link_vk_to_keyring: a.link_vk_to_keyring.clone(),
    };
    if let Some(key) = token_key(&p, &a.secret, a.tries.max(1))? {
        return call_with_key(&p, &request, &key);
    }
    // The library's retry policy; the command's own error (a message the instance already
    // printed, a context chain) is kept as it is, the library sees only its kind.
    let table_given = a.secret.table.is_some() || a.secret.table_file.is_some();
    let mut failed = None;
    let tried = rekey::resume_with_retries(
        &mut Terminal::default(),
        a.tries,
        table_given,
        &a.secret.key.inputs(),
        |_| {
            read_secret(&p, &a.secret)
                .and_then(|secret| call(&p, &request, Some(&secret), Duration::from_secs(600)))
                .map(|_| ())
                .map_err(|e| {
                    let kind = ucrypt::ErrorKind::from_exit_code(e.code());
                    failed = Some(e);
                    ucrypt::Error::Invalid(String::new()).with_kind(kind)
                })
        },
    );
    match (tried, failed) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(e)) => Err(e),
        (Err(e), None) => Err(super::exit::lib_error(e)),
    }
}

pub(crate) fn resize(a: ResizeArgs) -> Result<(), CliError> {
    let (p, _) = live(&a.name)?;
    let request = Request::Resize { size: a.size };
    if let Some(key) = token_key(&p, &a.secret, 3)? {
        return call_with_key(&p, &request, &key);
    }
    let secret = read_secret(&p, &a.secret)?;
    call(&p, &request, Some(&secret), Duration::from_secs(600))?;
    Ok(())
}

pub(crate) fn refresh(a: RefreshArgs) -> Result<(), CliError> {
    let (p, _) = live(&a.name)?;
    let request = Request::Refresh {
        perf: a.perf.options(),
        allow_discards: a.allow_discards,
    };
    if let Some(key) = token_key(&p, &a.secret, 3)? {
        return call_with_key(&p, &request, &key);
    }
    let secret = read_secret(&p, &a.secret)?;
    call(&p, &request, Some(&secret), Duration::from_secs(600))?;
    Ok(())
}
