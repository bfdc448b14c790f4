//! A person's first commands: what goes wrong is said in one line, what is wrong and what to do,
//! and `busyguard certs` says what it wrote.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

/// As on a fresh machine: no cluster to find.
fn busyguard(dir: &Path, args: &[&str]) -> Output {
    busyguard_with_kubeconfig(dir, dir.join("no-such-kubeconfig").as_os_str(), args)
}

/// With `KUBECONFIG` set to `kubeconfig`, and no home or pod to find another in.
fn busyguard_with_kubeconfig(dir: &Path, kubeconfig: &OsStr, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_busyguard"))
        .args(args)
        .current_dir(dir)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", dir)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

/// The one line a failed command wrote to stderr.
fn error_line(output: &Output) -> String {
    assert!(!output.status.success(), "the command failed");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    lines[0].to_string()
}

const SERVE: &[&str] = &["serve", "--no-cluster", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];

#[test]
fn serve_without_certificates_says_which_file_and_how_to_make_them() {
    let dir = tempfile::tempdir().unwrap();
    let line = error_line(&busyguard(dir.path(), SERVE));
    assert!(line.starts_with("error: cannot read the serving certificate certs/tls.crt: "), "{line}");
    assert!(line.contains("`busyguard certs`"), "{line}");
}

#[test]
fn a_missing_key_is_called_a_key() {
    let dir = tempfile::tempdir().unwrap();
    assert!(busyguard(dir.path(), &["certs"]).status.success());
    let line = error_line(&busyguard(dir.path(), &[SERVE, &["--tls-key", "nope.key"]].concat()));
    assert!(line.starts_with("error: cannot read the serving key nope.key: "), "{line}");
}

#[test]
fn status_without_a_cluster_says_how_to_give_it_one_and_a_missing_kubeconfig_once() {
    let dir = tempfile::tempdir().unwrap();
    let line = error_line(&busyguard(dir.path(), &["status"]));
    assert_eq!(
        line,
        "error: no cluster to reach: give --kubeconfig, set KUBECONFIG, have ~/.kube/config, or run in a pod"
    );
    let line = error_line(&busyguard(dir.path(), &["status", "--kubeconfig", "nope.yaml"]));
    assert!(line.starts_with("error: cannot read kubeconfig nope.yaml: "), "{line}");
    assert_eq!(line.matches("No such file").count(), 1, "the cause said once: {line}");
}

#[test]
fn certs_says_what_it_wrote_and_keeps_the_ca_when_a_name_is_added() {
    let dir = tempfile::tempdir().unwrap();
    let said = |args: &[&str]| {
        let output = busyguard(dir.path(), &[&["certs"], args].concat());
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(said(&[]), "certs: wrote a new CA (ca.crt, ca.key) and serving pair (tls.crt, tls.key)\n");
    let ca = std::fs::read(dir.path().join("certs/ca.crt")).unwrap();
    assert!(said(&[]).contains("kept"));
    let wider = said(&["--dns", "localhost,busyguard.example.com"]);
    assert!(wider.starts_with("certs: wrote a new serving pair (tls.crt, tls.key) under the CA there"), "{wider}");
    assert!(wider.contains("(tls.crt does not name busyguard.example.com)"), "{wider}");
    assert_eq!(std::fs::read(dir.path().join("certs/ca.crt")).unwrap(), ca, "the caBundle stays good");
}

#[test]
fn a_name_that_is_not_a_dns_name_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let output = busyguard(dir.path(), &["certs", "--dns", "bad name!"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("\"bad name!\" is not a DNS name"));
    assert!(!dir.path().join("certs").exists());
}

#[test]
fn the_agent_asks_for_one_of_its_two_busy_signals() {
    let dir = tempfile::tempdir().unwrap();
    let output = busyguard(dir.path(), &["agent", "--url", "http://127.0.0.1:1/", "--pod", "w", "--namespace", "jobs"]);
    assert_eq!(output.status.code(), Some(2));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("--busy-status <BUSY_STATUS>|--busy-body <BUSY_BODY>"), "{said}");
}

#[test]
fn a_log_filter_that_does_not_parse_is_refused_not_turned_into_info() {
    let dir = tempfile::tempdir().unwrap();
    let output = busyguard(dir.path(), &["--log-level", "busyguard=loud", "certs"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("directives such as busyguard=debug"));
    assert!(!dir.path().join("certs").exists(), "nothing done");
}

#[test]
fn kubectl_runs_it_as_its_plugin_kubectl_busyguard() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_busyguard"), bin.join("kubectl-busyguard")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let output = Command::new("kubectl")
        .args(["busyguard", "status", "--kubeconfig", "nope.yaml"])
        .current_dir(dir.path())
        .env("PATH", path)
        .output()
        .expect("kubectl is on PATH (the tests render the manifests with it too)");
    let line = error_line(&output);
    assert!(line.starts_with("error: cannot read kubeconfig nope.yaml: "), "{line}");
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let dir = tempfile::tempdir().unwrap();
    let output = busyguard(dir.path(), &["--version"]);
    let said = String::from_utf8_lossy(&output.stdout);
    let expected = format!("busyguard {} (commit {})", busyguard::VERSION, busyguard::COMMIT);
    assert_eq!(said.trim(), expected);
    assert!(busyguard::COMMIT.len() >= 7 || busyguard::COMMIT == "unknown", "{}", busyguard::COMMIT);
}

#[test]
fn status_and_check_take_a_kubeconfig_context_as_kubectl_does_and_name_the_server_they_could_not_reach() {
    let dir = tempfile::tempdir().unwrap();
    let cluster =
        |port: u16| format!("{{\"name\": \"c{port}\", \"cluster\": {{\"server\": \"https://127.0.0.1:{port}\"}}}}");
    let context = |name: &str, port: u16| {
        format!("{{\"name\": \"{name}\", \"context\": {{\"cluster\": \"c{port}\", \"user\": \"u\"}}}}")
    };
    let kubeconfig = format!(
        "{{\"apiVersion\": \"v1\", \"kind\": \"Config\", \"clusters\": [{}, {}], \"contexts\": [{}, {}], \
         \"users\": [{{\"name\": \"u\", \"user\": {{\"token\": \"t\"}}}}], \"current-context\": \"a\"}}",
        cluster(1),
        cluster(2),
        context("a", 1),
        context("b", 2)
    );
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, kubeconfig).unwrap();
    let path = path.to_str().unwrap();
    let line = error_line(&busyguard(dir.path(), &["status", "--kubeconfig", path, "--context", "b"]));
    assert!(line.contains("the API server at https://127.0.0.1:2/"), "{line}");
    assert!(line.ends_with("Connection refused (os error 111)"), "down to its cause: {line}");
    assert!(!line.contains("client error (Connect): client error (Connect)"), "each cause once: {line}");
    let line = error_line(&busyguard(dir.path(), &["cleanup", "--kubeconfig", path, "--context", "b"]));
    assert!(line.contains("from the API server at https://127.0.0.1:2/"), "cleanup names it too: {line}");
    let line = error_line(&busyguard(dir.path(), &["status", "--kubeconfig", path]));
    assert!(line.contains("the API server at https://127.0.0.1:1/"), "the current context without it: {line}");
    let line = error_line(&busyguard(dir.path(), &["status", "--kubeconfig", path, "--context", "nope"]));
    assert_eq!(line, "error: cannot use context nope: the kubeconfig has no such context (it has: a, b)");
    // KUBECONFIG as kubectl reads it: a file of its list that does not exist is skipped.
    let missing = dir.path().join("missing.yaml");
    let list = std::env::join_paths([missing.as_path(), Path::new(path)]).unwrap();
    let with_list = |args: &[&str]| error_line(&busyguard_with_kubeconfig(dir.path(), &list, args));
    let line = with_list(&["status", "--context", "b"]);
    assert!(line.contains("the API server at https://127.0.0.1:2/"), "{line}");
    let line = with_list(&["status"]);
    assert!(line.contains("the API server at https://127.0.0.1:1/"), "its current context: {line}");
    // busyguard check does not blame busyguard for an API server it cannot reach.
    let check = ["check", "--kubeconfig", path, "--context", "b", "--timeout", "1s"];
    let line = error_line(&busyguard(dir.path(), &check));
    assert!(line.starts_with("error: cannot reach the API server at https://127.0.0.1:2/ (for 1s): "), "{line}");
}

#[test]
fn a_listen_address_without_an_ip_says_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    for given in ["localhost:8443", "8443"] {
        let output = busyguard(dir.path(), &["serve", "--no-cluster", "--listen", given]);
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(said.contains("is not IP:PORT: give an address and a port, e.g. 127.0.0.1:8443"), "{given}: {said}");
    }
}

#[test]
fn the_agent_takes_a_plain_http_endpoint_and_a_real_status_code() {
    let dir = tempfile::tempdir().unwrap();
    let agent = |url: &str, status: &str| {
        let args = ["agent", "--url", url, "--busy-status", status, "--pod", "w", "--namespace", "ns"];
        let output = busyguard(dir.path(), &args);
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    assert!(agent("https://127.0.0.1:8080/busy", "503").contains("plain HTTP"));
    assert!(agent("http://127.0.0.1:8080/busy", "999").contains("999 is not in 100..=599"));
}

#[test]
fn as_kubectls_plugin_the_usage_says_kubectl_busyguard_and_lists_the_commands_for_a_person() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-busyguard");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_busyguard"), &plugin).unwrap();
    let output = Command::new(&plugin).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("Usage: kubectl busyguard "), "{help}");
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["certs", "status", "cleanup", "check", "help"], "{help}");
    // Still there for whoever types them.
    let serve_help = Command::new(&plugin).args(["serve", "--help"]).output().unwrap();
    assert!(serve_help.status.success());
}

#[test]
fn a_busy_rule_that_does_not_compile_stops_serve_and_says_which_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let rule = "--busy-when-owner=agones.dev/v1/GameServer=object.status.state ==";
    let output = busyguard(dir.path(), &[SERVE, &[rule]].concat());
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("agones.dev/v1/GameServer: the expression \"object.status.state ==\" does not compile: "),
        "{stderr}"
    );
    let output = busyguard(dir.path(), &[SERVE, &["--busy-when-owner=GameServer=true"]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("expected GROUP/VERSION/KIND=EXPRESSION"), "{stderr}");
}
