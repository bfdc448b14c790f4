//! busyguard end to end, on a real control plane (`make e2e`): every row of the busy contract
//! (docs/contract.md) and every case it does not protect, asserted from what the real API server,
//! controllers, scheduler and `kubectl` did, with busyguard installed as shipped (see `rig`).
//!
//! Runs only with `BUSYGUARD_E2E=1` (what `make e2e` sets): it starts a control plane. Scenarios
//! run one after the other, each in its own namespace; an argument runs only the scenarios whose
//! name holds it. The last line reads `e2e: N passed, N failed`.

mod kubelet;
#[path = "../common/kustomize.rs"]
mod kustomize;
mod rig;
mod scenarios;
mod workers;

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::Instant;

use rig::Rig;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Test runners list first (`--list`): this suite is listed and run by `make e2e` alone.
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    if std::env::var_os("BUSYGUARD_E2E").is_none() {
        println!("e2e: not run: it starts a control plane; `make e2e` runs it (BUSYGUARD_E2E=1)");
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let chosen: Vec<_> = (scenarios::ALL.iter())
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    let started = Instant::now();
    let rig = match Rig::up() {
        Ok(rig) => rig,
        Err(e) => {
            eprintln!("e2e: the rig did not come up: {e:#}");
            println!("e2e: 0 passed, {} failed", chosen.len());
            return ExitCode::FAILURE;
        }
    };
    println!("e2e: control plane and busyguard up in {:.0?}", started.elapsed());
    let (mut passed, mut failed) = (0, Vec::new());
    // `E2E_REPEAT=N` runs each chosen scenario N times in a row: a flaky one shows itself.
    let repeat = std::env::var("E2E_REPEAT").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
    let rounds = chosen.iter().flat_map(|chosen| (0..repeat).map(move |round| (round, *chosen)));
    for (round, (name, scenario)) in rounds {
        let settled = if round > 0 { rig.namespaces_gone() } else { Ok(()) };
        rig.set_run(round + 1);
        let began = Instant::now();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| settled.and_then(|()| scenario(&rig))));
        let took = began.elapsed();
        // A busyguard that exited while its pod ran fails the scenario, whatever it asserted.
        let crashes = rig.crashes();
        let result = match result {
            Ok(Ok(())) if !crashes.is_empty() => Ok(Err(anyhow::anyhow!("{}", crashes.join("\n")))),
            Ok(Err(e)) if !crashes.is_empty() => Ok(Err(e.context(crashes.join("\n")))),
            result => result,
        };
        match result {
            Ok(Ok(())) => {
                passed += 1;
                println!("e2e: ok     {name} ({took:.1?})");
            }
            Ok(Err(e)) => {
                println!("e2e: FAILED {name} ({took:.1?}): {e:#}");
                failed.push((*name, format!("{e:#}")));
            }
            Err(_) => {
                println!("e2e: FAILED {name} ({took:.1?}): panicked");
                failed.push((*name, "panicked".to_string()));
            }
        }
    }
    println!("e2e: all in {:.0?}; busyguard's logs: {}/replicas", started.elapsed(), rig.work.display());
    // Each reason again at the end, where a CI log's tail shows it.
    for (name, why) in &failed {
        println!("e2e: failed: {name}: {why}");
    }
    println!("e2e: {passed} passed, {} failed", failed.len());
    drop(rig);
    if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
