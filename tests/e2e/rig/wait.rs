//! Waiting on the cluster: until something holds, or that it holds throughout.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};

/// Retries `check` every 250 ms until it holds; an error names `what` and how long it waited.
pub fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        if Instant::now() >= deadline {
            let why = last.map(|e| format!(" (last error: {e:#})")).unwrap_or_default();
            bail!("not seen within {}s: {what}{why}", within.as_secs());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Checks that `check` holds throughout `period` (sampled every 250 ms).
pub fn throughout(what: &str, period: Duration, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + period;
    while Instant::now() < deadline {
        ensure!(check()?, "no longer true: {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}
