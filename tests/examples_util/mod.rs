//! Finding the example binaries from an integration test: `cargo test` builds the examples, but
//! `CARGO_BIN_EXE_*` only exists for `[[bin]]` targets, so they are looked up under
//! `target/<profile>/examples/`, next to the `deps/` directory holding the test executable.
#![allow(dead_code)]

use std::path::PathBuf;

/// `target/<profile>/examples/<name>`, located from this test executable's path.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/seeds_examples-<hash>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable is not under target/<profile>/deps");
    let dir = profile_dir.join("examples");
    let exact = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if exact.is_file() {
        return exact;
    }
    // Fall back to the newest hashed copy, examples/<name>-<hash>.
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let p = entry.path();
        let file = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
        let Some(hash) = file.strip_prefix(&format!("{name}-")) else {
            continue;
        };
        let hash = hash
            .strip_suffix(std::env::consts::EXE_SUFFIX)
            .unwrap_or(hash);
        if hash.is_empty() || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(mtime) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if best.as_ref().map_or(true, |(t, _)| mtime > *t) {
            best = Some((mtime, p));
        }
    }
    best.map(|(_, p)| p).unwrap_or_else(|| {
        panic!(
            "example {name} not found in {} (run `cargo build --examples`)",
            dir.display()
        )
    })
}

#[path = "../common/netns.rs"]
mod netns;
#[allow(unused_imports)]
pub use netns::private_netns;
