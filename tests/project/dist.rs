//! `make dist`: the CLI's archives with their SHA-256, and the krew plugin manifest over them.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `scripts/dist.sh --package`, as `make dist` runs it for each platform it built.
fn package(dir: &Path, triple: &str, binary: &str) {
    let status = Command::new(Path::new(ROOT).join("scripts/dist.sh"))
        .args(["--package", triple, binary])
        .env("DIST_DIR", dir)
        .env("DIST_URL", "https://downloads.example.com/busyguard/v1")
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn make_dist_packages_the_cli_for_krew_with_each_archives_sha256() {
    let dir = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_busyguard");
    for triple in ["x86_64-unknown-linux-gnu", "aarch64-apple-darwin", "x86_64-pc-windows-msvc"] {
        package(dir.path(), triple, binary);
    }
    let version = env!("CARGO_PKG_VERSION");
    let manifest = std::fs::read_to_string(dir.path().join("busyguard.yaml")).unwrap();
    let manifest: Value = serde_saphyr::from_str(&manifest).unwrap();
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "busyguard", "installed as kubectl busyguard");
    assert_eq!(manifest["spec"]["version"], format!("v{version}"));
    let platforms = manifest["spec"]["platforms"].as_array().unwrap();
    let on = |os: &str, arch: &str| {
        (platforms.iter())
            .find(|p| p["selector"]["matchLabels"]["os"] == os && p["selector"]["matchLabels"]["arch"] == arch)
            .unwrap_or_else(|| panic!("no {os}/{arch} in {platforms:?}"))
    };
    let linux = on("linux", "amd64");
    on("darwin", "arm64");
    assert_eq!(on("windows", "amd64")["bin"], "busyguard.exe");
    let archive = format!("busyguard-{version}-x86_64-unknown-linux-gnu.tar.gz");
    assert_eq!(linux["uri"], format!("https://downloads.example.com/busyguard/v1/{archive}"));
    assert_eq!(linux["bin"], "busyguard");

    // The sha256 is the archive's, in the manifest and beside it, and the archive runs.
    let sum = Command::new("sha256sum").arg(dir.path().join(&archive)).output().unwrap();
    let sum = String::from_utf8(sum.stdout).unwrap().split_whitespace().next().unwrap().to_string();
    assert_eq!(linux["sha256"], sum.as_str());
    let beside = std::fs::read_to_string(dir.path().join(format!("{archive}.sha256"))).unwrap();
    assert_eq!(beside, format!("{sum}  {archive}\n"), "checkable with sha256sum -c");
    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let status = Command::new("tar").arg("-xzf").arg(dir.path().join(&archive)).arg("-C").arg(&unpacked).status();
    assert!(status.unwrap().success());
    for file in (linux["files"].as_array().unwrap()).iter().map(|f| f["from"].as_str().unwrap()) {
        assert!(unpacked.join(file).exists(), "{file} is not in the archive");
    }
    let said = Command::new(unpacked.join("busyguard")).arg("--version").output().unwrap();
    assert!(String::from_utf8(said.stdout).unwrap().contains(version));
}

#[test]
fn make_dist_packages_the_helm_chart_with_its_sha256_and_a_chart_repository_index() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(Path::new(ROOT).join("scripts/dist.sh"))
        .arg("--chart")
        .env("DIST_DIR", dir.path())
        .env("DIST_URL", "https://downloads.example.com/busyguard/v1")
        .status()
        .unwrap();
    assert!(status.success());
    let version = env!("CARGO_PKG_VERSION");
    let chart = format!("busyguard-{version}.tgz");
    let sum = Command::new("sha256sum").arg(dir.path().join(&chart)).output().unwrap();
    let sum = String::from_utf8(sum.stdout).unwrap().split_whitespace().next().unwrap().to_string();
    let beside = std::fs::read_to_string(dir.path().join(format!("{chart}.sha256"))).unwrap();
    assert_eq!(beside, format!("{sum}  {chart}\n"), "checkable with sha256sum -c");
    let index: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.path().join("index.yaml")).unwrap()).unwrap();
    let entry = &index["entries"]["busyguard"][0];
    assert_eq!((entry["version"].as_str(), entry["appVersion"].as_str()), (Some(version), Some(version)));
    assert_eq!(entry["digest"], sum.as_str(), "helm verifies the download against it");
    assert_eq!(entry["urls"][0], format!("https://downloads.example.com/busyguard/v1/{chart}"));
    let listed = Command::new("tar").arg("-tzf").arg(dir.path().join(&chart)).output().unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    for file in ["busyguard/Chart.yaml", "busyguard/values.schema.json", "busyguard/templates/webhooks.yaml"] {
        assert!(listed.lines().any(|l| l == file), "{file} is not in the chart: {listed}");
    }
}
