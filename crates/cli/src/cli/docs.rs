//! `ucrypt completions SHELL` and `ucrypt man DIR`: shell completions and man pages
//! generated from the command-line definition itself (clap_complete, clap_mangen), so they
//! never drift from what the binary accepts.

use super::{CliError, WithCode, EXIT_PARAMS};
use anyhow::Context;
use clap::CommandFactory;
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

/// Prints the completion script for the shell to standard output, e.g.
/// `ucrypt completions bash > /etc/bash_completion.d/ucrypt`.
pub(crate) fn completions(a: CompletionsArgs) -> Result<(), CliError> {
    use std::io::Write;
    let mut cmd = super::Cli::command();
    // Into memory first: clap_complete panics when its writer fails (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "ucrypt", &mut script);
    match std::io::stdout().write_all(&script) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(anyhow::anyhow!("writing the completion script: {e}").into()),
    }
}

/// Writes the man pages, e.g. `ucrypt man /usr/local/share/man/man1`.
pub(crate) fn man(a: ManArgs) -> Result<(), CliError> {
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("creating {}", a.dir.display()))
        .code(EXIT_PARAMS)?;
    let cmd = super::Cli::command();
    let write = |name: &str, page: clap::Command| -> Result<(), CliError> {
        let path = a.dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page)
            .render(&mut out)
            .with_context(|| format!("rendering {name}.1"))?;
        std::fs::write(&path, out)
            .with_context(|| format!("writing {}", path.display()))
            .code(EXIT_PARAMS)?;
        Ok(())
    };
    for sub in cmd.get_subcommands() {
        let name = format!("ucrypt-{}", sub.get_name());
        // The page's title is the full command (`ucrypt-luksOpen`), as git and cargo name
        // theirs. clap takes `&'static str` names (without its "string" feature); a few
        // dozen short strings leaked once by a command that then exits.
        let title: &'static str = Box::leak(name.clone().into_boxed_str());
        write(&name, sub.clone().name(title))?;
    }
    write("ucrypt", cmd)?;
    Ok(())
}
