//! The end-to-end suite's control plane gets Kubernetes' binaries as the ecosystem does where
//! `../shared/k8s` is not there: the upstream release's, each checked against its published
//! SHA-256 (`tests/e2e/k8s/fetch.sh`), here from a local server laid out as the release is.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARIES: [&str; 3] = ["kube-apiserver", "kube-controller-manager", "kube-scheduler"];

/// A release laid out as `RELEASE/v1.28.4/bin/linux/amd64/NAME` with `NAME.sha256`, the sums
/// as published except for `wrong`; served over HTTP until dropped.
struct Release {
    server: Child,
    url: String,
    _files: tempfile::TempDir,
}

/// A plain HTTP server of the files under `root` on a loopback port, once it answers, and its URL.
fn serve(root: &Path) -> (Child, String) {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = Command::new("python3")
        .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the file server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, format!("http://127.0.0.1:{port}"))
}

impl Release {
    fn serve(wrong: Option<&str>) -> Release {
        let files = tempfile::tempdir().unwrap();
        let dir = files.path().join("v1.28.4/bin/linux/amd64");
        std::fs::create_dir_all(&dir).unwrap();
        for name in BINARIES {
            std::fs::write(dir.join(name), format!("#!/bin/sh\necho {name}\n")).unwrap();
            let sum = Command::new("sha256sum").arg(dir.join(name)).output().unwrap();
            let mut sum = String::from_utf8(sum.stdout).unwrap().split_whitespace().next().unwrap().to_string();
            if wrong == Some(name) {
                sum = "0".repeat(64);
            }
            std::fs::write(dir.join(format!("{name}.sha256")), sum).unwrap();
        }
        let (server, url) = serve(files.path());
        Release { server, url, _files: files }
    }

    fn fetch(&self, dest: &Path) -> std::process::Output {
        Command::new(Path::new(ROOT).join("tests/e2e/k8s/fetch.sh"))
            .arg(dest)
            .env("K8S_RELEASE_URL", &self.url)
            .env("K8S_VERSION", "v1.28.4")
            .env("K8S_ARCH", "amd64")
            .output()
            .unwrap()
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// An etcd release laid out as upstream's: `v3.5.9/etcd-v3.5.9-linux-amd64.tar.gz` and
/// `v3.5.9/SHA256SUMS` (with `tampered`, a sum that is not the tarball's).
fn etcd_release(root: &Path, tampered: bool) {
    let dir = root.join("v3.5.9");
    let unpacked = root.join("build/etcd-v3.5.9-linux-amd64");
    std::fs::create_dir_all(&unpacked).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(unpacked.join("etcd"), "#!/bin/sh\necho etcd\n").unwrap();
    let tarball = "etcd-v3.5.9-linux-amd64.tar.gz";
    let packed = Command::new("tar")
        .args([
            "-czf",
            &dir.join(tarball).to_string_lossy(),
            "-C",
            &root.join("build").to_string_lossy(),
            "etcd-v3.5.9-linux-amd64",
        ])
        .status()
        .unwrap();
    assert!(packed.success());
    let sum = Command::new("sha256sum").arg(dir.join(tarball)).output().unwrap();
    let sum = String::from_utf8(sum.stdout).unwrap().split_whitespace().next().unwrap().to_string();
    let sum = if tampered { "1".repeat(64) } else { sum };
    std::fs::write(
        dir.join("SHA256SUMS"),
        format!("{}  etcd-v3.5.9-darwin-amd64.zip\n{sum}  {tarball}\n", "2".repeat(64)),
    )
    .unwrap();
}

#[test]
fn etcd_is_downloaded_with_them_where_none_is_there_and_kept_only_with_its_published_sha256() {
    for tampered in [false, true] {
        let release = Release::serve(None);
        let etcd = tempfile::tempdir().unwrap();
        etcd_release(etcd.path(), tampered);
        let (mut server, etcd_url) = serve(etcd.path());
        let dest = tempfile::tempdir().unwrap();
        let fetched = Command::new(Path::new(ROOT).join("tests/e2e/k8s/fetch.sh"))
            .arg(dest.path())
            .arg("--etcd")
            .env("K8S_RELEASE_URL", &release.url)
            .env("K8S_ARCH", "amd64")
            .env("ETCD_RELEASE_URL", etcd_url)
            .output()
            .unwrap();
        let _ = server.kill();
        let _ = server.wait();
        let said = String::from_utf8_lossy(&fetched.stderr);
        if tampered {
            assert!(!fetched.status.success() && said.contains("not the one in the release's SHA256SUMS"), "{said}");
            assert!(!dest.path().join("etcd").exists());
        } else {
            assert!(fetched.status.success(), "{said}");
            let run = Command::new(dest.path().join("etcd")).output().unwrap();
            assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "etcd");
        }
    }
}

#[test]
fn the_release_binaries_are_downloaded_and_kept_only_with_their_published_sha256() {
    let release = Release::serve(None);
    let dest = tempfile::tempdir().unwrap();
    let fetched = release.fetch(dest.path());
    assert!(fetched.status.success(), "{}", String::from_utf8_lossy(&fetched.stderr));
    for name in BINARIES {
        let run = Command::new(dest.path().join(name)).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), name, "{name} downloaded whole and executable");
    }
    let again = release.fetch(dest.path());
    assert!(again.status.success() && again.stderr.is_empty(), "kept, not downloaded again");

    let tampered = Release::serve(Some("kube-scheduler"));
    let dest = tempfile::tempdir().unwrap();
    let fetched = tampered.fetch(dest.path());
    assert!(!fetched.status.success(), "a binary whose SHA-256 is not the published one is refused");
    let said = String::from_utf8_lossy(&fetched.stderr);
    assert!(said.contains("kube-scheduler: SHA-256"), "{said}");
    assert!(!dest.path().join("kube-scheduler").exists() && !dest.path().join("kube-scheduler.part").exists());
}
