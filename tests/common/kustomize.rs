//! `kubectl kustomize`, offline: the one way the tests render `manifests/` (shared through
//! `#[path]` by the binaries that render it).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The objects `kubectl kustomize DIR` renders, or what kubectl said when it could not.
pub fn kustomize(dir: &Path) -> Result<Vec<Value>, String> {
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|e| format!("cannot run kubectl kustomize {}: {e}", dir.display()))?;
    if !output.status.success() {
        return Err(format!("kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&output.stderr)));
    }
    let rendered = String::from_utf8(output.stdout).map_err(|e| format!("kubectl kustomize {}: {e}", dir.display()))?;
    serde_saphyr::from_multiple(&rendered).map_err(|e| format!("the manifests of {}: {e}", dir.display()))
}
