//! One driver for every watch, in the shape of kubert's indexes: it turns a watch's events into
//! `apply`, `delete` and `reset` on an index of one kind (pods, namespaces, nodes, owners), marks
//! the watch alive when the API server speaks, and logs and reports its failures. The indexes
//! change the view and send what that sets off; the driver only keeps which keys a list had.

use std::collections::{HashMap, HashSet};

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tracing::warn;

use super::view::Scope;

/// A watch's event, with the scope of the watch (a namespace, or all).
pub type Scoped<K> = (Scope, Result<watcher::Event<K>, watcher::Error>);

/// An object's key in its index: its namespace (empty for a cluster-wide kind) and its name, or
/// whatever the index keys it by in that namespace.
pub type Key = (String, String);

/// One kind's index: what the view does with the objects a watch sees.
pub(crate) trait Index<K> {
    /// What is watched, for the logs.
    fn what(&self) -> String;
    fn key(&self, object: &K) -> Key;
    /// An object seen, new or changed (a list's objects too, as they come).
    async fn apply(&mut self, object: K);
    /// An object deleted, or no longer selected by the watch.
    async fn delete(&mut self, object: K);
    /// A fresh list of `scope` has ended: `listed` has the key of every object it had, each
    /// applied already. Whatever else the index holds in that scope is gone.
    async fn reset(&mut self, scope: &Scope, listed: HashSet<Key>);
    /// The API server said something: the watch is alive.
    fn alive(&mut self) {}
    /// The watch failed; it retries with backoff, and the index keeps what it has.
    fn failed(&mut self, _error: &watcher::Error) {}
}

/// The keys each scope's list has had so far, while it is under way.
#[derive(Default)]
pub struct Driver {
    listing: HashMap<Scope, HashSet<Key>>,
}

impl Driver {
    /// One event of the watch of `scope`, carried out on `index`; whether it ended a list.
    pub(crate) async fn step<K, I: Index<K>>(
        &mut self,
        index: &mut I,
        scope: Scope,
        event: Result<watcher::Event<K>, watcher::Error>,
    ) -> bool {
        // Init is the watcher's own, before it asks anything.
        if matches!(event, Ok(ref e) if !matches!(e, watcher::Event::Init)) {
            index.alive();
        }
        match event {
            Ok(watcher::Event::Init) => {
                self.listing.insert(scope, HashSet::new());
            }
            Ok(watcher::Event::InitApply(object)) => {
                if let Some(listed) = self.listing.get_mut(&scope) {
                    listed.insert(index.key(&object));
                }
                index.apply(object).await;
            }
            Ok(watcher::Event::InitDone) => {
                let listed = self.listing.remove(&scope).unwrap_or_default();
                index.reset(&scope, listed).await;
                return true;
            }
            Ok(watcher::Event::Apply(object)) => index.apply(object).await,
            Ok(watcher::Event::Delete(object)) => index.delete(object).await,
            Err(e) => {
                warn!(watch = %index.what(), error = %e, "watch failed; retrying with backoff");
                index.failed(&e);
            }
        }
        false
    }
}

/// Drives `index` with `events` (each with the scope of its watch) until they end.
pub(crate) async fn drive<K, I: Index<K>>(index: &mut I, events: impl Stream<Item = Scoped<K>>) {
    let mut driver = Driver::default();
    let mut events = std::pin::pin!(events);
    while let Some((scope, event)) = events.next().await {
        driver.step(index, scope, event).await;
    }
}

/// Drives `index` until its first list has ended (the namespaces busyguard leaves alone, which
/// must be known before any pod is looked at); the stream goes on where it stopped.
pub(crate) async fn drive_until_listed<K, I: Index<K>>(
    driver: &mut Driver,
    index: &mut I,
    events: &mut (impl Stream<Item = Scoped<K>> + Unpin),
) {
    while let Some((scope, event)) = events.next().await {
        if driver.step(index, scope, event).await {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    /// An index of names that records what the driver asked of it.
    #[derive(Default)]
    struct Names {
        held: HashSet<Key>,
        gone: Vec<Key>,
        alive: usize,
        failed: usize,
    }

    impl Index<&'static str> for Names {
        fn what(&self) -> String {
            "names".into()
        }
        fn key(&self, name: &&'static str) -> Key {
            (String::new(), name.to_string())
        }
        async fn apply(&mut self, name: &'static str) {
            self.held.insert(self.key(&name));
        }
        async fn delete(&mut self, name: &'static str) {
            let key = self.key(&name);
            self.held.remove(&key);
            self.gone.push(key);
        }
        async fn reset(&mut self, _: &Scope, listed: HashSet<Key>) {
            let gone: Vec<Key> = self.held.difference(&listed).cloned().collect();
            self.held.retain(|key| listed.contains(key));
            self.gone.extend(gone);
        }
        fn alive(&mut self) {
            self.alive += 1;
        }
        fn failed(&mut self, _: &watcher::Error) {
            self.failed += 1;
        }
    }

    fn list(names: &[&'static str]) -> Vec<Result<watcher::Event<&'static str>, watcher::Error>> {
        let applies = names.iter().map(|name| Ok(watcher::Event::InitApply(*name)));
        std::iter::once(Ok(watcher::Event::Init)).chain(applies).chain([Ok(watcher::Event::InitDone)]).collect()
    }

    fn key(name: &str) -> Key {
        (String::new(), name.to_string())
    }

    fn failure() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    #[tokio::test]
    async fn a_relist_that_no_longer_has_an_object_resets_it_as_gone() {
        let mut names = Names::default();
        let mut events = list(&["a", "b", "c"]);
        events.push(Ok(watcher::Event::Apply("d")));
        // The watch restarts (its resourceVersion too old): a relist without b and d.
        events.extend(list(&["a", "c"]));
        drive(&mut names, stream::iter(events.into_iter().map(|e| (None, e)))).await;
        assert_eq!(names.held, HashSet::from([key("a"), key("c")]));
        assert_eq!(names.gone.len(), 2);
        assert!(names.gone.contains(&key("b")) && names.gone.contains(&key("d")));
    }

    #[tokio::test]
    async fn a_failed_watch_keeps_what_the_index_holds_and_is_not_a_sign_of_life() {
        let mut names = Names::default();
        let mut events = list(&["a", "b"]);
        events.push(Err(failure()));
        events.push(Err(failure()));
        drive(&mut names, stream::iter(events.into_iter().map(|e| (None, e)))).await;
        assert_eq!(names.held, HashSet::from([key("a"), key("b")]), "nothing dropped on an error");
        assert!(names.gone.is_empty());
        assert_eq!(names.failed, 2);
        assert_eq!(names.alive, 3, "the two applies and the list's end; not the watcher's own Init");
    }

    #[tokio::test]
    async fn each_scopes_relist_resets_that_scope_alone() {
        // Two namespaces' lists interleaved: each ends with the keys of its own.
        let mut names = Names::default();
        let scoped = |scope: &str, event| (Some(scope.to_string()), event);
        let events = vec![
            scoped("x", Ok(watcher::Event::Init)),
            scoped("y", Ok(watcher::Event::Init)),
            scoped("x", Ok(watcher::Event::InitApply("a"))),
            scoped("y", Ok(watcher::Event::InitApply("b"))),
            scoped("x", Ok(watcher::Event::InitDone)),
        ];
        let mut driver = Driver::default();
        for (scope, event) in events {
            driver.step(&mut names, scope, event).await;
        }
        assert_eq!(names.held, HashSet::from([key("a")]), "x's reset saw only a; y's list is still under way");
        assert_eq!(driver.listing.get(&Some("y".to_string())), Some(&HashSet::from([key("b")])));
    }

    #[tokio::test]
    async fn the_first_list_is_driven_to_its_end_and_the_stream_goes_on_after() {
        let mut names = Names::default();
        let mut events = list(&["a"]);
        events.push(Ok(watcher::Event::Apply("b")));
        let mut events = stream::iter(events.into_iter().map(|e| (None, e)));
        let mut driver = Driver::default();
        drive_until_listed(&mut driver, &mut names, &mut events).await;
        assert_eq!(names.held, HashSet::from([key("a")]));
        let (scope, next) = events.next().await.unwrap();
        driver.step(&mut names, scope, next).await;
        assert_eq!(names.held, HashSet::from([key("a"), key("b")]));
    }
}
