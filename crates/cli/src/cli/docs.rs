//! `ucrypt completions SHELL` and `ucrypt man DIR`: shell completions and man pages
//! generated from the command-line definition itself (clap_complete, clap_mangen), so they
//! never drift from what the binary accepts.

use super::{CliError, WithCode, EXIT_PARAMS};
use anyhow::Context;
use std::path::PathBuf;

/// Arguments of `ucrypt completions`.
#[derive(clap::Args)]
pub(crate) struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

/// Arguments of `ucrypt man`.
#[derive(clap::Args)]
pub(crate) struct ManArgs {
    /// Directory for ucrypt.1 and one ucrypt-COMMAND.1 per command (created if missing).
    dir: PathBuf,
}

/// The commands whose first argument is a running instance's name.
pub(crate) const NAME_COMMANDS: [&str; 6] = [
    "close",
    "status",
    "luksSuspend",
    "luksResume",
    "resize",
    "refresh",
];

/// Stands for "a live instance's name" in clap's script, where the shell's own function
/// then goes: clap_complete's static scripts cannot ask the binary at TAB time (its
/// dynamic completion is unstable), so the function the script calls asks
/// `ucrypt ls --names`, which changes nothing and asks no server.
const MARK: &str = "UCRYPT_INSTANCE_NAMES";

/// The completion script of `shell`: clap's, with live instance names offered for the
/// NAME of [`NAME_COMMANDS`] and for `reencrypt --active-name` (bash, zsh, fish; the
/// other shells get clap's script alone).
pub(crate) fn completion_script(shell: clap_complete::Shell) -> String {
    use clap_complete::Shell;
    let mut cmd = super::cli_command();
    let dynamic = matches!(shell, Shell::Bash | Shell::Zsh | Shell::Fish);
    if dynamic {
        for sub in NAME_COMMANDS {
            cmd = cmd.mut_subcommand(sub, |c| c.mut_arg("name", |a| a.value_parser([MARK])));
        }
        cmd = cmd.mut_subcommand("reencrypt", |c| {
            c.mut_arg("active_name", |a| a.value_parser([MARK]))
        });
    }
    // Into memory first: clap_complete panics when its writer fails (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "ucrypt", &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    match shell {
        Shell::Bash => bash_names(&script, &cmd),
        Shell::Zsh => zsh_names(&script),
        Shell::Fish => fish_names(&script),
        _ => script,
    }
}

/// bash: clap's `_ucrypt` runs first; then, when the word is the NAME of one of
/// [`NAME_COMMANDS`] (the first word after the command that is neither an option nor an
/// option's value) or the value of `--active-name`, the live names replace its answer.
fn bash_names(script: &str, cmd: &clap::Command) -> String {
    let mut valued: Vec<String> = Vec::new();
    let subs = NAME_COMMANDS
        .iter()
        .filter_map(|n| cmd.find_subcommand(n))
        .chain(std::iter::once(cmd));
    for c in subs {
        for a in c.get_arguments().filter(|a| !a.is_positional()) {
            if !a.get_action().takes_values() {
                continue;
            }
            valued.extend(a.get_long().map(|l| format!("--{l}")));
            valued.extend(a.get_short().map(|s| format!("-{s}")));
        }
    }
    valued.sort();
    valued.dedup();
    // clap lists the marker among the values it offers; the function below decides.
    let script = script.replace(MARK, "");
    let registered = script
        .replace(
            "complete -F _ucrypt -o nosort -o bashdefault -o default ucrypt",
            "complete -F _ucrypt_with_instances -o nosort -o bashdefault -o default ucrypt",
        )
        .replace(
            "complete -F _ucrypt -o bashdefault -o default ucrypt",
            "complete -F _ucrypt_with_instances -o bashdefault -o default ucrypt",
        );
    format!(
        r#"{registered}
# Live instance names (ucrypt ls --names) for the NAME of {commands} and for
# reencrypt --active-name.
_ucrypt_with_instances() {{
    _ucrypt "$@"
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local valued=" {valued} " i w sub="" pos=0 skip=""
    if [[ $prev == --active-name ]]; then
        _ucrypt_offer_instances "$cur"
        return 0
    fi
    [[ $cur == -* ]] && return 0
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${{COMP_WORDS[i]}}
        if [[ -n $skip ]]; then skip=""; continue; fi
        case $w in
            --*=*) ;;
            -*) [[ $valued == *" $w "* ]] && skip=1 ;;
            *) if [[ -z $sub ]]; then sub=$w; else pos=$((pos + 1)); fi ;;
        esac
    done
    [[ -n $skip || $pos != 0 ]] && return 0
    case $sub in
        {cases}) _ucrypt_offer_instances "$cur" ;;
    esac
    return 0
}}

# Without a live instance clap's answer stays (the options).
_ucrypt_offer_instances() {{
    local names
    names=$(ucrypt ls --names 2>/dev/null)
    [[ -n $names ]] && COMPREPLY=($(compgen -W "$names" -- "$1"))
}}
"#,
        commands = NAME_COMMANDS.join(", "),
        valued = valued.join(" "),
        cases = NAME_COMMANDS.join("|"),
    )
}

/// zsh: the marker is the action of the NAME positionals and of `--active-name`; a
/// function offering the live names takes its place.
fn zsh_names(script: &str) -> String {
    let body = script.replace(&format!("({MARK})"), "_ucrypt_instances");
    let helper = r#"
# Live instance names (ucrypt ls --names).
_ucrypt_instances() {
    local -a names
    names=(${(f)"$(ucrypt ls --names 2>/dev/null)"})
    compadd -a names
}
"#;
    match body.find(
        "
_ucrypt() {",
    ) {
        Some(at) => format!("{}{helper}{}", &body[..at], &body[at..]),
        None => format!("{body}{helper}"),
    }
}

/// fish: clap gives the marker as `--active-name`'s values only; the NAME positionals get
/// a line of their own. A function printing the live names takes the marker's place.
fn fish_names(script: &str) -> String {
    let body = script.replace(MARK, "(__fish_ucrypt_instances)");
    format!(
        "# Live instance names (ucrypt ls --names).\n\
         function __fish_ucrypt_instances\n    ucrypt ls --names 2>/dev/null\nend\n\n\
         {body}\n\
         complete -c ucrypt -n \"__fish_ucrypt_using_subcommand {}\" -f -a \
         \"(__fish_ucrypt_instances)\"\n",
        NAME_COMMANDS.join(" ")
    )
}

/// Prints the completion script for the shell to standard output, e.g.
/// `ucrypt completions bash > /etc/bash_completion.d/ucrypt`.
pub(crate) fn completions(a: CompletionsArgs) -> Result<(), CliError> {
    use std::io::Write;
    let script = completion_script(a.shell);
    match std::io::stdout().write_all(script.as_bytes()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(anyhow::anyhow!("writing the completion script: {e}").into()),
    }
}

/// Exit codes, as cryptsetup(8)'s RETURN CODES.
const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
As cryptsetup's:
.TP
.B 0
success (for
.BR isLuks :
a LUKS device)
.TP
.B 1
wrong parameters, or the command failed (for
.BR isLuks :
not a LUKS device)
.TP
.B 2
no permission, or a wrong passphrase
.TP
.B 3
out of memory
.TP
.B 4
wrong device: missing, too small, not the type asked for, a front end not available
here; an inactive instance for
.B status
.TP
.B 5
busy: the name or the image is in use by another instance, or a device is open
(mounted) where that is refused
"#;

/// Where instances live, for the pages of commands that open or find them.
const FILES: &str = r#".SH FILES
.TP
.I RUNDIR
The runtime directory: \fB/run/ucrypt\fR for root; otherwise
\fB$XDG_RUNTIME_DIR/ucrypt\fR, or \fB/tmp/ucrypt\-UID\fR (\fB$TMPDIR\fR if set) when
\fBXDG_RUNTIME_DIR\fR is unset (as under \fBsu \-\fR);
\fB$UCRYPT_RUNTIME_DIR\fR overrides all three. Made mode 0700; refused when it belongs
to another user or others can write it.
.TP
.I RUNDIR/NAME/
An instance: \fBpid\fR, \fBinstance.json\fR (device, type, cipher, front end, node,
NBD URI), \fBcontrol.sock\fR (what status, close, luksSuspend, luksResume, resize and
refresh talk to), \fBnbd.sock\fR (the NBD export, mode 0600), \fBlog\fR (the server's
messages once in the background), \fBfuse/NAME\fR (the FUSE front end's file). Removed
by close, or by the next command that finds its server dead.
.TP
.I /dev/ucrypt/NAME
Root's instance's stable path: a symbolic link to its node (\fB/dev/ublkbN\fR,
\fB/dev/nbdN\fR or the FUSE file), made by open, removed by close; a user's is
\fBRUNDIR/NAME/node\fR.
.TP
.I RUNDIR/.NAME.lock
The lock that holds the name while its server lives (never removed).
.TP
.I IMAGE
A mapping holds its image with open-file-description locks on bytes past the image's
end (as QEMU does; \fB\-\-shared\fR shares them); header-changing commands take the same
locks. Block devices are also opened with O_EXCL.
.TP
.I /run/cryptsetup
libcryptsetup's metadata locks (\fB\-\-disable\-locks\fR skips them).
"#;

/// The environment ucrypt reads.
const ENVIRONMENT: &str = r#".SH ENVIRONMENT
.TP
.B UCRYPT_RUNTIME_DIR
The runtime directory (see FILES), for tests, containers and several users sharing one.
.TP
.B XDG_RUNTIME_DIR
A user's runtime directory is \fB$XDG_RUNTIME_DIR/ucrypt\fR; set it when
\fB/tmp/ucrypt\-UID\fR is not usable (another user made it first).
.TP
.B TMPDIR
Where \fBucrypt\-UID\fR is made without XDG_RUNTIME_DIR, the private socket directory of
a foreground \fBopen\fR, and \fBdemo\fR's directory.
.TP
.BR CEPH_CONF ", " CEPH_ARGS
librados' configuration for \fBrbd:\fR devices (see \fB\-\-ceph\-conf\fR).
"#;

/// EXAMPLES of the main page and of the commands a newcomer uses first.
fn examples(command: Option<&str>) -> Option<&'static str> {
    Some(match command {
        None => {
            r#".SH EXAMPLES
.nf
ucrypt demo                          # the whole cycle on a small volume
ucrypt luksFormat disk.img           # a new LUKS2 volume
ucrypt open disk.img secret          # prints the node: /dev/ublkb0, /dev/nbd0 or a FUSE file
mount /dev/ublkb0 /mnt               # as root; a user: fuse2fs FILE ~/mnt
umount /mnt
ucrypt close secret
ucrypt open disk.img \-\-socket /tmp/s.sock   # NBD in the foreground, for QEMU or nbdcopy
.fi
"#
        }
        Some("open") => {
            r#".SH EXAMPLES
.nf
ucrypt open disk.img secret                   # LUKS, a named instance (auto front end)
ucrypt open \-\-device fuse disk.img secret     # a file, no root needed
ucrypt open \-\-type plain \-\-cipher aes\-xts\-plain64 \-s 512 disk.img scratch
ucrypt open \-\-key\-file key disk.img secret    # no prompt
ucrypt open disk.img \-\-run 'nbdcopy "$uri" copy.raw'   # foreground, stop when done
ucrypt open \-\-recover disk.img secret         # reattach after the server died
.fi
"#
        }
        Some("close") => {
            r#".SH EXAMPLES
.nf
ucrypt close secret              # refused (exit 5) while mounted
ucrypt close \-\-deferred secret   # when the last user goes
.fi
"#
        }
        Some("status") => {
            r#".SH EXAMPLES
.nf
ucrypt status secret
ucrypt status secret \-\-json
ucrypt status                    # every instance
.fi
"#
        }
        Some("luksFormat") => {
            r#".SH EXAMPLES
.nf
ucrypt luksFormat disk.img                       # LUKS2, aes\-xts\-plain64, argon2id
ucrypt luksFormat \-\-type luks1 disk.img
ucrypt luksFormat \-q \-\-key\-file key disk.img      # no questions
.fi
"#
        }
        _ => return None,
    })
}

/// Commands whose pages get FILES and ENVIRONMENT: they make or find named instances.
const INSTANCE_COMMANDS: &[&str] = &[
    "open",
    "close",
    "status",
    "ls",
    "luksSuspend",
    "luksResume",
    "resize",
    "refresh",
    "reencrypt",
    "demo",
];

/// One page: clap_mangen's sections, then EXIT STATUS, FILES, ENVIRONMENT and EXAMPLES.
fn render_page(cmd: clap::Command, command: Option<&str>) -> std::io::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cmd.clone())
        .source(format!("ucrypt {}", env!("CARGO_PKG_VERSION")))
        .manual("User Commands");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out)?;
    }
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut out)?;
    }
    out.extend_from_slice(EXIT_STATUS.as_bytes());
    if command.is_none_or(|c| INSTANCE_COMMANDS.contains(&c)) {
        out.extend_from_slice(FILES.as_bytes());
        out.extend_from_slice(ENVIRONMENT.as_bytes());
    }
    if let Some(e) = examples(command) {
        out.extend_from_slice(e.as_bytes());
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(&mut out)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out)?;
    }
    Ok(out)
}

/// Writes the man pages, e.g. `ucrypt man /usr/local/share/man/man1`.
pub(crate) fn man(a: ManArgs) -> Result<(), CliError> {
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("creating {}", a.dir.display()))
        .code(EXIT_PARAMS)?;
    let cmd = super::cli_command();
    let write = |name: &str, page: Vec<u8>| -> Result<(), CliError> {
        let path = a.dir.join(format!("{name}.1"));
        std::fs::write(&path, page)
            .with_context(|| format!("writing {}", path.display()))
            .code(EXIT_PARAMS)?;
        Ok(())
    };
    for sub in cmd.get_subcommands() {
        let name = sub.get_name();
        // The page is ucrypt-COMMAND (as git's and cargo's are), its synopsis the command
        // as typed: `ucrypt open ...`.
        let page = sub
            .clone()
            .display_name(format!("ucrypt-{name}"))
            .bin_name(format!("ucrypt {name}"));
        let text =
            render_page(page, Some(name)).with_context(|| format!("rendering ucrypt-{name}.1"))?;
        write(&format!("ucrypt-{name}"), text)?;
    }
    let text = render_page(cmd, None).context("rendering ucrypt.1")?;
    write("ucrypt", text)?;
    Ok(())
}
