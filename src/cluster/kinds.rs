//! What every watch of a kind that may not be served shares (the owner rules' kinds, the kinds
//! between, Kueue's Workloads): the kind asked of the API server until it is served, with a
//! growing pause, each failure told by the caller while everything else is served; and one watch
//! of its objects in each scope, merged.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use kube::api::ApiResource;
use kube::core::DynamicResourceScope;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::driver::{self, Scoped};
use super::view::Scope;

/// The longest pause between two tries at a kind that is not served.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(60);

/// The kind `find` resolves, once it does: tried again after a second, then twice as long each
/// time up to a minute; each failure is handed to `failed` with the pause before the next try.
pub async fn served<F: Future<Output = Result<ApiResource, String>>>(
    mut find: impl FnMut() -> F,
    mut failed: impl FnMut(String, Duration),
) -> ApiResource {
    let mut pause = Duration::from_secs(1);
    loop {
        match find().await {
            Ok(resource) => return resource,
            Err(why) => failed(why, pause),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

/// One watch of `resource`'s objects (`K`: whole, or their metadata only) in each of `scopes`,
/// merged, each event with its watch's scope.
pub fn watch_scopes<K>(
    client: &Client,
    resource: &ApiResource,
    scopes: Vec<Scope>,
    timeout_secs: u32,
) -> BoxStream<'static, Scoped<K>>
where
    K: Resource<DynamicType = ApiResource, Scope = DynamicResourceScope> + Clone + DeserializeOwned + Debug + Send,
    K: 'static,
{
    let apis = scopes.into_iter().map(|scope| {
        let api: Api<K> = match &scope {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
            None => Api::all_with(client.clone(), resource),
        };
        (scope, api)
    });
    driver::watch(apis.collect(), watcher::Config::default().timeout(timeout_secs))
}
