//! A real terminal for the prompt and progress tests: a tmux session running a plain shell.
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmux session with a plain shell (clean environment plus `env`), killed on drop.
pub struct Tmux(pub String);

impl Tmux {
    /// Starts session `ucrypt-TAG-PID`, 200x50, `bash --norc` with `PATH`, `TERM` and `env`.
    pub fn new(tag: &str, env: &[(&str, &str)]) -> Tmux {
        let s = format!("ucrypt-{tag}-{}", std::process::id());
        let extra: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        tmux(&[
            "new-session",
            "-d",
            "-s",
            &s,
            "-x",
            "200",
            "-y",
            "50",
            &format!("env -i PATH=/usr/bin:/bin TERM=xterm {extra}bash --norc --noprofile"),
        ]);
        Tmux(s)
    }

    /// The pane's text.
    pub fn pane(&self) -> String {
        tmux(&["capture-pane", "-p", "-t", &self.0])
    }

    /// Waits up to `secs` for `needle` in the pane; returns the pane.
    pub fn wait(&self, needle: &str, secs: u64) -> String {
        self.wait_count(needle, 1, secs)
    }

    /// Waits up to `secs` until `needle` shows at least `n` times; returns the pane.
    pub fn wait_count(&self, needle: &str, n: usize, secs: u64) -> String {
        self.wait_until(&format!("{needle:?} (x{n})"), secs, |text| {
            text.matches(needle).count() >= n
        })
    }

    /// Waits up to `secs` until `done` holds for the pane's text; returns the pane.
    pub fn wait_until(&self, what: &str, secs: u64, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self.pane();
            if done(&text) {
                return text;
            }
            assert!(Instant::now() < deadline, "no {what} in the pane:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Types `keys` (tmux key names: text, `Enter`, `C-c`).
    pub fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.0];
        args.extend_from_slice(keys);
        tmux(&args);
    }

    /// Waits for `prompt` and for the terminal to stop echoing, then types `text` and Enter.
    pub fn answer(&self, prompt: &str, text: &str) {
        self.answer_nth(prompt, 1, text);
    }

    /// As `answer`, at the `n`-th showing of `prompt` in the pane. A passphrase reader
    /// prints its prompt and then switches echo off with `TCSAFLUSH`, which discards what
    /// was typed in between: typing as soon as the prompt shows loses the keys now and then.
    pub fn answer_nth(&self, prompt: &str, n: usize, text: &str) {
        self.wait_count(prompt, n, 20);
        let tty = tmux(&["display", "-p", "-t", &self.0, "#{pane_tty}"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new("stty")
                .args(["-F", tty.trim(), "-a"])
                .output()
                .unwrap();
            let flags = String::from_utf8_lossy(&out.stdout);
            if flags.split([' ', ';', '\n']).any(|w| w == "-echo") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "echo never switched off after {prompt:?}:\n{}",
                self.pane()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.send(&[text, "Enter"]);
    }

    /// Runs `clear` and waits until `gone` no longer shows (so that the next wait cannot
    /// match the previous command's output).
    pub fn clear(&self, gone: &str) {
        self.send(&["clear", "Enter"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pane().contains(gone) {
            assert!(
                Instant::now() < deadline,
                "clear did not clear:\n{}",
                self.pane()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

/// Runs `tmux ARGS`, asserting success; its stdout.
fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().unwrap();
    assert!(out.status.success(), "tmux {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
