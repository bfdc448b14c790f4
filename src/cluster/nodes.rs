//! Feeds the view with the nodes that are going (`policy::hold::node_going`): a pod there is
//! refused its next flip to busy. Only the verdict is kept, by node name; the Node objects are
//! read and dropped.

use std::convert::Infallible;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tracing::info;

use super::driver::{self, Index, Key};
use super::view::{Scope, View};
use crate::policy::hold::{Holds, NodeEnding, NodeGoing, NodeState, node_going};

/// Runs until the process stops; the watch reconnects with backoff on its own.
pub async fn watch_nodes(client: Client, view: Arc<View>, holds: Holds, timeout_secs: u32) {
    let config = watcher::Config::default().timeout(timeout_secs);
    let events = driver::watch(vec![(None, Api::<Node>::all(client))], config);
    driver::drive(&mut NodesGoing { view, holds }, events, |never| match never {}).await;
}

/// The index of nodes: only those going are kept, with why.
struct NodesGoing {
    view: Arc<View>,
    holds: Holds,
}

impl Index<Node> for NodesGoing {
    /// Only the view changes: its pods are judged against it when they next ask.
    type Change = Infallible;

    fn what(&self) -> String {
        "nodes".into()
    }

    fn key(&self, node: &Node) -> Key {
        Key::cluster(node.name_any())
    }

    fn apply(&mut self, node: Node) -> Vec<Infallible> {
        let (name, now) = (node.name_any(), going(&node, self.holds));
        if self.view.nodes.going(&name) != now {
            info!(node = %name, going = ?now, "node's going changed: its pods take new tasks only while it stays");
        }
        self.view.nodes.set(&name, NodeState { going: now, ending: ending(&node) });
        Vec::new()
    }

    fn delete(&mut self, node: Key) -> Vec<Infallible> {
        self.view.nodes.set(&node.name, NodeState::default());
        Vec::new()
    }

    /// Nodes deleted while the watch was down: going no longer.
    fn reset(&mut self, _: &Scope, removed: Vec<Key>) -> Vec<Infallible> {
        for node in removed {
            self.delete(node);
        }
        info!(going = self.view.nodes.len(), "nodes listed");
        Vec::new()
    }
}

/// Whether `node` ends whatever its pods do, and why.
fn ending(node: &Node) -> Option<NodeEnding> {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    let ready = conditions.into_iter().flatten().find(|c| c.type_ == "Ready").map(|c| c.status.as_str());
    NodeEnding::of(node.metadata.deletion_timestamp.is_some(), ready)
}

/// Whether `node` is going, and why.
pub fn going(node: &Node, holds: Holds) -> Option<NodeGoing> {
    let spec = node.spec.as_ref();
    let taints: Vec<&str> =
        spec.and_then(|s| s.taints.as_ref()).into_iter().flatten().map(|t| t.key.as_str()).collect();
    let conditions: Vec<(&str, &str)> =
        (node.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten())
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
    let unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let labels: Vec<(&str, &str)> = node.labels().iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    node_going(unschedulable, &taints, &conditions, &labels, holds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, taint: Option<&str>) -> Node {
        let taints = taint.map(|key| serde_json::json!([{"key": key, "effect": "NoSchedule"}]));
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": {"taints": taints}})).unwrap()
    }

    const KARPENTER: &str = crate::policy::hold::KARPENTER_DISRUPTED_TAINT;

    /// As kubert tests an index across a watch's restart: what a relist no longer has is gone,
    /// what it has again is as it says now, and an error changes nothing.
    #[test]
    fn a_node_a_relist_no_longer_has_or_that_stays_now_is_no_longer_going() {
        let view = Arc::new(View::without_cluster());
        let mut nodes = NodesGoing { view: view.clone(), holds: Holds::default() };
        let mut driver = driver::Driver::default();
        let mut drive = |events: Vec<driver::Scoped<Node>>| {
            for (scope, event) in events {
                assert!(driver.step(&mut nodes, scope, event).changes.is_empty());
            }
        };
        drive(driver::listed(None, vec![node("a", Some(KARPENTER)), node("b", Some(KARPENTER)), node("c", None)]));
        assert_eq!(view.nodes.going("a"), Some(NodeGoing::Karpenter));
        assert_eq!(view.nodes.going("b"), Some(NodeGoing::Karpenter));
        assert_eq!(view.nodes.going("c"), None);

        // The watch fails: what was going stays going.
        drive(vec![(None, Err(watcher::Error::NoResourceVersion))]);
        assert_eq!(view.nodes.going("a"), Some(NodeGoing::Karpenter));

        // Restarted: a is gone (deleted while the watch was down), b stays now, c is going.
        drive(driver::listed(None, vec![node("b", None), node("c", Some(KARPENTER))]));
        assert_eq!(view.nodes.going("a"), None, "gone while the watch was down");
        assert_eq!(view.nodes.going("b"), None, "its taint removed while the watch was down");
        assert_eq!(view.nodes.going("c"), Some(NodeGoing::Karpenter));
    }
}
