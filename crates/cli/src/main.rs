//! The `ucrypt` command: dm-crypt's tables and cryptsetup's words, in userspace.

mod cli;

fn main() -> std::process::ExitCode {
    cli::run()
}
