//! The README's and docs/'s command blocks that run without a cluster (marked ```` ```sh test ````)
//! are run as a person would, against `busyguard serve` on its dev certificates, at today's date,
//! and their links lead somewhere: none goes stale unnoticed.

use std::path::Path;
use std::process::Command;

use crate::common::process::{Process, certs};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// README.md and docs/*.md, by path, in that order.
fn documents() -> Vec<(std::path::PathBuf, String)> {
    let mut paths = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<_> =
        std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap().map(|e| e.unwrap().path()).collect();
    docs.sort();
    paths.extend(docs.into_iter().filter(|p| p.extension().is_some_and(|e| e == "md")));
    paths.into_iter().map(|p| (p.clone(), std::fs::read_to_string(p).unwrap())).collect()
}

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
    let blocks: Vec<String> = documents().iter().flat_map(|(_, text)| blocks(text)).collect();
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

#[test]
fn every_link_between_the_documents_leads_to_a_file_that_is_there() {
    let mut links = 0;
    for (path, text) in documents() {
        for (at, _) in text.match_indices("](") {
            let target = text[at + 2..].split(')').next().unwrap();
            if target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap();
            links += 1;
            assert!(path.parent().unwrap().join(file).exists(), "{}: {target} leads nowhere", path.display());
        }
    }
    assert!(links > 10, "links found: {links}");
}

#[test]
fn every_flag_of_every_command_is_in_docs_configuration() {
    let documented = std::fs::read_to_string(Path::new(ROOT).join("docs/configuration.md")).unwrap();
    let commands = ["serve", "certs", "status", "cleanup", "check", "agent", "dev-webhooks"];
    let mut flags = 0;
    for command in commands {
        let help = Command::new(env!("CARGO_BIN_EXE_busyguard")).args([command, "--help"]).output().unwrap();
        for line in String::from_utf8(help.stdout).unwrap().lines() {
            let Some(flag) = line.trim_start().trim_start_matches("-n, ").split([' ', '=']).next() else { continue };
            if !flag.starts_with("--") || flag == "--help" {
                continue;
            }
            flags += 1;
            assert!(
                documented.contains(&format!("`{flag}`")),
                "busyguard {command} {flag} is not in docs/configuration.md"
            );
        }
    }
    assert!(flags > 40, "flags found: {flags}");
}

/// A build between releases says so (`-dev`, with the version to come), and its changes are
/// under the CHANGELOG's **Unreleased** heading for that version; every release is dated and has
/// the part that says what to re-apply.
#[test]
fn the_version_tells_a_release_from_a_build_between_releases_and_the_changelog_dates_each_release() {
    let changelog = std::fs::read_to_string(Path::new(ROOT).join("CHANGELOG.md")).unwrap();
    let headings: Vec<&str> = changelog.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    let released: Vec<&&str> = headings.iter().filter(|h| !h.starts_with("Unreleased")).collect();
    match busyguard::VERSION.strip_suffix("-dev") {
        Some(next) => {
            assert_eq!(headings[0], format!("Unreleased ({next}-dev)"), "the work since the last release");
            assert!(!released.iter().any(|h| h.starts_with(&format!("{next} "))), "{next} is not released yet");
        }
        None => assert!(released[0].starts_with(&format!("{} (", busyguard::VERSION)), "a release is at the top"),
    }
    for heading in &released {
        let date = heading.split_once(" (").and_then(|(_, d)| d.strip_suffix(')')).unwrap_or_default();
        assert!(jiff::civil::Date::strptime("%Y-%m-%d", date).is_ok(), "not dated: {heading}");
    }
    let top = changelog.split("\n## ").nth(1).unwrap();
    assert!(top.contains("### Manifests and RBAC"), "the newest entry says what to re-apply");
}

/// The rows of docs/development.md's map under the heading `` `FOLDER/` ``: each file's path and
/// what the row says of it.
fn mapped(development: &str) -> Vec<(String, String)> {
    let map = development.split("## The map").nth(1).and_then(|rest| rest.split("\n## ").next()).unwrap_or_default();
    let mut folder = String::new();
    let mut files = Vec::new();
    for line in map.lines() {
        if let Some(heading) = line.strip_prefix('`').and_then(|l| l.strip_suffix("/`")) {
            folder = heading.to_string();
        } else if let Some((file, says)) = line.strip_prefix("| `").and_then(|l| l.split_once("` | ")) {
            files.push((format!("{folder}/{file}"), says.trim_end_matches(" |").to_string()));
        }
    }
    files
}

/// The first sentence of a file's own doc comment (its leading `//!` paragraph), without its
/// full stop.
fn first_sentence(source: &str) -> String {
    let lines = source.lines().map_while(|line| line.strip_prefix("//!")).map(str::trim);
    let paragraph = lines.take_while(|line| !line.is_empty()).collect::<Vec<_>>().join(" ");
    let sentence = paragraph.split_once(". ").map_or(paragraph.as_str(), |(first, _)| first);
    sentence.trim_end_matches('.').to_string()
}

#[test]
fn the_development_map_names_every_file_of_src_once_and_every_scenario_as_the_suite_runs_them() {
    let development = std::fs::read_to_string(Path::new(ROOT).join("docs/development.md")).unwrap();
    let mut in_tree = Vec::new();
    let mut folders = vec![Path::new(ROOT).join("src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                in_tree.push(path.strip_prefix(ROOT).unwrap().display().to_string());
            }
        }
    }
    in_tree.sort();
    let rows = mapped(&development);
    let mut in_map: Vec<String> = rows.iter().map(|(file, _)| file.clone()).collect();
    in_map.sort();
    assert_eq!(in_map, in_tree, "docs/development.md's map against src/ (each file once, none gone)");
    for (file, says) in &rows {
        let source = std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap();
        assert_eq!(says, &first_sentence(&source), "docs/development.md's row of {file} against its own doc comment");
    }

    // The scenarios as tests/e2e/scenarios/mod.rs lists them, in its order.
    let suite = std::fs::read_to_string(Path::new(ROOT).join("tests/e2e/scenarios/mod.rs")).unwrap();
    let listed = suite.split("scenarios![").nth(1).unwrap().split("];").next().unwrap();
    let scenarios: Vec<&str> =
        listed.lines().map(|l| l.trim().trim_end_matches(',')).filter(|l| !l.is_empty()).collect();
    let section = development.split("## The scenarios").nth(1).unwrap_or_default();
    let documented: Vec<&str> =
        section.lines().filter_map(|l| l.strip_prefix("- `").and_then(|l| l.strip_suffix('`'))).collect();
    assert_eq!(documented, scenarios, "docs/development.md's scenarios against the suite's");
}

/// BENCHMARKS.md is one page a reader can use: today's figures, the method and the targets; every
/// earlier round lives in BENCHMARKS-HISTORY.md, which it links.
#[test]
fn the_benchmarks_page_is_one_page_and_its_history_a_file_of_its_own() {
    let page = std::fs::read_to_string(Path::new(ROOT).join("BENCHMARKS.md")).unwrap();
    assert!(page.lines().count() <= 300, "BENCHMARKS.md has {} lines", page.lines().count());
    for section in ["## Today's figures", "## Method", "## Targets"] {
        assert!(page.contains(section), "BENCHMARKS.md has no {section:?}");
    }
    assert!(page.contains("](BENCHMARKS-HISTORY.md)"), "it links its history");
    assert!(Path::new(ROOT).join("BENCHMARKS-HISTORY.md").is_file());
}
