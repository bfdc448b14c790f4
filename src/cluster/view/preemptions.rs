//! The view's store of Kueue's preemptions (`--hold-kueue-preemption`): the namespaces that hold
//! them, the Jobs whose Workloads Kueue preempted, and whether its Workloads are followed. The
//! indexes of `cluster/kueue.rs` are its only writers.

use std::collections::HashSet;

use parking_lot::RwLock;

#[derive(Default)]
pub struct Preemptions {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    holding: HashSet<String>,
    /// By namespace and Job name.
    preempted: HashSet<(String, String)>,
    /// With the hold on: why Kueue's Workloads are not followed now (`None`: followed).
    /// `None` outside: the hold is off.
    unfollowed: Option<Option<String>>,
}

impl Preemptions {
    /// Whether the Job controller's delete of a pod of `job` is Kueue's preemption held: its
    /// namespace holds them and Kueue preempted the Job's Workload.
    pub fn held(&self, namespace: &str, job: &str) -> bool {
        let state = self.state.read();
        state.holding.contains(namespace) && state.preempted.contains(&(namespace.to_string(), job.to_string()))
    }

    pub fn set_holding(&self, namespace: &str, holds: bool) {
        let holding = &mut self.state.write().holding;
        if holds {
            holding.insert(namespace.to_string())
        } else {
            holding.remove(namespace)
        };
    }

    /// Records whether Kueue preempted the Workload of `job`; whether that changed.
    pub fn set_preempted(&self, namespace: &str, job: &str, preempted: bool) -> bool {
        let key = (namespace.to_string(), job.to_string());
        let jobs = &mut self.state.write().preempted;
        if preempted { jobs.insert(key) } else { jobs.remove(&key) }
    }

    /// With the hold on, whether Kueue's Workloads are followed: `None` if so, else why not.
    pub fn set_unfollowed(&self, why: Option<String>) {
        self.state.write().unfollowed = Some(why);
    }

    /// `None`: the hold is off; `Some(None)`: Kueue's Workloads are followed; else why not.
    pub fn unfollowed(&self) -> Option<Option<String>> {
        self.state.read().unfollowed.clone()
    }
}
