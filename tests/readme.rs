//! The README's command blocks that run without a cluster (marked ```` ```sh test ````) are run
//! as a person would, against `busyguard serve` on its dev certificates, at today's date: none
//! goes stale unnoticed.

mod common;

use std::path::Path;
use std::process::Command;

use common::process::{Process, certs};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The blocks marked to run, in order.
fn blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in markdown.lines() {
        match (&mut open, line.trim_end()) {
            (None, "```sh test") => open = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                open = None;
            }
            (Some(block), line) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// Runs `block` from the project's root as bash does, with the README's addresses and CA file
/// pointed at `server`'s; its stdout.
fn run(block: &str, server: &Process, dir: &Path) -> String {
    let block = block
        .replace("127.0.0.1:8443", &server.webhook.to_string())
        .replace("127.0.0.1:8080", &server.admin.to_string())
        .replace("certs/ca.crt", &dir.join("certs/ca.crt").display().to_string());
    let output = Command::new("bash").args(["-eo", "pipefail", "-c", &block]).current_dir(ROOT).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{block}\nfailed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_quick_start_answers_as_the_readme_says_today() {
    for tool in ["curl", "python3", "sed"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap();
        assert!(found.status.success(), "the README's commands need {tool}: install it (e.g. apt-get install {tool})");
    }
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let blocks = blocks(&readme);
    // What each block's output shows, as the README's text around it says.
    let expected: [&[&str]; 3] = [
        &["\"allowed\": true", "\"patchType\": \"JSONPatch\""],
        &["busyguard.io~1busy-since", "busyguard.io~1idle-cost", "busyguard.io~1protected"],
        &["\"allowed\": false", "\"code\": 429", "to force: kubectl label pod"],
    ];
    assert_eq!(blocks.len(), expected.len(), "every block marked to run has its expectation here");
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path());
    let server = Process::serve(dir.path(), &["--no-cluster"]);
    for (block, shows) in blocks.iter().zip(expected) {
        let output = run(block, &server, dir.path());
        for shown in shows {
            assert!(output.contains(shown), "{block}\nshows no {shown}: {output}");
        }
    }
}
