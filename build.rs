//! The commit busyguard is built from, for `busyguard --version`, its start-up log and the
//! `busyguard_build_info` metric: `BUSYGUARD_COMMIT` when set (a container build, which has no
//! `.git`), else git's, else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=BUSYGUARD_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let from_git = || {
        let output = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
        output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let commit = std::env::var("BUSYGUARD_COMMIT").ok().filter(|c| !c.is_empty()).or_else(from_git);
    println!("cargo:rustc-env=BUSYGUARD_COMMIT={}", commit.unwrap_or_else(|| "unknown".into()));
}
