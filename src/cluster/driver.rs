//! One driver for every watch, in the shape of kubert's indexes: it turns a watch's events into
//! `apply`, `delete` and `reset` on an index of one kind (pods, namespaces, nodes, owners), keeps
//! every key each watch has for the life of the watch (so a relist hands `reset` exactly what is
//! gone, and no index works it out), marks the watch alive when the API server speaks, and logs
//! and reports its failures. Indexes are sync: what a change sets off (effects, reads) is handed
//! back to the caller to carry out, so no index waits on the API server.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::warn;

use super::view::Scope;

/// A watch's event, with the scope of the watch (a namespace, or all).
pub type Scoped<K> = (Scope, Result<watcher::Event<K>, watcher::Error>);

/// An object's key in its index: its namespace (empty for a cluster-wide kind) and the name the
/// index keys it by there (its own, or what the index keeps of it: an owner's `group/Kind/name`,
/// the Job a Workload stands for).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Key {
        Key { namespace: namespace.into(), name: name.into() }
    }

    /// The key of an object of a cluster-wide kind (a node, a namespace).
    pub fn cluster(name: impl Into<String>) -> Key {
        Key::new(String::new(), name)
    }
}

/// One kind's index: what the view does with the objects a watch sees, and what that sets off
/// (`Change`), for the caller to carry out.
pub(crate) trait Index<K> {
    type Change;
    /// What is watched, for the logs.
    fn what(&self) -> String;
    fn key(&self, object: &K) -> Key;
    /// An object seen, new or changed (a list's objects too, as they come).
    fn apply(&mut self, object: K) -> Vec<Self::Change>;
    /// An object deleted, or no longer selected by the watch.
    fn delete(&mut self, key: Key) -> Vec<Self::Change>;
    /// A fresh list of `scope` has ended without the objects of `removed`, which the watch had
    /// before: gone while it was down (no delete event came). Unless said otherwise, each is
    /// deleted.
    fn reset(&mut self, _scope: &Scope, removed: Vec<Key>) -> Vec<Self::Change> {
        removed.into_iter().flat_map(|key| self.delete(key)).collect()
    }
    /// The API server said something: the watch is alive.
    fn alive(&mut self) {}
    /// The watch failed; it retries with backoff, and the index keeps what it has.
    fn failed(&mut self, _error: &watcher::Error) {}
}

/// What one event did: what the index set off, and whether it ended a list.
pub struct Step<C> {
    pub changes: Vec<C>,
    pub listed: bool,
}

/// Every key each scope's watch has, for the life of the watch (kubert's `namespaced`).
#[derive(Default)]
pub struct Driver {
    known: HashMap<Scope, HashSet<Key>>,
    /// While a scope's list is under way: the keys it had before that the list has not had yet.
    unlisted: HashMap<Scope, HashSet<Key>>,
}

impl Driver {
    /// One event of the watch of `scope`, carried out on `index`.
    pub(crate) fn step<K, I: Index<K>>(
        &mut self,
        index: &mut I,
        scope: Scope,
        event: Result<watcher::Event<K>, watcher::Error>,
    ) -> Step<I::Change> {
        // Init is the watcher's own, before it asks anything.
        if matches!(event, Ok(ref e) if !matches!(e, watcher::Event::Init)) {
            index.alive();
        }
        let changes = match event {
            Ok(watcher::Event::Init) => {
                self.list_begins(scope);
                Vec::new()
            }
            Ok(watcher::Event::InitApply(object)) | Ok(watcher::Event::Apply(object)) => {
                self.seen(scope, index.key(&object));
                index.apply(object)
            }
            Ok(watcher::Event::InitDone) => {
                let changes = index.reset(&scope, self.list_ends(&scope));
                return Step { changes, listed: true };
            }
            Ok(watcher::Event::Delete(object)) => {
                let key = index.key(&object);
                if let Some(known) = self.known.get_mut(&scope) {
                    known.remove(&key);
                }
                index.delete(key)
            }
            Err(e) => {
                warn!(watch = %index.what(), error = %e, "watch failed; retrying with backoff");
                index.failed(&e);
                Vec::new()
            }
        };
        Step { changes, listed: false }
    }

    /// A list of `scope` begins: every key it had is unlisted until the list has it again. A
    /// list started again before the last ended keeps what that one had not had.
    fn list_begins(&mut self, scope: Scope) {
        let had = self.known.remove(&scope).unwrap_or_default();
        self.unlisted.entry(scope).or_default().extend(had);
    }

    /// An object of `scope` seen, in a list or after it.
    fn seen(&mut self, scope: Scope, key: Key) {
        if let Some(unlisted) = self.unlisted.get_mut(&scope) {
            unlisted.remove(&key);
        }
        self.known.entry(scope).or_default().insert(key);
    }

    /// A list of `scope` ended: the keys it no longer had, in order.
    fn list_ends(&mut self, scope: &Scope) -> Vec<Key> {
        let mut removed: Vec<Key> = self.unlisted.remove(scope).unwrap_or_default().into_iter().collect();
        removed.sort();
        removed
    }
}

/// Drives `index` with `events` (each with the scope of its watch) until they end, handing
/// what each change sets off to `carry`.
pub(crate) async fn drive<K, I: Index<K>>(
    index: &mut I,
    events: impl Stream<Item = Scoped<K>>,
    mut carry: impl FnMut(I::Change),
) {
    let mut driver = Driver::default();
    let mut events = std::pin::pin!(events);
    while let Some((scope, event)) = events.next().await {
        driver.step(index, scope, event).changes.into_iter().for_each(&mut carry);
    }
}

/// Drives `index` until its first list has ended (the namespaces busyguard leaves alone, which
/// must be known before any pod is looked at); the stream goes on where it stopped. Returns what
/// the events until then set off.
pub(crate) async fn drive_until_listed<K, I: Index<K>>(
    driver: &mut Driver,
    index: &mut I,
    events: &mut (impl Stream<Item = Scoped<K>> + Unpin),
) -> Vec<I::Change> {
    let mut changes = Vec::new();
    while let Some((scope, event)) = events.next().await {
        let step = driver.step(index, scope, event);
        changes.extend(step.changes);
        if step.listed {
            break;
        }
    }
    changes
}

/// One watch in each scope (`apis`: the scope and the API of the kind there), with `config`
/// and a growing pause between failures, merged: each event with its watch's scope.
pub fn watch<K>(apis: Vec<(Scope, Api<K>)>, config: watcher::Config) -> BoxStream<'static, Scoped<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let streams = apis.into_iter().map(|(scope, api)| {
        watcher(api, config.clone()).default_backoff().map(move |event| (scope.clone(), event)).boxed()
    });
    futures::stream::select_all(streams).boxed()
}

/// The API of a namespaced kind in `scope`: one namespace, or all.
pub fn api_in<K>(client: &kube::Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// A watch's failure as `/status` says it: what failed, and the API server's code and message
/// (a kube error's own text carries the whole Status, debug-printed).
pub(crate) fn failure(error: &watcher::Error) -> String {
    let (what, source) = match error {
        watcher::Error::InitialListFailed(e) => ("its list", e),
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => ("its watch", e),
        watcher::Error::WatchError(status) => return format!("its watch: {} {}", status.code, status.message),
        other => return other.to_string(),
    };
    match source {
        kube::Error::Api(status) => format!("{what}: {} {}", status.code, status.message),
        other => format!("{what}: {other}"),
    }
}

/// A stream of events as a watch of one scope (or of each named one) would bring them, for the
/// indexes' tests: `Init`, an `InitApply` for each object, `InitDone`.
#[cfg(test)]
pub(crate) fn listed<K>(scope: Scope, objects: Vec<K>) -> Vec<Scoped<K>> {
    let applies = objects.into_iter().map(|object| Ok(watcher::Event::InitApply(object)));
    let events = std::iter::once(Ok(watcher::Event::Init)).chain(applies).chain([Ok(watcher::Event::InitDone)]);
    events.map(|event| (scope.clone(), event)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    /// An index of names that records what the driver asked of it; it sets off the names gone.
    #[derive(Default)]
    struct Names {
        held: HashSet<Key>,
        alive: usize,
        failed: usize,
    }

    impl Index<&'static str> for Names {
        type Change = Key;
        fn what(&self) -> String {
            "names".into()
        }
        fn key(&self, name: &&'static str) -> Key {
            key(name)
        }
        fn apply(&mut self, name: &'static str) -> Vec<Key> {
            self.held.insert(self.key(&name));
            Vec::new()
        }
        fn delete(&mut self, key: Key) -> Vec<Key> {
            self.held.remove(&key);
            vec![key]
        }
        fn reset(&mut self, _: &Scope, removed: Vec<Key>) -> Vec<Key> {
            for key in &removed {
                self.held.remove(key);
            }
            removed
        }
        fn alive(&mut self) {
            self.alive += 1;
        }
        fn failed(&mut self, _: &watcher::Error) {
            self.failed += 1;
        }
    }

    fn key(name: &str) -> Key {
        Key::cluster(name)
    }

    fn failure() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    async fn gone_after(names: &mut Names, events: Vec<Scoped<&'static str>>) -> Vec<Key> {
        let mut gone = Vec::new();
        drive(names, stream::iter(events), |key| gone.push(key)).await;
        gone
    }

    #[tokio::test]
    async fn a_relist_that_no_longer_has_an_object_hands_the_index_its_key_as_gone() {
        let mut names = Names::default();
        let mut events = listed(None, vec!["a", "b", "c"]);
        events.push((None, Ok(watcher::Event::Apply("d"))));
        events.push((None, Ok(watcher::Event::Delete("c"))));
        // The watch restarts (its resourceVersion too old): a relist without b and d.
        events.extend(listed(None, vec!["a"]));
        let gone = gone_after(&mut names, events).await;
        assert_eq!(names.held, HashSet::from([key("a")]));
        assert_eq!(gone, vec![key("c"), key("b"), key("d")], "c deleted; b and d gone in the relist, each once");
    }

    #[tokio::test]
    async fn a_list_cut_short_and_started_again_still_hands_over_what_neither_had() {
        let mut names = Names::default();
        let mut events = listed(None, vec!["a", "b"]);
        // A relist fails halfway, after a; the next one has a alone.
        events.extend([(None, Ok(watcher::Event::Init)), (None, Ok(watcher::Event::InitApply("a")))]);
        events.extend(listed(None, vec!["a"]));
        let gone = gone_after(&mut names, events).await;
        assert_eq!(gone, vec![key("b")]);
        assert_eq!(names.held, HashSet::from([key("a")]));
    }

    #[tokio::test]
    async fn a_failed_watch_keeps_what_the_index_holds_and_is_not_a_sign_of_life() {
        let mut names = Names::default();
        let mut events = listed(None, vec!["a", "b"]);
        events.extend([(None, Err(failure())), (None, Err(failure()))]);
        let gone = gone_after(&mut names, events).await;
        assert_eq!(names.held, HashSet::from([key("a"), key("b")]), "nothing dropped on an error");
        assert!(gone.is_empty());
        assert_eq!(names.failed, 2);
        assert_eq!(names.alive, 3, "the two applies and the list's end; not the watcher's own Init");
    }

    #[tokio::test]
    async fn each_scopes_relist_hands_over_that_scopes_keys_alone() {
        // Two namespaces listed, then relisted interleaved, neither with its object now.
        let mut names = Names::default();
        let (x, y) = (Some("x".to_string()), Some("y".to_string()));
        let mut events = listed(x.clone(), vec!["a"]);
        events.extend(listed(y.clone(), vec!["b"]));
        events.extend([(x.clone(), Ok(watcher::Event::Init)), (y.clone(), Ok(watcher::Event::Init))]);
        events.push((x, Ok(watcher::Event::InitDone)));
        let gone = gone_after(&mut names, events).await;
        assert_eq!(gone, vec![key("a")], "x's relist ended; y's is still under way");
        assert_eq!(names.held, HashSet::from([key("b")]));
    }

    #[tokio::test]
    async fn the_first_list_is_driven_to_its_end_and_the_stream_goes_on_after() {
        let mut names = Names::default();
        let mut events = listed(None, vec!["a"]);
        events.push((None, Ok(watcher::Event::Apply("b"))));
        let mut events = stream::iter(events);
        let mut driver = Driver::default();
        let set_off = drive_until_listed(&mut driver, &mut names, &mut events).await;
        assert!(set_off.is_empty());
        assert_eq!(names.held, HashSet::from([key("a")]));
        let (scope, next) = events.next().await.unwrap();
        driver.step(&mut names, scope, next);
        assert_eq!(names.held, HashSet::from([key("a"), key("b")]));
    }
}
