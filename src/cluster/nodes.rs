//! Feeds the view with the nodes that are going (`policy::hold::node_going`): a pod there is
//! refused its next flip to busy. Only the verdict is kept, by node name; the Node objects are
//! read and dropped.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use super::view::View;
use crate::policy::hold::{Holds, NodeGoing, node_going};

/// Runs until the process stops; the watch reconnects with backoff on its own.
pub async fn watch_nodes(client: Client, view: Arc<View>, holds: Holds, timeout_secs: u32) {
    let config = watcher::Config::default().timeout(timeout_secs);
    let mut events = watcher(Api::<Node>::all(client), config).default_backoff().boxed();
    let mut listing: Option<HashMap<String, NodeGoing>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing = Some(HashMap::new()),
            Ok(watcher::Event::InitApply(node)) => {
                if let (Some(listed), Some(going)) = (&mut listing, going(&node, holds)) {
                    listed.insert(node.name_any(), going);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let listed = listing.take().unwrap_or_default();
                info!(going = listed.len(), "nodes listed");
                view.keep_nodes_going(listed);
            }
            Ok(watcher::Event::Apply(node)) => {
                let (name, now) = (node.name_any(), going(&node, holds));
                if view.node_going(&name) != now {
                    info!(node = %name, going = ?now, "node's going changed: its pods take new tasks only while it stays");
                    view.set_node_going(&name, now);
                }
            }
            Ok(watcher::Event::Delete(node)) => view.set_node_going(&node.name_any(), None),
            Err(e) => warn!(error = %e, "watch of nodes failed; retrying with backoff"),
        }
    }
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
    node_going(unschedulable, &taints, &conditions, holds)
}
