//! The view's store of nodes: those going (drained by Karpenter or cluster-autoscaler, or by
//! their lifecycle conditions) or ending, and why; their pods take no new task. Only the verdict
//! is kept, by node name; the node index (`cluster/nodes.rs`) is its only writer.

use parking_lot::RwLock;

use crate::cluster::fast_map::FastMap;
use crate::policy::hold::{NodeEnding, NodeGoing, NodeState};

#[derive(Default)]
pub struct Nodes {
    /// Only the nodes not in the default state (staying).
    state: RwLock<FastMap<String, NodeState>>,
}

impl Nodes {
    /// Whether `node` is going, and why, as its watch last said.
    pub fn going(&self, node: &str) -> Option<NodeGoing> {
        self.state(node).going
    }

    /// Whether `node` is ending whatever its pods do (being deleted, or not Ready), and which.
    pub fn ending(&self, node: &str) -> Option<NodeEnding> {
        self.state(node).ending
    }

    fn state(&self, node: &str) -> NodeState {
        if node.is_empty() {
            return NodeState::default();
        }
        self.state.read().get(node).copied().unwrap_or_default()
    }

    /// Records what `node` says of itself now (the default: it stays, or is gone). Most of a
    /// node's updates change neither: they take no write lock.
    pub fn set(&self, node: &str, state: NodeState) {
        if self.state(node) == state {
            return;
        }
        let mut nodes = self.state.write();
        if state == NodeState::default() {
            nodes.remove(node);
        } else {
            nodes.insert(node.to_string(), state);
        }
    }

    /// How many nodes are going or ending.
    pub fn len(&self) -> usize {
        self.state.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
