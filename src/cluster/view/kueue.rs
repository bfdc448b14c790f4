//! The view's record of Kueue's preemptions (`--hold-kueue-preemption`): the namespaces that hold
//! them, the Jobs whose Workloads Kueue preempted, and whether its Workloads are followed.

use super::View;

impl View {
    /// Whether the Job controller's delete of a pod of `job` is Kueue's preemption held: its
    /// namespace holds them and Kueue preempted the Job's Workload.
    pub fn preemption_held(&self, namespace: &str, job: &str) -> bool {
        let preemptions = self.preemptions.read();
        preemptions.holding.contains(namespace)
            && preemptions.preempted.contains(&(namespace.to_string(), job.to_string()))
    }

    pub fn set_holds_preemption(&self, namespace: &str, holds: bool) {
        let holding = &mut self.preemptions.write().holding;
        if holds {
            holding.insert(namespace.to_string())
        } else {
            holding.remove(namespace)
        };
    }

    pub fn holding_preemption(&self) -> Vec<String> {
        self.preemptions.read().holding.iter().cloned().collect()
    }

    /// Records whether Kueue preempted the Workload of `job`; whether that changed.
    pub fn set_preempted(&self, namespace: &str, job: &str, preempted: bool) -> bool {
        let key = (namespace.to_string(), job.to_string());
        let jobs = &mut self.preemptions.write().preempted;
        if preempted { jobs.insert(key) } else { jobs.remove(&key) }
    }

    pub fn preempted_jobs(&self) -> Vec<(String, String)> {
        self.preemptions.read().preempted.iter().cloned().collect()
    }

    /// With the hold on, whether Kueue's Workloads are followed: `None` if so, else why not.
    pub fn set_kueue_unfollowed(&self, why: Option<String>) {
        self.preemptions.write().unfollowed = Some(why);
    }

    /// `None`: the hold is off; `Some(None)`: Kueue's Workloads are followed; else why not.
    pub fn kueue_unfollowed(&self) -> Option<Option<String>> {
        self.preemptions.read().unfollowed.clone()
    }
}
