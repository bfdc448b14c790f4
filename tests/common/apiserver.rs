//! A stand-in kube-apiserver on loopback speaking the real paths and JSON busyguard uses: pod
//! list and watch (with resourceVersions, replay and 410 Gone), pod GET/PATCH/DELETE with
//! preconditions, and events.k8s.io Events. It records every call for tests to assert, and
//! can be told to fail calls. Like the real one it authorizes every call, against the
//! ClusterRole of `manifests/base/rbac.yaml`: a call the manifests do not grant gets 403.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::rbac::{Permission, granted, permission_of};
use super::{eventually, fixture};

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
}

impl Call {
    /// The list and watch requests of busyguard's pod watch.
    pub fn reads_pod_list(&self) -> bool {
        self.method == "GET" && self.path == "/api/v1/pods"
    }

    /// What busyguard asks whatever happens: which namespaces opted out, which nodes are going,
    /// who it is, which of its budgets' Leases are spent.
    pub fn is_bookkeeping(&self) -> bool {
        ["/api/v1/namespaces", "/api/v1/nodes", "/apis/coordination.k8s.io/v1/namespaces/busyguard/leases"]
            .contains(&self.path.as_str())
            || self.path.ends_with("/selfsubjectreviews")
    }

    pub fn is_watch(&self) -> bool {
        self.reads_pod_list() && self.query.split('&').any(|p| p == "watch=true")
    }
}

/// What to do instead of handling a call normally.
#[derive(Debug, Clone)]
pub enum Fault {
    Status(u16),
    /// As busyguard's webhook refuses a write: 409 with busyguard's cause.
    Refused(&'static str),
    /// Answer only after this long.
    Delay(Duration),
}

#[derive(Default)]
struct Store {
    pods: BTreeMap<(String, String), Value>,
    resource_version: u64,
    /// Watch events by resourceVersion; watches resuming from before `oldest` get 410 Gone.
    history: Vec<(u64, String)>,
    oldest: u64,
    calls: Vec<Call>,
    faults: HashMap<(String, String), VecDeque<Fault>>,
    lists_fail: bool,
    /// The network between busyguard and the API server dropped everything without a word.
    silent: bool,
    /// Watch events written but not yet brought to the watches (a watch lagging behind).
    lagging: Option<VecDeque<String>>,
    /// Evictions refused on their preconditions: each spent a PodDisruptionBudget slot first.
    slots_spent_on_refused_evictions: u32,
    event_names: std::collections::HashSet<String>,
    pdbs: BTreeMap<(String, String), Value>,
    /// Leases by (namespace, name), each with its own resourceVersion.
    leases: BTreeMap<(String, String), Value>,
    /// Namespaces' labels by name, as set before busyguard starts (listed, never watched).
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// ReplicaSets and Deployments, by (resource, namespace, name), for reads.
    apps: BTreeMap<(String, String, String), Value>,
    /// Restarting: every call gets 503.
    down: bool,
    permissions_used: BTreeSet<Permission>,
    forbidden: Vec<String>,
}

enum Feed {
    Event(String),
    /// Ends every open watch, as an API server restart or a dropped connection does.
    Close,
}

#[derive(Clone)]
pub struct ApiServer {
    pub addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    feed: broadcast::Sender<Arc<Feed>>,
    /// The namespaces' watch events (`namespace_event`).
    namespace_feed: broadcast::Sender<Arc<Feed>>,
    listening: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl ApiServer {
    pub async fn start() -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (feed, _) = broadcast::channel(1024);
        let (namespace_feed, _) = broadcast::channel(64);
        let addr = listener.local_addr().unwrap();
        let api = ApiServer { addr, store: Arc::default(), feed, namespace_feed, listening: Arc::default() };
        api.listen(listener);
        api
    }

    fn listen(&self, listener: tokio::net::TcpListener) {
        let router = axum::Router::new().fallback(handle).with_state(self.clone());
        let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        *self.listening.lock().unwrap() = Some(task);
    }

    /// Down for `down_for`, as a restarting API server is: watches end, connections still open
    /// get 503, new ones are refused; then back on the same address with the same objects.
    pub async fn restart(&self, down_for: Duration) {
        self.store().down = true;
        if let Some(task) = self.listening.lock().unwrap().take() {
            task.abort();
        }
        self.drop_watches();
        tokio::time::sleep(down_for).await;
        self.listen(tokio::net::TcpListener::bind(self.addr).await.unwrap());
        self.store().down = false;
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client configuration for busyguard pointing here.
    pub fn kube_config(&self) -> kube::Config {
        kube::Config::new(self.url().parse().unwrap())
    }

    /// Where busyguard finds its cluster: here, through the client it builds on any cluster's
    /// configuration (its watch-health layer and timeouts with it).
    pub fn source(&self) -> busyguard::cluster::ClusterSource {
        busyguard::cluster::ClusterSource::Config(Box::new(self.kube_config()))
    }

    /// The Lease `namespace/name`, as stored.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.store().leases.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    pub fn put_lease(&self, namespace: &str, mut lease: Value) {
        let mut store = self.store();
        store.resource_version += 1;
        lease["metadata"]["resourceVersion"] = json!(store.resource_version.to_string());
        lease["metadata"]["namespace"] = json!(namespace);
        let name = lease["metadata"]["name"].as_str().unwrap().to_string();
        store.leases.insert((namespace.to_string(), name), lease);
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap()
    }

    /// Adds or replaces a pod, as a controller or the kubelet writing it would; returns it as
    /// stored (with its new resourceVersion).
    /// A ReplicaSet or Deployment (`resource` "replicasets" or "deployments") busyguard may read.
    pub fn put_app(&self, resource: &str, object: Value) {
        let (namespace, name) = (object["metadata"]["namespace"].as_str(), object["metadata"]["name"].as_str());
        let key = (resource.to_string(), namespace.unwrap_or("capture").to_string(), name.unwrap().to_string());
        self.store().apps.insert(key, object);
    }

    /// A namespace with `labels`, for busyguard's list of them; set it before busyguard starts.
    pub fn put_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.store().namespaces.insert(name.to_string(), labels);
    }

    /// A watch event of the namespace `name`, now with `labels`, as the namespaces' watch brings
    /// it: `kind` is `ADDED` or `MODIFIED` where the watch's selector has it, `DELETED` where it
    /// no longer does (its label changed, or it is gone).
    pub fn namespace_event(&self, kind: &str, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut store = self.store();
        store.resource_version += 1;
        let object = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels, "resourceVersion": store.resource_version.to_string()}});
        store.namespaces.insert(name.to_string(), labels);
        let line = json!({"type": kind, "object": object}).to_string();
        let _ = self.namespace_feed.send(Arc::new(Feed::Event(line)));
    }

    pub fn put_pod(&self, pod: Value) -> Value {
        let mut store = self.store();
        let before = store.pods.get(&key_of(&pod)).cloned();
        let pod = store.save(pod);
        self.emit_change(&mut store, before, pod.clone());
        pod
    }

    /// As a watch with busyguard's label selector sees a change: a pod that stops matching is
    /// DELETED (with its last matching version), one that starts is ADDED.
    fn emit_change(&self, store: &mut Store, before: Option<Value>, after: Value) {
        match (before.filter(opted_in), opted_in(&after)) {
            (Some(_), true) => self.emit(store, "MODIFIED", after),
            (None, true) => self.emit(store, "ADDED", after),
            (Some(mut last), false) => {
                last["metadata"]["resourceVersion"] = after["metadata"]["resourceVersion"].clone();
                self.emit(store, "DELETED", last);
            }
            (None, false) => {}
        }
    }

    pub fn update_pod(&self, namespace: &str, name: &str, change: impl FnOnce(&mut Value)) -> Value {
        let mut pod = self.pod(namespace, name).expect("pod exists");
        change(&mut pod);
        self.put_pod(pod)
    }

    /// Removes a pod at once, as a forced delete or the pod garbage collector does.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        let mut store = self.store();
        let mut pod = store.pods.remove(&(namespace.to_string(), name.to_string())).expect("pod exists");
        store.resource_version += 1;
        pod["metadata"]["resourceVersion"] = json!(store.resource_version.to_string());
        self.emit(&mut store, "DELETED", pod);
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.store().pods.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.store().calls.clone()
    }

    /// A PodDisruptionBudget as a user would create it.
    pub fn put_pdb(&self, pdb: Value) {
        let key = (
            pdb["metadata"]["namespace"].as_str().unwrap().to_string(),
            pdb["metadata"]["name"].as_str().unwrap().to_string(),
        );
        self.store().pdbs.insert(key, pdb);
    }

    pub fn pdbs(&self) -> Vec<Value> {
        self.store().pdbs.values().cloned().collect()
    }

    /// Forgets the calls so far: what a test asserts starts from here.
    pub fn forget_calls(&self) {
        self.store().calls.clear();
    }

    /// Every call but the pod list and watch requests.
    pub fn writes(&self) -> Vec<Call> {
        self.calls().into_iter().filter(|c| !c.reads_pod_list() && !c.is_bookkeeping()).collect()
    }

    /// The next calls of `method` on `path` meet these faults, in order.
    /// The permissions busyguard's calls needed, all granted.
    pub fn permissions_used(&self) -> BTreeSet<Permission> {
        self.store().permissions_used.clone()
    }

    /// Calls refused because the manifests do not grant them.
    pub fn forbidden_calls(&self) -> Vec<String> {
        self.store().forbidden.clone()
    }

    pub fn fault(&self, method: &str, path: &str, faults: impl IntoIterator<Item = Fault>) {
        self.store().faults.entry((method.into(), path.into())).or_default().extend(faults);
    }

    /// As a connection that died without a reset: open watches bring nothing more, and new
    /// requests get no answer at all.
    pub fn go_silent(&self) {
        self.store().silent = true;
    }

    pub fn fail_lists(&self, fail: bool) {
        self.store().lists_fail = fail;
    }

    /// Ends every open watch.
    pub fn drop_watches(&self) {
        let _ = self.feed.send(Arc::new(Feed::Close));
    }

    /// Forgets the watch history: watches resuming from now or before get 410 Gone and relist.
    pub fn compact(&self) {
        let mut store = self.store();
        store.history.clear();
        store.oldest = store.resource_version + 1;
    }

    /// Waits until `count` calls match, or panics after 10 seconds.
    pub async fn wait_for(&self, count: usize, matching: impl Fn(&Call) -> bool) -> Vec<Call> {
        eventually(&format!("{count} matching calls"), async || {
            let calls: Vec<Call> = self.calls().into_iter().filter(|c| matching(c)).collect();
            (calls.len() >= count).then_some(calls)
        })
        .await
    }

    /// From now on, watches bring the changes only when `catch_up` says so.
    pub fn lag_watches(&self) {
        self.store().lagging = Some(VecDeque::new());
    }

    /// Brings the next `count` lagging changes to the watches.
    pub fn catch_up(&self, count: usize) {
        let mut store = self.store();
        let lagging = store.lagging.as_mut().expect("watches lag");
        for line in lagging.drain(..count) {
            let _ = self.feed.send(Arc::new(Feed::Event(line)));
        }
    }

    pub fn slots_spent_on_refused_evictions(&self) -> u32 {
        self.store().slots_spent_on_refused_evictions
    }

    fn emit(&self, store: &mut Store, kind: &str, pod: Value) {
        let line = json!({"type": kind, "object": pod}).to_string();
        store.history.push((store.resource_version, line.clone()));
        if let Some(lagging) = store.lagging.as_mut() {
            lagging.push_back(line);
        } else if !store.silent {
            let _ = self.feed.send(Arc::new(Feed::Event(line)));
        }
    }
}

impl Store {
    fn save(&mut self, mut pod: Value) -> Value {
        self.resource_version += 1;
        pod["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.pods.insert(key_of(&pod), pod.clone());
        pod
    }
}

fn key_of(pod: &Value) -> (String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (text(&pod["metadata"]["namespace"]), text(&pod["metadata"]["name"]))
}

/// A worker pod as the API server stores it (from a real one), in namespace `capture`.
pub fn worker_pod(name: &str, busy: bool) -> Value {
    let mut pod = fixture("pod-delete-by-user.json")["request"]["oldObject"].take();
    let metadata = &mut pod["metadata"];
    metadata["name"] = json!(name);
    metadata["uid"] = json!(format!("uid-{name}"));
    metadata["labels"]["busyguard.io/busy"] = json!(if busy { "true" } else { "false" });
    metadata.as_object_mut().unwrap().remove("managedFields");
    pod
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), [("content-type", "application/json")], body.to_string()).into_response()
}

fn ok(value: Value) -> Response {
    ([("content-type", "application/json")], value.to_string()).into_response()
}

async fn handle(State(api): State<ApiServer>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let bytes = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if api.store().silent {
        return std::future::pending().await;
    }
    let fault = {
        let mut store = api.store();
        if store.down {
            return status(503, "ServiceUnavailable", "apiserver is shutting down");
        }
        store.calls.push(Call {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            body: body.clone(),
        });
        let needed = permission_of(&method, &segments, &query);
        match (needed.as_ref().and_then(granted), needed) {
            // Every authenticated user may ask who it is (system:basic-user).
            (_, Some(permission)) if permission.1 == "selfsubjectreviews" => false,
            // Discovery, as every authenticated user may (system:discovery).
            (_, None) => false,
            (Some(grant), _) => store.permissions_used.insert(grant),
            (None, needed) => {
                store.forbidden.push(format!("{method} {path} needs {needed:?}"));
                let message = format!("User \"system:serviceaccount:busyguard:busyguard\" cannot {method} {path}");
                return status(403, "Forbidden", &message);
            }
        };
        store.faults.get_mut(&(method.to_string(), path.clone())).and_then(VecDeque::pop_front)
    };
    match fault {
        Some(Fault::Status(code)) => return status(code, "Injected", "injected by the test"),
        Some(Fault::Refused(cause)) => {
            let message = "admission webhook \"pods.busyguard.io\" denied the request: pod takes no new task";
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": "Conflict", "code": 409,
                "details": {"causes": [{"reason": cause, "message": "injected by the test"}]}});
            return (StatusCode::CONFLICT, [("content-type", "application/json")], body.to_string()).into_response();
        }
        Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
        None => {}
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["api", "v1", "pods"]) => list_or_watch(&api, &query),
        // The opted-in pods of one namespace (a namespace guarded again is listed so).
        (&Method::GET, ["api", "v1", "namespaces", namespace, "pods"]) => {
            let store = api.store();
            let items: Vec<Value> = (store.pods.iter())
                .filter(|((ns, _), pod)| ns == namespace && opted_in(pod))
                .map(|(_, pod)| pod.clone())
                .collect();
            let rv = store.resource_version.to_string();
            ok(json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}))
        }
        (m, ["api", "v1", "namespaces", namespace, "pods", name]) => pod_call(&api, m, namespace, name, &query, body),
        // An eviction deletes the pod as its deleteOptions say. As the real API server's, it
        // takes a PodDisruptionBudget slot before the delete checks the preconditions (counted
        // here as if one covered every pod): a refused delete has spent it.
        (&Method::POST, ["api", "v1", "namespaces", namespace, "pods", name, "eviction"]) => {
            let deleted = pod_call(&api, &Method::DELETE, namespace, name, &query, body["deleteOptions"].clone());
            if deleted.status() == StatusCode::CONFLICT {
                api.store().slots_spent_on_refused_evictions += 1;
            }
            if deleted.status() != StatusCode::OK {
                return deleted;
            }
            let done = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
            (StatusCode::CREATED, [("content-type", "application/json")], done.to_string()).into_response()
        }
        (&Method::GET, ["apis", "apps", "v1", "namespaces", namespace, resource, name]) => {
            let key = (resource.to_string(), namespace.to_string(), name.to_string());
            match api.store().apps.get(&key) {
                Some(object) => ok(object.clone()),
                None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
            }
        }
        (&Method::GET, ["apis", "policy", "v1", "poddisruptionbudgets"]) => {
            let items: Vec<Value> = api.store().pdbs.values().cloned().collect();
            ok(json!({"kind": "PodDisruptionBudgetList", "apiVersion": "policy/v1", "metadata": {}, "items": items}))
        }
        (&Method::GET, ["apis", "policy", "v1", "namespaces", namespace, "poddisruptionbudgets"]) => {
            let store = api.store();
            let items: Vec<Value> =
                (store.pdbs.iter()).filter(|((ns, _), _)| ns == namespace).map(|(_, p)| p.clone()).collect();
            ok(json!({"kind": "PodDisruptionBudgetList", "apiVersion": "policy/v1", "metadata": {}, "items": items}))
        }
        (&Method::POST, ["apis", "policy", "v1", "namespaces", namespace, "poddisruptionbudgets"]) => {
            let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let mut store = api.store();
            if store.pdbs.contains_key(&(namespace.to_string(), name.clone())) {
                return status(409, "AlreadyExists", &format!("poddisruptionbudgets \"{name}\" already exists"));
            }
            store.pdbs.insert((namespace.to_string(), name), body.clone());
            (StatusCode::CREATED, [("content-type", "application/json")], body.to_string()).into_response()
        }
        (&Method::DELETE, ["apis", "policy", "v1", "namespaces", namespace, "poddisruptionbudgets", name]) => {
            match api.store().pdbs.remove(&(namespace.to_string(), name.to_string())) {
                Some(gone) => ok(gone),
                None => status(404, "NotFound", &format!("poddisruptionbudgets \"{name}\" not found")),
            }
        }
        (m, ["apis", "coordination.k8s.io", "v1", "namespaces", namespace, "leases", rest @ ..]) => {
            lease_call(&api, m, namespace, rest.first().copied(), body)
        }
        (&Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"]) => {
            // Names are unique, as in the API server: a second create of a name is a conflict.
            if let Some(name) = body["metadata"]["name"].as_str()
                && !api.store().event_names.insert(name.to_string())
            {
                return status(409, "AlreadyExists", &format!("events.events.k8s.io \"{name}\" already exists"));
            }
            (StatusCode::CREATED, [("content-type", "application/json")], body.to_string()).into_response()
        }
        // The namespaces put (selected by one `key=value`), no node going; a watch brings the
        // namespaces' events (none for nodes) until its timeout.
        (&Method::GET, ["api", "v1", kind @ ("namespaces" | "nodes")]) => {
            let param = |key: &str| query.split('&').find_map(|p| p.strip_prefix(key)?.strip_prefix('='));
            if param("watch") != Some("true") {
                let store = api.store();
                let rv = store.resource_version.to_string();
                let selector = param("labelSelector").map(|s| s.replace("%2F", "/").replace("%3D", "="));
                let selected = |labels: &BTreeMap<String, String>| {
                    selector
                        .as_deref()
                        .and_then(|s| s.split_once('='))
                        .is_none_or(|(k, v)| labels.get(k).is_some_and(|l| l == v))
                };
                let (list, items) = match *kind {
                    "nodes" => ("NodeList", Vec::new()),
                    _ => (
                        "NamespaceList",
                        (store.namespaces.iter())
                            .filter(|(_, labels)| selected(labels))
                            .map(|(name, labels)| json!({"metadata": {"name": name, "labels": labels}}))
                            .collect(),
                    ),
                };
                return ok(json!({"kind": list, "apiVersion": "v1", "metadata": {"resourceVersion": rv},
                    "items": items}));
            }
            let timeout = param("timeoutSeconds").and_then(|s| s.parse().ok()).unwrap_or(300);
            let events = (*kind == "namespaces").then(|| api.namespace_feed.subscribe());
            ok_stream(Vec::new(), events, Some(Duration::from_secs(timeout)))
        }
        (&Method::POST, ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"]) => ok(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
            "status": {"userInfo": {"username": "system:serviceaccount:busyguard:busyguard"}}})),
        _ => status(404, "NotFound", &format!("{method} {path} is not served here")),
    }
}

/// Leases as the API server keeps them: created once (409 after), replaced only from the
/// resourceVersion stored (409 otherwise), each write a new resourceVersion.
fn lease_call(api: &ApiServer, method: &Method, namespace: &str, name: Option<&str>, mut body: Value) -> Response {
    let mut store = api.store();
    let name = name.map(str::to_string).unwrap_or_else(|| body["metadata"]["name"].as_str().unwrap_or_default().into());
    let key = (namespace.to_string(), name.clone());
    let conflict = |why: &str| status(409, "Conflict", &format!("leases \"{name}\": {why}"));
    match *method {
        // A list of the namespace's Leases (busyguard lists only its own, by label).
        Method::GET if name.is_empty() => {
            let items: Vec<Value> =
                (store.leases.iter()).filter(|((ns, _), _)| ns == namespace).map(|(_, l)| l.clone()).collect();
            let rv = store.resource_version.to_string();
            ok(
                json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "metadata": {"resourceVersion": rv}, "items": items}),
            )
        }
        Method::GET => match store.leases.get(&key) {
            Some(lease) => ok(lease.clone()),
            None => status(404, "NotFound", &format!("leases \"{name}\" not found")),
        },
        Method::DELETE => {
            let Some(stored) = store.leases.get(&key) else {
                return status(404, "NotFound", &format!("leases \"{name}\" not found"));
            };
            let precondition = &body["preconditions"]["resourceVersion"];
            if !precondition.is_null() && *precondition != stored["metadata"]["resourceVersion"] {
                return conflict("the resourceVersion in the precondition does not match");
            }
            let gone = store.leases.remove(&key).unwrap();
            ok(gone)
        }
        Method::POST | Method::PUT => {
            let stored = store.leases.get(&key).map(|l| l["metadata"]["resourceVersion"].clone());
            match (method == Method::POST, stored) {
                (true, Some(_)) => return conflict("already exists"),
                (false, None) => return status(404, "NotFound", &format!("leases \"{name}\" not found")),
                (false, Some(rv)) if body["metadata"]["resourceVersion"] != rv => {
                    return conflict("the object has been modified");
                }
                _ => {}
            }
            store.resource_version += 1;
            body["metadata"]["resourceVersion"] = json!(store.resource_version.to_string());
            body["metadata"]["namespace"] = json!(namespace);
            store.leases.insert(key, body.clone());
            ok(body)
        }
        _ => status(405, "MethodNotAllowed", "not served here"),
    }
}

/// Whether busyguard's watch selects the pod (its label selector: the busy label, any value).
fn opted_in(pod: &Value) -> bool {
    pod["metadata"]["labels"].get("busyguard.io/busy").is_some()
}

fn list_or_watch(api: &ApiServer, query: &str) -> Response {
    let param = |key: &str| query.split('&').find_map(|p| p.strip_prefix(key)?.strip_prefix('='));
    let store = api.store();
    if param("watch") != Some("true") {
        if store.lists_fail {
            return status(500, "InternalError", "etcd is unavailable");
        }
        let items: Vec<Value> = store.pods.values().filter(|p| opted_in(p)).cloned().collect();
        let rv = store.resource_version.to_string();
        return ok(json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}));
    }
    let since: u64 = param("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    if since < store.oldest {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "too old resource version", "reason": "Expired", "code": 410}});
        return ok_stream(vec![gone.to_string()], None, None);
    }
    let replay = store.history.iter().filter(|(rv, _)| *rv > since).map(|(_, line)| line.clone()).collect();
    // As the API server does: the watch ends after `timeoutSeconds`, and the client opens another.
    let timeout = param("timeoutSeconds").and_then(|s| s.parse().ok()).map(Duration::from_secs);
    ok_stream(replay, Some(api.feed.subscribe()), timeout)
}

/// A watch response: the replayed events, then live ones until the feed closes.
fn ok_stream(replay: Vec<String>, live: Option<broadcast::Receiver<Arc<Feed>>>, ends: Option<Duration>) -> Response {
    let replay =
        futures::stream::iter(replay.into_iter().map(|line| Ok::<_, std::io::Error>(Bytes::from(line + "\n"))));
    let live = futures::stream::unfold(live, |live| async move {
        let mut live = live?;
        loop {
            match live.recv().await {
                Ok(feed) => match &*feed {
                    Feed::Event(line) => return Some((Ok(Bytes::from(format!("{line}\n"))), Some(live))),
                    Feed::Close => return None,
                },
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let ends = tokio::time::sleep(ends.unwrap_or(Duration::MAX / 4));
    let body = Body::from_stream(futures::StreamExt::take_until(futures::StreamExt::chain(replay, live), ends));
    ([("content-type", "application/json")], body).into_response()
}

fn pod_call(api: &ApiServer, method: &Method, namespace: &str, name: &str, query: &str, body: Value) -> Response {
    let mut store = api.store();
    let key = (namespace.to_string(), name.to_string());
    let Some(current) = store.pods.get(&key).cloned() else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    let precondition = |uid: &Value, rv: &Value| {
        let uid_differs = uid.is_string() && uid != &current["metadata"]["uid"];
        let rv_differs = rv.is_string() && rv != &current["metadata"]["resourceVersion"];
        (uid_differs || rv_differs).then(|| {
            status(
                409,
                "Conflict",
                &format!("Operation cannot be fulfilled on pods \"{name}\": the object has been modified"),
            )
        })
    };
    match *method {
        Method::GET => ok(current),
        Method::PATCH => {
            if let Some(conflict) = precondition(&body["metadata"]["uid"], &body["metadata"]["resourceVersion"]) {
                return conflict;
            }
            let mut patched = current;
            let mut patch = body;
            patch["metadata"].as_object_mut().map(|m| m.remove("resourceVersion"));
            json_patch::merge(&mut patched, &patch);
            // As the API server tracks it: the field manager named in the query owns the
            // annotations it set.
            if let Some(manager) = query.split('&').find_map(|p| p.strip_prefix("fieldManager=")) {
                let annotations = patch["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
                let fields: serde_json::Map<String, Value> = annotations
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, _)| (format!("f:{k}"), json!({})))
                    .collect();
                if !fields.is_empty() {
                    let entry = json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": fields}}});
                    let managed = &mut patched["metadata"]["managedFields"];
                    if !managed.is_array() {
                        *managed = json!([]);
                    }
                    managed.as_array_mut().unwrap().push(entry);
                }
            }
            let before = store.pods.get(&key).cloned();
            let patched = store.save(patched);
            api.emit_change(&mut store, before, patched.clone());
            ok(patched)
        }
        Method::DELETE => {
            let preconditions = &body["preconditions"];
            if let Some(conflict) = precondition(&preconditions["uid"], &preconditions["resourceVersion"]) {
                return conflict;
            }
            let mut deleting = current;
            deleting["metadata"]["deletionTimestamp"] = json!(jiff::Timestamp::now().to_string());
            deleting["metadata"]["deletionGracePeriodSeconds"] = json!(30);
            let before = store.pods.get(&key).cloned();
            let deleting = store.save(deleting);
            api.emit_change(&mut store, before, deleting.clone());
            ok(deleting)
        }
        _ => status(405, "MethodNotAllowed", "not served here"),
    }
}
