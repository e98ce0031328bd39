//! The cluster's objects (namespaces, pods, PersistentVolumeClaims, Secrets, the kinds only
//! stored ([`Kind::STORED`]), agent-sandbox's), their one resourceVersion
//! counter, and the events a watch reads: each change is numbered, kept in a bounded history
//! (so a watch may start from a resourceVersion a list answered) and broadcast to live
//! watches.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::kube::status::ApiError;

/// How many events a watch may start behind the newest: an older resourceVersion is the real
/// server's 410 Expired, and the client lists again.
const HISTORY: usize = 4096;

/// The kinds of object the fake keeps per namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Pod,
    PersistentVolumeClaim,
    Secret,
    /// The kinds only stored ([`Kind::STORED`]): served as the real server serves them,
    /// acted on by nothing but the kubelet's reading of NetworkPolicies.
    NetworkPolicy,
    ServiceAccount,
    Service,
    Deployment,
    Role,
    RoleBinding,
    /// agent-sandbox's kinds (`sandbox`), served only in agent-sandbox mode.
    Sandbox,
    SandboxTemplate,
    SandboxClaim,
    SandboxWarmPool,
}

impl Kind {
    /// The resource's plural, as paths and error messages name it.
    pub(crate) fn resource(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::PersistentVolumeClaim => "persistentvolumeclaims",
            Kind::Secret => "secrets",
            Kind::NetworkPolicy => "networkpolicies",
            Kind::ServiceAccount => "serviceaccounts",
            Kind::Service => "services",
            Kind::Deployment => "deployments",
            Kind::Role => "roles",
            Kind::RoleBinding => "rolebindings",
            Kind::Sandbox => "sandboxes",
            Kind::SandboxTemplate => "sandboxtemplates",
            Kind::SandboxClaim => "sandboxclaims",
            Kind::SandboxWarmPool => "sandboxwarmpools",
        }
    }

    pub(crate) fn group(self) -> &'static str {
        match self {
            Kind::Pod | Kind::PersistentVolumeClaim | Kind::Secret | Kind::ServiceAccount | Kind::Service => "",
            Kind::NetworkPolicy => "networking.k8s.io",
            Kind::Deployment => "apps",
            Kind::Role | Kind::RoleBinding => "rbac.authorization.k8s.io",
            Kind::Sandbox => "agents.x-k8s.io",
            Kind::SandboxTemplate | Kind::SandboxClaim | Kind::SandboxWarmPool => "extensions.agents.x-k8s.io",
        }
    }

    pub(crate) fn kind(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::Secret => "Secret",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::Service => "Service",
            Kind::Deployment => "Deployment",
            Kind::Role => "Role",
            Kind::RoleBinding => "RoleBinding",
            Kind::Sandbox => "Sandbox",
            Kind::SandboxTemplate => "SandboxTemplate",
            Kind::SandboxClaim => "SandboxClaim",
            Kind::SandboxWarmPool => "SandboxWarmPool",
        }
    }

    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Kind::Pod | Kind::PersistentVolumeClaim | Kind::Secret | Kind::ServiceAccount | Kind::Service => "v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            Kind::Deployment => "apps/v1",
            Kind::Role | Kind::RoleBinding => "rbac.authorization.k8s.io/v1",
            Kind::Sandbox => "agents.x-k8s.io/v1beta1",
            Kind::SandboxTemplate | Kind::SandboxClaim | Kind::SandboxWarmPool => "extensions.agents.x-k8s.io/v1beta1",
        }
    }

    /// agent-sandbox's four custom resources, in discovery's order.
    pub(crate) const SANDBOX_KINDS: [Kind; 4] = [
        Kind::Sandbox,
        Kind::SandboxClaim,
        Kind::SandboxTemplate,
        Kind::SandboxWarmPool,
    ];

    /// The built-in kinds the fake stores and serves without acting on them (no controller
    /// runs a Deployment, no proxy a Service, no authorizer reads a Role): created, read,
    /// patched and deleted as the real server does (`writes::create_stored`), all at `v1`
    /// of their group.
    pub(crate) const STORED: [Kind; 6] = [
        Kind::ServiceAccount,
        Kind::Service,
        Kind::Deployment,
        Kind::NetworkPolicy,
        Kind::Role,
        Kind::RoleBinding,
    ];

    /// The kind only stored of `group`'s `plural` (at v1), if there is one.
    pub(crate) fn stored(group: &str, plural: &str) -> Option<Kind> {
        Kind::STORED
            .into_iter()
            .find(|k| k.group() == group && k.resource() == plural)
    }

    /// The custom resource of `group`'s `plural`, if agent-sandbox defines one.
    pub(crate) fn custom(group: &str, plural: &str) -> Option<Kind> {
        Kind::SANDBOX_KINDS
            .into_iter()
            .find(|k| k.group() == group && k.resource() == plural)
    }

    /// The resource's singular name (a CRD's `names.singular`).
    pub(crate) fn singular(self) -> &'static str {
        match self {
            Kind::Pod => "pod",
            Kind::PersistentVolumeClaim => "persistentvolumeclaim",
            Kind::Secret => "secret",
            Kind::NetworkPolicy => "networkpolicy",
            Kind::ServiceAccount => "serviceaccount",
            Kind::Service => "service",
            Kind::Deployment => "deployment",
            Kind::Role => "role",
            Kind::RoleBinding => "rolebinding",
            Kind::Sandbox => "sandbox",
            Kind::SandboxTemplate => "sandboxtemplate",
            Kind::SandboxClaim => "sandboxclaim",
            Kind::SandboxWarmPool => "sandboxwarmpool",
        }
    }

    /// The resource's short names (a CRD's `names.shortNames`).
    pub(crate) fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::Pod => &["po"],
            Kind::PersistentVolumeClaim => &["pvc"],
            Kind::Secret | Kind::Role | Kind::RoleBinding => &[],
            Kind::NetworkPolicy => &["netpol"],
            Kind::ServiceAccount => &["sa"],
            Kind::Service => &["svc"],
            Kind::Deployment => &["deploy"],
            Kind::Sandbox => &["sandbox"],
            Kind::SandboxTemplate => &["sandboxtemplate"],
            Kind::SandboxClaim => &["sandboxclaim"],
            Kind::SandboxWarmPool => &["swp"],
        }
    }

    /// Whether the CRD has a `status` subresource (then the main resource ignores status).
    pub(crate) fn has_status(self) -> bool {
        matches!(self, Kind::Sandbox | Kind::SandboxClaim | Kind::SandboxWarmPool)
    }

    pub(crate) fn not_found(self, name: &str) -> ApiError {
        ApiError::not_found(self.resource(), self.group(), name)
    }
}

/// One change of one object.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) kind: Kind,
    pub(crate) namespace: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub(crate) kind_of_change: &'static str,
    pub(crate) object: Value,
    /// The object before a MODIFIED change, so a watch whose selector the change moves the
    /// object in or out of sees ADDED or DELETED, as the real watch cache sends.
    pub(crate) before: Option<Value>,
    pub(crate) rv: u64,
}

/// Everything under one lock: a handful of objects, changed in microseconds.
pub(crate) struct Inner {
    rv: u64,
    namespaces: BTreeMap<String, Value>,
    objects: BTreeMap<(Kind, String, String), Value>,
    history: VecDeque<Arc<Event>>,
}

pub(crate) struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
}

/// Now as the API writes times: RFC 3339 in UTC, whole seconds.
pub(crate) fn now_rfc3339() -> String {
    let s = agentbox_core::rfc3339(agentbox_core::now_ms() as i64);
    // `2026-11-30T06:59:01.123Z` → `2026-11-30T06:59:01Z`
    match s.rfind('.') {
        Some(dot) => format!("{}Z", &s[..dot]),
        None => s,
    }
}

/// A random RFC 4122 version-4 uid, as the real server gives every object.
pub(crate) fn new_uid() -> String {
    crate::ids::uuid4()
}

/// Five random characters of the alphabet the real server's `generateName` suffix uses.
pub(crate) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut b = [0u8; 5];
    let _ = getrandom::fill(&mut b);
    b.iter()
        .map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char)
        .collect()
}

impl Store {
    pub(crate) fn new(namespaces: &[String]) -> Store {
        let (events, _) = broadcast::channel(1024);
        let store = Store {
            inner: Mutex::new(Inner {
                rv: 1,
                namespaces: BTreeMap::new(),
                objects: BTreeMap::new(),
                history: VecDeque::new(),
            }),
            events,
        };
        {
            let mut i = store.lock();
            for ns in namespaces {
                i.rv += 1;
                let rv = i.rv;
                i.namespaces.insert(
                    ns.clone(),
                    json!({
                        "kind": "Namespace",
                        "apiVersion": "v1",
                        "metadata": {
                            "name": ns,
                            "uid": new_uid(),
                            "resourceVersion": rv.to_string(),
                            "creationTimestamp": now_rfc3339(),
                            "labels": {"kubernetes.io/metadata.name": ns},
                        },
                        "spec": {"finalizers": ["kubernetes"]},
                        "status": {"phase": "Active"},
                    }),
                );
            }
        }
        store
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data: go on with it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// Record and broadcast a change made under `inner`.
    fn emit(&self, inner: &mut Inner, event: Event) {
        let e = Arc::new(event);
        inner.history.push_back(e.clone());
        while inner.history.len() > HISTORY {
            inner.history.pop_front();
        }
        // No watch listening is no error.
        let _ = self.events.send(e);
    }

    /// Store a new object: `None` fills its name from `generateName`. Sets uid,
    /// resourceVersion, creationTimestamp and namespace. 404 for an unknown namespace, 409
    /// for a taken name.
    pub(crate) fn create(&self, kind: Kind, ns: &str, obj: Value) -> Result<Value, ApiError> {
        self.create_with(kind, ns, obj, |_, _| Ok(()))
    }

    /// [`Store::create`], `fill` given the store and the named object under the same lock
    /// just before it is stored: for what the server allocates against what exists (a
    /// Service's cluster IP), which two creates at once must not both take.
    pub(crate) fn create_with<F>(&self, kind: Kind, ns: &str, mut obj: Value, fill: F) -> Result<Value, ApiError>
    where
        F: FnOnce(&Inner, &mut Value) -> Result<(), ApiError>,
    {
        let mut i = self.lock();
        if !i.namespaces.contains_key(ns) {
            return Err(ApiError::not_found("namespaces", "", ns));
        }
        let name = match obj["metadata"]["name"].as_str().filter(|s| !s.is_empty()) {
            Some(n) => n.to_string(),
            None => {
                let prefix = obj["metadata"]["generateName"].as_str().unwrap_or("").to_string();
                let mut n = format!("{prefix}{}", name_suffix());
                while i.objects.contains_key(&(kind, ns.to_string(), n.clone())) {
                    n = format!("{prefix}{}", name_suffix());
                }
                n
            }
        };
        let key = (kind, ns.to_string(), name.clone());
        if i.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind.resource(), kind.group(), &name));
        }
        fill(&i, &mut obj)?;
        i.rv += 1;
        let rv = i.rv;
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        meta["namespace"] = json!(ns);
        meta["uid"] = json!(new_uid());
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(now_rfc3339());
        obj["kind"] = json!(kind.kind());
        obj["apiVersion"] = json!(kind.api_version());
        i.objects.insert(key, obj.clone());
        self.emit(
            &mut i,
            Event {
                kind,
                namespace: ns.to_string(),
                kind_of_change: "ADDED",
                object: obj.clone(),
                before: None,
                rv,
            },
        );
        Ok(obj)
    }

    pub(crate) fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&(kind, ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Change the object with `change`, which may refuse; a change that leaves the object as it
    /// was is no change (no new resourceVersion, no event), as the real server answers a no-op
    /// patch. `uid`, when given, must be the object's (a pod deleted and made again under the
    /// same name is another pod).
    pub(crate) fn update<F>(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        uid: Option<&str>,
        change: F,
    ) -> Result<Value, ApiError>
    where
        F: FnOnce(&Value) -> Result<Value, ApiError>,
    {
        let mut i = self.lock();
        let key = (kind, ns.to_string(), name.to_string());
        let Some(old) = i.objects.get(&key).cloned() else {
            return Err(kind.not_found(name));
        };
        if let Some(uid) = uid
            && old["metadata"]["uid"].as_str() != Some(uid)
        {
            return Err(kind.not_found(name));
        }
        let mut new = change(&old)?;
        if new == old {
            return Ok(old);
        }
        i.rv += 1;
        let rv = i.rv;
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        i.objects.insert(key, new.clone());
        self.emit(
            &mut i,
            Event {
                kind,
                namespace: ns.to_string(),
                kind_of_change: "MODIFIED",
                object: new.clone(),
                before: Some(old),
                rv,
            },
        );
        Ok(new)
    }

    /// Remove the object; the DELETED event carries it at the deletion's resourceVersion.
    pub(crate) fn delete(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        let mut i = self.lock();
        let Some(mut obj) = i.objects.remove(&(kind, ns.to_string(), name.to_string())) else {
            return Err(kind.not_found(name));
        };
        i.rv += 1;
        let rv = i.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.emit(
            &mut i,
            Event {
                kind,
                namespace: ns.to_string(),
                kind_of_change: "DELETED",
                object: obj.clone(),
                before: None,
                rv,
            },
        );
        Ok(obj)
    }
}

impl Inner {
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    pub(crate) fn namespace(&self, ns: &str) -> Option<&Value> {
        self.namespaces.get(ns)
    }

    pub(crate) fn namespaces(&self) -> impl Iterator<Item = &Value> {
        self.namespaces.values()
    }

    /// Every object of `kind`, in `ns` or in all namespaces, ordered by namespace and name.
    pub(crate) fn objects(&self, kind: Kind, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((k, n, _), _)| *k == kind && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The events after `rv`, or `None` when the history no longer reaches back that far.
    pub(crate) fn since(&self, rv: u64) -> Option<Vec<Arc<Event>>> {
        if rv >= self.rv {
            return Some(Vec::new());
        }
        let oldest = self.history.front().map_or(self.rv + 1, |e| e.rv);
        if rv + 1 < oldest {
            return None;
        }
        Some(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }
}
