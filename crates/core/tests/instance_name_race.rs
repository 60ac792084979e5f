//! Claiming an instance name under contention: many `InstanceDir::create` of one name
//! started together (threads: the name lock is an open-file-description lock, which does
//! not care about processes), with `probe`s (what `status`, `ls` and `close` do) running
//! beside them and, in some rounds, a dead server's directory to clean first. Exactly one
//! wins each round, the others are told the name exists, and the winner's directory is
//! intact when they are done.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Barrier;
use ucrypt::instance::runtime::{self, InstanceDir, InstanceError, Paths, Probe};

#[test]
fn one_of_many_concurrent_creates_of_a_name_wins_and_keeps_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    // The only test in this binary: nothing else reads the variable meanwhile.
    std::env::set_var("UCRYPT_RUNTIME_DIR", tmp.path().join("run"));
    const CREATORS: usize = 8;
    const PROBERS: usize = 3;
    for round in 0..200 {
        let paths = Paths::of("race").unwrap();
        if round % 2 == 1 {
            // What a server killed with -9 leaves: its directory and pid file, no lock.
            std::fs::create_dir_all(&paths.dir).unwrap();
            std::fs::write(paths.pid(), "999999\n").unwrap();
        }
        let barrier = Barrier::new(CREATORS + PROBERS);
        let (created, probed): (Vec<_>, Vec<_>) = std::thread::scope(|s| {
            let creators: Vec<_> = (0..CREATORS)
                .map(|_| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        InstanceDir::create("race", false)
                    })
                })
                .collect();
            let probers: Vec<_> = (0..PROBERS)
                .map(|_| {
                    let (barrier, paths) = (&barrier, &paths);
                    s.spawn(move || {
                        barrier.wait();
                        runtime::probe(paths).map(|p| matches!(p, Probe::Live { .. }))
                    })
                })
                .collect();
            (
                creators.into_iter().map(|t| t.join().unwrap()).collect(),
                probers.into_iter().map(|t| t.join().unwrap()).collect(),
            )
        });
        for p in probed {
            p.unwrap_or_else(|e| panic!("round {round}: probe failed: {e}"));
        }
        let mut winners = Vec::new();
        for c in created {
            match c {
                Ok(dir) => winners.push(dir),
                Err(InstanceError::Exists { .. }) => {}
                Err(e) => panic!("round {round}: a loser got {e:#?}, not 'exists'"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        let dir = winners.pop().unwrap();
        assert!(
            dir.paths.lock().exists(),
            "round {round}: the winner's directory was taken from under it"
        );
        assert!(!dir.paths.pid().exists(), "round {round}: debris left");
        assert!(matches!(runtime::probe(&dir.paths), Ok(Probe::Live { .. })));
        drop(dir);
        assert!(matches!(runtime::probe(&paths), Ok(Probe::Absent)));
    }
    // Nothing is left but the name lock itself.
    let left: Vec<String> = std::fs::read_dir(tmp.path().join("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, [".race.lock"]);
}
