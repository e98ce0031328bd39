//! What the real API server's validation refuses, with its messages: names (RFC 1123, RFC
//! 1035 for a Service, a path segment for RBAC's), label keys and values, resource
//! quantities, a pod's containers, volumes and restart policy, a PersistentVolumeClaim's spec,
//! a Secret's keys, size and type, a NetworkPolicy's selector, what the kinds only stored
//! require (a Deployment's selector and template, a Service's ports, a Role's rules, a
//! RoleBinding's roleRef and subjects), and which fields an update may change.

use serde_json::{Value, json};

use crate::kube::selector::{LabelSelector, labels_of};
use crate::kube::status::Cause;
use crate::kube::store::Kind;

const DNS1123_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const CONFIG_KEY: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";
const FILE_MODE: &str = "must be a number between 0 and 0777 (octal), both inclusive";
/// A Secret's data, all values together, at most (`core.MaxSecretSize`).
const MAX_SECRET_SIZE: usize = 1 << 20;
const QUALIFIED_NAME: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// An RFC 1123 subdomain (a pod's or a NetworkPolicy's name), as `IsDNS1123Subdomain`.
pub(crate) fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > 253 {
        return Err("must be no more than 253 characters".into());
    }
    if s.split('.').all(is_label) {
        Ok(())
    } else {
        Err(DNS1123_SUBDOMAIN.into())
    }
}

/// An RFC 1123 label (a container's name, a namespace's), as `IsDNS1123Label`.
pub(crate) fn dns1123_label(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    if is_label(s) { Ok(()) } else { Err(DNS1123_LABEL.into()) }
}

/// An RFC 1035 label (a Service's name), as `IsDNS1035Label`.
pub(crate) fn dns1035_label(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    if is_label(s) && s.as_bytes()[0].is_ascii_lowercase() {
        Ok(())
    } else {
        Err(DNS1035_LABEL.into())
    }
}

/// A Role's or RoleBinding's name: any path segment (`system:controller:x` is one), as
/// `ValidateRBACName` reads it (`IsValidPathSegmentName`; its first complaint).
pub(crate) fn rbac_name(s: &str) -> Result<(), String> {
    if s == "." || s == ".." {
        return Err(format!("may not be '{s}'"));
    }
    match ["/", "%"].into_iter().find(|c| s.contains(c)) {
        Some(c) => Err(format!("may not contain '{c}'")),
        None => Ok(()),
    }
}

/// A port's name (a Service port's `targetPort`, when not a number), as `IsValidPortName`.
fn port_name(s: &str) -> Vec<String> {
    let mut why = Vec::new();
    if s.len() > 15 {
        why.push("must be no more than 15 characters".to_string());
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        why.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string());
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        why.push("must contain at least one letter (a-z)".to_string());
    }
    if s.contains("--") {
        why.push("must not contain consecutive hyphens".to_string());
    }
    if s.starts_with('-') || s.ends_with('-') {
        why.push("must not begin or end with a hyphen".to_string());
    }
    why
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// A label or annotation key: `[prefix/]name`, as `IsQualifiedName`.
pub(crate) fn label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        dns1123_subdomain(p).map_err(|e| format!("prefix part {e}"))?;
    }
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Err("name part must be no more than 63 characters".into());
    }
    if !is_name_part(name) {
        return Err(QUALIFIED_NAME.into());
    }
    Ok(())
}

/// A label value, as `IsValidLabelValue`.
pub(crate) fn label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    if v.is_empty() || is_name_part(v) {
        Ok(())
    } else {
        Err(LABEL_VALUE.into())
    }
}

/// The causes of an object's `metadata`: its name (given or to be generated) an RFC 1123
/// subdomain, labels and annotations.
pub(crate) fn metadata(meta: &Value, causes: &mut Vec<Cause>) {
    metadata_named(meta, dns1123_subdomain, causes);
}

/// [`metadata`], the name held to `rule` (the kind's: most take a subdomain).
pub(crate) fn metadata_named(meta: &Value, rule: fn(&str) -> Result<(), String>, causes: &mut Vec<Cause>) {
    match meta.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => {
            if let Err(why) = rule(n) {
                causes.push(Cause::invalid("metadata.name", &Value::from(n), why));
            }
        }
        _ => match meta.get("generateName").and_then(Value::as_str) {
            // A prefix: the random suffix makes it end in an alphanumeric.
            Some(g) if !g.is_empty() => {
                if let Err(why) = rule(&format!("{g}a")) {
                    causes.push(Cause::invalid("metadata.generateName", &Value::from(g), why));
                }
            }
            _ => causes.push(Cause {
                message: "name or generateName is required".into(),
                ..Cause::required("metadata.name")
            }),
        },
    }
    if let Some(labels) = meta.get("labels") {
        label_map(labels, "metadata.labels", causes);
    }
    if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0usize;
        for (k, v) in ann {
            if let Err(why) = label_key(k) {
                causes.push(Cause::invalid("metadata.annotations", &Value::from(k.as_str()), why));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > 256 * 1024 {
            causes.push(Cause {
                reason: "FieldValueTooLong",
                message: format!("Too long: may not be more than 262144 bytes (got {total})"),
                field: "metadata.annotations".into(),
            });
        }
    }
}

/// The causes of a map of labels (`ValidateLabels`): its keys and values, at `field`.
fn label_map(labels: &Value, field: &str, causes: &mut Vec<Cause>) {
    match labels.as_object() {
        Some(m) => {
            for (k, v) in m {
                if let Err(why) = label_key(k) {
                    causes.push(Cause::invalid(field, &Value::from(k.as_str()), why));
                }
                match v.as_str() {
                    Some(s) => {
                        if let Err(why) = label_value(s) {
                            causes.push(Cause::invalid(field, v, why));
                        }
                    }
                    None => causes.push(Cause::invalid(field, v, "must be a string")),
                }
            }
        }
        None if labels.is_null() => {}
        None => causes.push(Cause::invalid(field, labels, "must be a map of strings")),
    }
}

/// A resource quantity (`500m`, `1Gi`, `2`, `1e3`) as a number, or why it is not one: the
/// real server refuses such a body as it decodes it (400), before validation.
pub(crate) fn quantity(s: &str) -> Result<f64, String> {
    const RE: &str = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
    let split = s
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || (*i == 0 && (*c == '+' || *c == '-'))))
        .map_or(s.len(), |(i, _)| i);
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num == "+" || num == "-" || num.matches('.').count() > 1 {
        return Err(RE.into());
    }
    let n: f64 = num.parse().map_err(|_| RE.to_string())?;
    let mult = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| RE.to_string())?;
            10f64.powi(exp)
        }
        _ => return Err(RE.into()),
    };
    Ok(n * mult)
}

/// Whether `v` (a quantity in a body) decodes: a string or a number.
fn quantity_value(v: &Value) -> Result<f64, String> {
    match v {
        Value::String(s) => quantity(s),
        Value::Number(n) => n.as_f64().ok_or_else(|| "not a number".to_string()),
        _ => Err("quantities must be strings or numbers".into()),
    }
}

/// Decode errors the real server answers 400 for (a body that is no Pod): bad quantities and
/// the wrong JSON types where the fake reads a field.
pub(crate) fn pod_decodes(pod: &Value) -> Result<(), String> {
    let bad = |what: String| Err(format!("Pod in version \"v1\" cannot be handled as a Pod: {what}"));
    if !pod.is_object() {
        return bad("the body is not a JSON object".into());
    }
    for (i, c) in containers(pod).iter().enumerate() {
        for which in ["limits", "requests"] {
            if let Some(m) = c.pointer(&format!("/resources/{which}")).and_then(Value::as_object) {
                for (res, q) in m {
                    if let Err(why) = quantity_value(q) {
                        return bad(format!("spec.containers[{i}].resources.{which}[{res}]: {why}"));
                    }
                }
            }
        }
        for field in ["command", "args"] {
            if let Some(v) = c.get(field)
                && !v.is_null()
                && !v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
            {
                return bad(format!(
                    "json: cannot unmarshal {} into Go struct field Container.spec.containers.{field} of type []string",
                    kind_of(v)
                ));
            }
        }
    }
    if let Some(v) = pod.pointer("/spec/activeDeadlineSeconds")
        && !v.is_null()
        && !v.is_i64()
    {
        return bad(format!(
            "json: cannot unmarshal {} into Go struct field PodSpec.spec.activeDeadlineSeconds of type int64",
            kind_of(v)
        ));
    }
    Ok(())
}

/// A JSON value's type, as the API server's decoding errors name it.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Null => "null",
    }
}

pub(crate) fn containers(pod: &Value) -> Vec<Value> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The causes of a new pod (after defaults are filled).
pub(crate) fn pod(pod: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    metadata(pod.get("metadata").unwrap_or(&Value::Null), &mut causes);
    let spec = pod.get("spec").cloned().unwrap_or(Value::Null);
    let cs = containers(pod);
    if cs.is_empty() {
        causes.push(Cause::required("spec.containers"));
    }
    let mut names = std::collections::BTreeSet::new();
    let volumes: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for (i, c) in cs.iter().enumerate() {
        let at = format!("spec.containers[{i}]");
        match c.get("name").and_then(Value::as_str) {
            None | Some("") => causes.push(Cause::required(format!("{at}.name"))),
            Some(n) => {
                if let Err(why) = dns1123_label(n) {
                    causes.push(Cause::invalid(format!("{at}.name"), &Value::from(n), why));
                } else if !names.insert(n.to_string()) {
                    causes.push(Cause {
                        reason: "FieldValueDuplicate",
                        message: format!("Duplicate value: {n:?}"),
                        field: format!("{at}.name"),
                    });
                }
            }
        }
        match c.get("image").and_then(Value::as_str) {
            None => causes.push(Cause::required(format!("{at}.image"))),
            Some(s) if s.trim().is_empty() => causes.push(Cause::required(format!("{at}.image"))),
            Some(_) => {}
        }
        for which in ["limits", "requests"] {
            if let Some(m) = c.pointer(&format!("/resources/{which}")).and_then(Value::as_object) {
                for (res, q) in m {
                    if quantity_value(q).is_ok_and(|n| n < 0.0) {
                        causes.push(Cause::invalid(
                            format!("{at}.resources.{which}[{res}]"),
                            q,
                            "must be greater than or equal to 0",
                        ));
                    }
                }
            }
        }
        if let (Some(req), Some(lim)) = (
            c.pointer("/resources/requests").and_then(Value::as_object),
            c.pointer("/resources/limits").and_then(Value::as_object),
        ) {
            for (res, q) in req {
                if let (Some(l), Ok(r)) = (lim.get(res), quantity_value(q))
                    && let Ok(lv) = quantity_value(l)
                    && r > lv
                {
                    causes.push(Cause::invalid(
                        format!("{at}.resources.requests"),
                        q,
                        format!(
                            "must be less than or equal to {res} limit of {}",
                            l.as_str().map_or(l.to_string(), str::to_string)
                        ),
                    ));
                }
            }
        }
        if let Some(env) = c.get("env").and_then(Value::as_array) {
            for (j, e) in env.iter().enumerate() {
                if e.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
                    causes.push(Cause::required(format!("{at}.env[{j}].name")));
                }
            }
        }
        if let Some(mounts) = c.get("volumeMounts").and_then(Value::as_array) {
            for (j, m) in mounts.iter().enumerate() {
                let name = m.get("name").and_then(Value::as_str).unwrap_or("");
                if name.is_empty() {
                    causes.push(Cause::required(format!("{at}.volumeMounts[{j}].name")));
                } else if !volumes.iter().any(|v| v == name) {
                    causes.push(Cause {
                        reason: "FieldValueNotFound",
                        message: format!("Not found: {name:?}"),
                        field: format!("{at}.volumeMounts[{j}].name"),
                    });
                }
                if m.get("mountPath").and_then(Value::as_str).is_none_or(str::is_empty) {
                    causes.push(Cause::required(format!("{at}.volumeMounts[{j}].mountPath")));
                }
            }
        }
    }
    if let Some(v) = spec.get("volumes").and_then(Value::as_array) {
        let mut seen = std::collections::BTreeSet::new();
        for (i, vol) in v.iter().enumerate() {
            let at = format!("spec.volumes[{i}]");
            volume_source(vol, &at, &mut causes);
            match vol.get("name").and_then(Value::as_str) {
                None | Some("") => causes.push(Cause::required(format!("{at}.name"))),
                Some(n) => {
                    if let Err(why) = dns1123_label(n) {
                        causes.push(Cause::invalid(format!("{at}.name"), &Value::from(n), why));
                    }
                    if !seen.insert(n.to_string()) {
                        causes.push(Cause {
                            reason: "FieldValueDuplicate",
                            message: format!("Duplicate value: {n:?}"),
                            field: format!("{at}.name"),
                        });
                    }
                }
            }
        }
    }
    let policy = spec.get("restartPolicy").cloned().unwrap_or(Value::Null);
    if !matches!(policy.as_str(), Some("Always" | "OnFailure" | "Never")) {
        causes.push(Cause::not_supported(
            "spec.restartPolicy",
            &policy,
            &["Always", "OnFailure", "Never"],
        ));
    }
    if let Some(d) = spec.get("activeDeadlineSeconds").and_then(Value::as_i64)
        && !(1..=2_147_483_647).contains(&d)
    {
        causes.push(Cause::invalid(
            "spec.activeDeadlineSeconds",
            &Value::from(d),
            "must be between 1 and 2147483647, inclusive",
        ));
    }
    causes
}

/// Every volume source a pod may name, in the order `validateVolumeSource` counts them, with
/// the field its "may not specify more than 1 volume type" names (its own spelling, typo
/// and all).
const VOLUME_SOURCES: &[(&str, &str)] = &[
    ("emptyDir", "emptyDir"),
    ("hostPath", "hostPath"),
    ("gitRepo", "gitRepo"),
    ("gcePersistentDisk", "gcePersistentDisk"),
    ("awsElasticBlockStore", "awsElasticBlockStore"),
    ("secret", "secret"),
    ("nfs", "nfs"),
    ("iscsi", "iscsi"),
    ("glusterfs", "glusterfs"),
    ("flocker", "flocker"),
    ("persistentVolumeClaim", "persistentVolumeClaim"),
    ("rbd", "rbd"),
    ("cinder", "cinder"),
    ("cephfs", "cephFS"),
    ("quobyte", "quobyte"),
    ("downwardAPI", "downwarAPI"),
    ("fc", "fc"),
    ("flexVolume", "flexVolume"),
    ("configMap", "configMap"),
    ("azureFile", "azureFile"),
    ("vsphereVolume", "vsphereVolume"),
    ("photonPersistentDisk", "photonPersistentDisk"),
    ("portworxVolume", "portworxVolume"),
    ("azureDisk", "azureDisk"),
    ("storageos", "storageos"),
    ("projected", "projected"),
    ("scaleIO", "scaleIO"),
    ("csi", "csi"),
    ("ephemeral", "ephemeral"),
    ("image", "image"),
];

/// The hostPath types the real server accepts (`supportedHostPathTypes`, sorted as its
/// message lists them).
pub(crate) const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];

/// The causes of one of a pod's volumes' source (`validateVolumeSource`): exactly one
/// source, and the fields of those the fake's kubelet mounts (emptyDir, hostPath, secret,
/// persistentVolumeClaim) checked as the real server checks them. Other sources are counted
/// only: the kubelet says what it does not mount.
fn volume_source(vol: &Value, at: &str, causes: &mut Vec<Cause>) {
    let mut n = 0;
    for (key, named) in VOLUME_SOURCES {
        let Some(src) = vol.get(*key).filter(|v| !v.is_null()) else {
            continue;
        };
        if n > 0 {
            causes.push(Cause::forbidden(
                format!("{at}.{named}"),
                "may not specify more than 1 volume type",
            ));
            continue;
        }
        n += 1;
        let at = format!("{at}.{key}");
        match *key {
            "hostPath" => host_path(src, &at, causes),
            "secret" => {
                if src.get("secretName").and_then(Value::as_str).is_none_or(str::is_empty) {
                    causes.push(Cause::required(format!("{at}.secretName")));
                }
                file_mode(src, "defaultMode", &at, causes);
                for (i, item) in src
                    .get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    key_to_path(item, &format!("{at}.items[{i}]"), causes);
                }
            }
            "persistentVolumeClaim" if src.get("claimName").and_then(Value::as_str).is_none_or(str::is_empty) => {
                causes.push(Cause::required(format!("{at}.claimName")));
            }
            _ => {}
        }
    }
    if n == 0 {
        causes.push(Cause {
            message: "Required value: must specify a volume type".into(),
            ..Cause::required(at)
        });
    }
}

/// `validateHostPathVolumeSource`: a path without `..`, a known type.
fn host_path(src: &Value, at: &str, causes: &mut Vec<Cause>) {
    let path = src.get("path").and_then(Value::as_str).unwrap_or("");
    if path.is_empty() {
        causes.push(Cause::required(format!("{at}.path")));
        return;
    }
    if path.split('/').any(|p| p == "..") {
        causes.push(Cause::invalid(
            format!("{at}.path"),
            &Value::from(path),
            "must not contain '..'",
        ));
    }
    if let Some(t) = src.get("type").filter(|t| !t.is_null())
        && !t.as_str().is_some_and(|t| HOST_PATH_TYPES.contains(&t))
    {
        causes.push(Cause::not_supported(format!("{at}.type"), t, HOST_PATH_TYPES));
    }
}

/// A file mode field, 0 to 0777.
fn file_mode(src: &Value, field: &str, at: &str, causes: &mut Vec<Cause>) {
    if let Some(m) = src.get(field).and_then(Value::as_i64)
        && !(0..=0o777).contains(&m)
    {
        causes.push(Cause::invalid(format!("{at}.{field}"), &Value::from(m), FILE_MODE));
    }
}

/// `validateKeyToPath`: a key, a relative path without `..`, a mode.
fn key_to_path(item: &Value, at: &str, causes: &mut Vec<Cause>) {
    if item.get("key").and_then(Value::as_str).is_none_or(str::is_empty) {
        causes.push(Cause::required(format!("{at}.key")));
    }
    let path = item.get("path").and_then(Value::as_str).unwrap_or("");
    if path.is_empty() {
        causes.push(Cause::required(format!("{at}.path")));
    }
    local_path(path, &format!("{at}.path"), causes);
    file_mode(item, "mode", at, causes);
}

/// `ValidateLocalNonReservedPath`: relative, no `..` element, not starting with `..`.
pub(crate) fn local_path(path: &str, field: &str, causes: &mut Vec<Cause>) {
    if path.starts_with('/') {
        causes.push(Cause::invalid(field, &Value::from(path), "must be a relative path"));
    }
    let backsteps = path.split('/').any(|p| p == "..");
    if backsteps {
        causes.push(Cause::invalid(field, &Value::from(path), "must not contain '..'"));
    }
    if path.starts_with("..") && !path.starts_with("../") {
        causes.push(Cause::invalid(field, &Value::from(path), "must not start with '..'"));
    }
}

/// A Secret's (or ConfigMap's) key, as `IsConfigMapKey`.
pub(crate) fn config_key(k: &str) -> Vec<String> {
    let mut why = Vec::new();
    if k.len() > 253 {
        why.push("must be no more than 253 characters".to_string());
    }
    if k.is_empty()
        || !k
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        why.push(CONFIG_KEY.to_string());
    }
    if k.starts_with("..") {
        why.push("must not start with '..'".to_string());
    } else if k == "." {
        why.push("must not be '.'".to_string());
    }
    why
}

/// Decode errors the real server answers 400 for in a PersistentVolumeClaim: a storage
/// request that is no quantity.
pub(crate) fn claim_decodes(pvc: &Value) -> Result<(), String> {
    let bad = |what: String| {
        Err(format!(
            "PersistentVolumeClaim in version \"v1\" cannot be handled as a PersistentVolumeClaim: {what}"
        ))
    };
    for which in ["limits", "requests"] {
        if let Some(m) = pvc
            .pointer(&format!("/spec/resources/{which}"))
            .and_then(Value::as_object)
        {
            for (res, q) in m {
                if let Err(why) = quantity_value(q) {
                    return bad(format!("spec.resources.{which}[{res}]: {why}"));
                }
            }
        }
    }
    if let Some(v) = pvc.pointer("/spec/accessModes")
        && !v.is_null()
        && !v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    {
        return bad(format!(
            "json: cannot unmarshal {} into Go struct field PersistentVolumeClaimSpec.spec.accessModes of type []v1.PersistentVolumeAccessMode",
            kind_of(v)
        ));
    }
    Ok(())
}

/// The causes of a new PersistentVolumeClaim (`ValidatePersistentVolumeClaim`, after the
/// defaults), its name a subdomain as the real server's.
pub(crate) fn persistent_volume_claim(pvc: &Value) -> Vec<Cause> {
    const MODES: &[&str] = &["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"];
    let mut causes = Vec::new();
    metadata(pvc.get("metadata").unwrap_or(&Value::Null), &mut causes);
    let spec = &pvc["spec"];
    let modes: Vec<Value> = spec["accessModes"].as_array().cloned().unwrap_or_default();
    if modes.is_empty() {
        causes.push(Cause {
            message: "Required value: at least 1 access mode is required".into(),
            ..Cause::required("spec.accessModes")
        });
    }
    let (mut once_pod, mut other) = (false, false);
    for m in &modes {
        match m.as_str() {
            Some("ReadWriteOncePod") => once_pod = true,
            Some(s) if MODES.contains(&s) => other = true,
            _ => causes.push(Cause::not_supported("spec.accessModes", m, MODES)),
        }
    }
    if once_pod && other {
        causes.push(Cause::forbidden(
            "spec.accessModes",
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
    match spec.pointer("/resources/requests/storage") {
        None | Some(Value::Null) => causes.push(Cause::required("spec.resources[storage]")),
        Some(q) => {
            if quantity_value(q).is_ok_and(|n| n <= 0.0) {
                causes.push(Cause::invalid(
                    "spec.resources[storage]",
                    q,
                    "must be greater than zero",
                ));
            }
        }
    }
    if let Some(c) = spec["storageClassName"].as_str().filter(|c| !c.is_empty())
        && let Err(why) = dns1123_subdomain(c)
    {
        causes.push(Cause::invalid("spec.storageClassName", &Value::from(c), why));
    }
    if let Some(m) = spec.get("volumeMode").filter(|m| !m.is_null())
        && !matches!(m.as_str(), Some("Block" | "Filesystem"))
    {
        causes.push(Cause::not_supported("spec.volumeMode", m, &["Block", "Filesystem"]));
    }
    causes
}

/// The causes of a Secret (`ValidateSecret`, but for its metadata, which [`metadata`] checks)
/// with its `data` decoded and `stringData` merged in: keys, total size, and the keys each
/// built-in type requires. Values are never shown (the real server writes `<secret contents
/// redacted>` where it would).
pub(crate) fn secret(meta: &Value, kind: &str, data: &[(String, Vec<u8>)], causes: &mut Vec<Cause>) {
    let mut total = 0usize;
    for (k, v) in data {
        for why in config_key(k) {
            causes.push(Cause::invalid(format!("data[{k}]"), &Value::from(k.as_str()), why));
        }
        total += v.len();
    }
    if total > MAX_SECRET_SIZE {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {MAX_SECRET_SIZE} bytes"),
            field: "data".into(),
        });
    }
    let has = |k: &str| data.iter().any(|(key, _)| key == k);
    let value = |k: &str| data.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_slice());
    let redacted = Value::from("<secret contents redacted>");
    match kind {
        "kubernetes.io/service-account-token"
            if meta["annotations"]["kubernetes.io/service-account.name"]
                .as_str()
                .is_none_or(str::is_empty) =>
        {
            causes.push(Cause::required(
                "metadata.annotations[kubernetes.io/service-account.name]",
            ));
        }
        "kubernetes.io/dockercfg" | "kubernetes.io/dockerconfigjson" => {
            let key = if kind == "kubernetes.io/dockercfg" {
                ".dockercfg"
            } else {
                ".dockerconfigjson"
            };
            match value(key) {
                None => causes.push(Cause::required(format!("data[{key}]"))),
                Some(v) => {
                    if let Err(e) = serde_json::from_slice::<serde_json::Map<String, Value>>(v) {
                        causes.push(Cause::invalid(format!("data[{key}]"), &redacted, e.to_string()));
                    }
                }
            }
        }
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            causes.push(Cause::required("data[username]"));
            causes.push(Cause::required("data[password]"));
        }
        "kubernetes.io/ssh-auth" if value("ssh-privatekey").is_none_or(<[u8]>::is_empty) => {
            causes.push(Cause::required("data[ssh-privatekey]"));
        }
        "kubernetes.io/tls" => {
            for key in ["tls.crt", "tls.key"] {
                if !has(key) {
                    causes.push(Cause::required(format!("data[{key}]")));
                }
            }
        }
        _ => {}
    }
}

/// The causes of an update from `old` to `new` (a patched pod): metadata may change
/// (labels, annotations, checked as on create), `spec.activeDeadlineSeconds` may be set or
/// lowered, and nothing else of the spec may change.
pub(crate) fn pod_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    metadata(new.get("metadata").unwrap_or(&Value::Null), &mut causes);
    for f in ["name", "namespace", "uid", "creationTimestamp"] {
        if old["metadata"].get(f) != new["metadata"].get(f) {
            causes.push(Cause::invalid(
                format!("metadata.{f}"),
                new["metadata"].get(f).unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
    }
    let (o, n) = (&old["spec"], &new["spec"]);
    let old_d = o.get("activeDeadlineSeconds").and_then(Value::as_i64);
    let new_d = n.get("activeDeadlineSeconds").and_then(Value::as_i64);
    if let Some(d) = new_d
        && !(1..=2_147_483_647).contains(&d)
    {
        causes.push(Cause::invalid(
            "spec.activeDeadlineSeconds",
            &Value::from(d),
            "must be between 1 and 2147483647, inclusive",
        ));
    } else if let Some(od) = old_d
        && new_d.is_none_or(|nd| nd > od)
    {
        causes.push(Cause::invalid(
            "spec.activeDeadlineSeconds",
            &new_d.map_or(Value::Null, Value::from),
            "must be less than or equal to previous value",
        ));
    }
    let strip = |s: &Value| {
        let mut s = s.clone();
        if let Some(m) = s.as_object_mut() {
            m.remove("activeDeadlineSeconds");
        }
        s
    };
    if strip(o) != strip(n) {
        causes.push(Cause::forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        ));
    }
    causes
}

/// The causes of a new NetworkPolicy.
pub(crate) fn network_policy(np: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    metadata(np.get("metadata").unwrap_or(&Value::Null), &mut causes);
    match np.pointer("/spec/podSelector") {
        None => causes.push(Cause::required("spec.podSelector")),
        Some(sel) => {
            if let Err(why) = crate::kube::selector::LabelSelector::from_object(sel) {
                causes.push(Cause::invalid("spec.podSelector", sel, why));
            }
        }
    }
    if let Some(types) = np.pointer("/spec/policyTypes").and_then(Value::as_array) {
        for (i, t) in types.iter().enumerate() {
            if !matches!(t.as_str(), Some("Ingress" | "Egress")) {
                causes.push(Cause::not_supported(
                    format!("spec.policyTypes[{i}]"),
                    t,
                    &["Ingress", "Egress"],
                ));
            }
        }
    }
    causes
}

/// `Required value: why`, as the real server words a required field with a detail.
fn required_because(field: impl Into<String>, why: &str) -> Cause {
    Cause {
        message: format!("Required value: {why}"),
        ..Cause::required(field)
    }
}

/// `must be greater than or equal to 0` for a negative integer at `field`
/// (`ValidateNonnegativeField`).
fn nonnegative(obj: &Value, key: &str, field: &str, causes: &mut Vec<Cause>) {
    if let Some(n) = obj.get(key).and_then(Value::as_i64)
        && n < 0
    {
        causes.push(Cause::invalid(
            field,
            &Value::from(n),
            "must be greater than or equal to 0",
        ));
    }
}

/// The causes of a new or patched object of a kind only stored ([`Kind::STORED`]), its
/// defaults filled: its metadata, its name by its kind's rule, and what its kind requires.
pub(crate) fn stored(kind: Kind, obj: &Value) -> Vec<Cause> {
    let meta = obj.get("metadata").unwrap_or(&Value::Null);
    let mut causes = Vec::new();
    match kind {
        Kind::NetworkPolicy => return network_policy(obj),
        Kind::Service => {
            metadata_named(meta, dns1035_label, &mut causes);
            service(obj, &mut causes);
        }
        Kind::Deployment => {
            metadata(meta, &mut causes);
            deployment(obj, &mut causes);
        }
        Kind::Role => {
            metadata_named(meta, rbac_name, &mut causes);
            role(obj, &mut causes);
        }
        Kind::RoleBinding => {
            metadata_named(meta, rbac_name, &mut causes);
            role_binding(obj, &mut causes);
        }
        _ => metadata(meta, &mut causes),
    }
    causes
}

/// What an update of a kind only stored may not change (beyond what [`stored`] checks of the
/// object as patched): a Deployment's selector, a RoleBinding's roleRef, a Service's cluster
/// IPs.
pub(crate) fn stored_update(kind: Kind, old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    match kind {
        Kind::Deployment if new["spec"]["selector"] != old["spec"]["selector"] => {
            causes.push(Cause::invalid(
                "spec.selector",
                &new["spec"]["selector"],
                "field is immutable",
            ));
        }
        // The internal type, which has no JSON names, as the real message shows it.
        Kind::RoleBinding if new["roleRef"] != old["roleRef"] => causes.push(Cause::invalid(
            "roleRef",
            &json!({
                "APIGroup": new["roleRef"]["apiGroup"].as_str().unwrap_or(""),
                "Kind": new["roleRef"]["kind"].as_str().unwrap_or(""),
                "Name": new["roleRef"]["name"].as_str().unwrap_or(""),
            }),
            "cannot change roleRef",
        )),
        Kind::Service
            if new["spec"]["clusterIPs"] != old["spec"]["clusterIPs"]
                || new["spec"]["clusterIP"] != old["spec"]["clusterIP"] =>
        {
            causes.push(Cause::invalid(
                "spec.clusterIPs[0]",
                &new["spec"]["clusterIPs"],
                "may not change once set",
            ));
        }
        _ => {}
    }
    causes
}

/// A Deployment's spec (`ValidateDeploymentSpec`): counts not negative, a selector that
/// selects something and its template's labels, and the template a valid pod template whose
/// pods restart `Always`. Its strategy is defaulted, not checked.
fn deployment(d: &Value, causes: &mut Vec<Cause>) {
    let spec = &d["spec"];
    nonnegative(spec, "replicas", "spec.replicas", causes);
    let template = &spec["template"];
    let labels = template["metadata"].get("labels").cloned().unwrap_or(Value::Null);
    let mismatched = match spec.get("selector").filter(|s| !s.is_null()) {
        // An absent selector selects nothing: the template's labels do not match it either.
        None => {
            causes.push(Cause::required("spec.selector"));
            true
        }
        Some(sel) => {
            if let Some(m) = sel.get("matchLabels") {
                label_map(m, "spec.selector.matchLabels", causes);
            }
            let empty = sel["matchLabels"].as_object().is_none_or(serde_json::Map::is_empty)
                && sel["matchExpressions"].as_array().is_none_or(Vec::is_empty);
            if empty {
                causes.push(Cause::invalid(
                    "spec.selector",
                    sel,
                    "empty selector is invalid for deployment",
                ));
            }
            match LabelSelector::from_object(sel) {
                // The empty selector selects everything.
                Ok(s) => !s.0.is_empty() && !s.matches(&labels_of(template)),
                Err(_) => {
                    causes.push(Cause::invalid("spec.selector", sel, "invalid label selector"));
                    false
                }
            }
        }
    };
    if mismatched {
        causes.push(Cause::invalid(
            "spec.template.metadata.labels",
            &labels,
            "`selector` does not match template `labels`",
        ));
    }
    // The template as a pod (named, since a template's name is not its pods'), its causes
    // named where the template holds them: `spec.template.spec...`, and its labels and
    // annotations at `spec.template.labels` and `.annotations`, as `ValidatePodTemplateSpec`
    // names them.
    let mut meta = template
        .get("metadata")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or(json!({}));
    meta["name"] = json!("template");
    for mut c in pod(&json!({"metadata": meta, "spec": template["spec"]})) {
        let field = c.field.strip_prefix("metadata.").unwrap_or(&c.field);
        c.field = format!("spec.template.{field}");
        causes.push(c);
    }
    let policy = template["spec"].get("restartPolicy").cloned().unwrap_or(Value::Null);
    if policy != "Always" {
        causes.push(Cause::not_supported(
            "spec.template.spec.restartPolicy",
            &policy,
            &["Always"],
        ));
    }
    if template["spec"]
        .get("activeDeadlineSeconds")
        .is_some_and(|v| !v.is_null())
    {
        causes.push(Cause::forbidden(
            "spec.template.spec.activeDeadlineSeconds",
            "activeDeadlineSeconds in ReplicaSet is not Supported",
        ));
    }
    nonnegative(spec, "minReadySeconds", "spec.minReadySeconds", causes);
    nonnegative(spec, "revisionHistoryLimit", "spec.revisionHistoryLimit", causes);
    nonnegative(spec, "progressDeadlineSeconds", "spec.progressDeadlineSeconds", causes);
    if let Some(p) = spec.get("progressDeadlineSeconds").and_then(Value::as_i64)
        && p <= spec["minReadySeconds"].as_i64().unwrap_or(0)
    {
        causes.push(Cause::invalid(
            "spec.progressDeadlineSeconds",
            &Value::from(p),
            "must be greater than minReadySeconds",
        ));
    }
}

/// A Service's spec (`ValidateService`, its common part): its type and session affinity,
/// its selector's labels, and its ports: at least one (but headless or ExternalName), each
/// with a port number, a known protocol, a target port that is a number or a port name, and a
/// name (unique, a DNS label) when there are several.
fn service(svc: &Value, causes: &mut Vec<Cause>) {
    const TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
    let spec = &svc["spec"];
    let ty = spec.get("type").cloned().unwrap_or(Value::Null);
    if !ty.as_str().is_some_and(|t| TYPES.contains(&t)) {
        causes.push(Cause::not_supported("spec.type", &ty, TYPES));
    }
    let affinity = spec.get("sessionAffinity").cloned().unwrap_or(Value::Null);
    if !matches!(affinity.as_str(), Some("ClientIP" | "None")) {
        causes.push(Cause::not_supported(
            "spec.sessionAffinity",
            &affinity,
            &["ClientIP", "None"],
        ));
    }
    if let Some(sel) = spec.get("selector") {
        label_map(sel, "spec.selector", causes);
    }
    let ports: Vec<Value> = spec["ports"].as_array().cloned().unwrap_or_default();
    let headless = spec["clusterIP"] == "None";
    if ports.is_empty() && !headless && ty != "ExternalName" {
        causes.push(Cause::required("spec.ports"));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = format!("spec.ports[{i}]");
        match p.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) {
            None if ports.len() > 1 => causes.push(Cause::required(format!("{at}.name"))),
            None => {}
            Some(n) => {
                if let Err(why) = dns1123_label(n) {
                    causes.push(Cause::invalid(format!("{at}.name"), &Value::from(n), why));
                }
                if !names.insert(n.to_string()) {
                    causes.push(Cause {
                        reason: "FieldValueDuplicate",
                        message: format!("Duplicate value: {n:?}"),
                        field: format!("{at}.name"),
                    });
                }
            }
        }
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&port) {
            causes.push(Cause::invalid(
                format!("{at}.port"),
                &Value::from(port),
                "must be between 1 and 65535, inclusive",
            ));
        }
        let protocol = p.get("protocol").cloned().unwrap_or(Value::Null);
        if !matches!(protocol.as_str(), Some("SCTP" | "TCP" | "UDP")) {
            causes.push(Cause::not_supported(
                format!("{at}.protocol"),
                &protocol,
                &["SCTP", "TCP", "UDP"],
            ));
        }
        match p.get("targetPort") {
            Some(Value::Number(n)) if !n.as_i64().is_some_and(|n| (1..=65535).contains(&n)) => {
                causes.push(Cause::invalid(
                    format!("{at}.targetPort"),
                    &Value::Number(n.clone()),
                    "must be between 1 and 65535, inclusive",
                ))
            }
            Some(Value::String(name)) => {
                for why in port_name(name) {
                    causes.push(Cause::invalid(
                        format!("{at}.targetPort"),
                        &Value::from(name.as_str()),
                        why,
                    ));
                }
            }
            _ => {}
        }
    }
}

/// A Role's rules (`ValidatePolicyRule`, namespaced): verbs, and API groups and resources
/// (a namespaced rule cannot name non-resource URLs).
fn role(r: &Value, causes: &mut Vec<Cause>) {
    let empty = |v: &Value| v.as_array().is_none_or(Vec::is_empty);
    for (i, rule) in r["rules"].as_array().into_iter().flatten().enumerate() {
        let at = format!("rules[{i}]");
        if empty(&rule["verbs"]) {
            causes.push(required_because(
                format!("{at}.verbs"),
                "verbs must contain at least one value",
            ));
        }
        if !empty(&rule["nonResourceURLs"]) {
            causes.push(Cause::invalid(
                format!("{at}.nonResourceURLs"),
                &rule["nonResourceURLs"],
                "namespaced rules cannot apply to non-resource URLs",
            ));
            continue;
        }
        if empty(&rule["apiGroups"]) {
            causes.push(required_because(
                format!("{at}.apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if empty(&rule["resources"]) {
            causes.push(required_because(
                format!("{at}.resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
}

/// A RoleBinding's roleRef (a Role or ClusterRole of RBAC's group, named) and subjects
/// (`ValidateRoleBinding`), their `apiGroup` defaulted.
fn role_binding(b: &Value, causes: &mut Vec<Cause>) {
    const GROUP: &str = "rbac.authorization.k8s.io";
    let role_ref = &b["roleRef"];
    let text = |v: &Value| Value::from(v.as_str().unwrap_or(""));
    if role_ref["apiGroup"] != GROUP {
        causes.push(Cause::not_supported(
            "roleRef.apiGroup",
            &text(&role_ref["apiGroup"]),
            &[GROUP],
        ));
    }
    if !matches!(role_ref["kind"].as_str(), Some("Role" | "ClusterRole")) {
        causes.push(Cause::not_supported(
            "roleRef.kind",
            &text(&role_ref["kind"]),
            &["Role", "ClusterRole"],
        ));
    }
    match role_ref["name"].as_str().filter(|n| !n.is_empty()) {
        None => causes.push(Cause::required("roleRef.name")),
        Some(n) => {
            if let Err(why) = rbac_name(n) {
                causes.push(Cause::invalid("roleRef.name", &Value::from(n), why));
            }
        }
    }
    for (i, subject) in b["subjects"].as_array().into_iter().flatten().enumerate() {
        let at = format!("subjects[{i}]");
        let name = subject["name"].as_str().unwrap_or("");
        if name.is_empty() {
            causes.push(Cause::required(format!("{at}.name")));
        }
        let group = subject["apiGroup"].as_str().unwrap_or("");
        match subject["kind"].as_str().unwrap_or("") {
            "ServiceAccount" => {
                if !name.is_empty()
                    && let Err(why) = dns1123_subdomain(name)
                {
                    causes.push(Cause::invalid(format!("{at}.name"), &Value::from(name), why));
                }
                if !group.is_empty() {
                    causes.push(Cause::not_supported(
                        format!("{at}.apiGroup"),
                        &Value::from(group),
                        &[""],
                    ));
                }
            }
            "User" | "Group" if group != GROUP => {
                causes.push(Cause::not_supported(
                    format!("{at}.apiGroup"),
                    &Value::from(group),
                    &[GROUP],
                ));
            }
            "User" | "Group" => {}
            other => causes.push(Cause::not_supported(
                format!("{at}.kind"),
                &Value::from(other),
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keys_and_quantities_are_read_as_the_real_server_reads_them() {
        assert!(dns1123_subdomain("a-b.c1").is_ok());
        for bad in ["A", "-a", "a_b", "a.", ""] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
        assert!(label_key("example.com/app").is_ok());
        assert!(label_key("a b").is_err());
        assert!(label_value("").is_ok());
        assert!(label_value("bad value!").is_err());
        assert_eq!(quantity("500m").unwrap(), 0.5);
        assert_eq!(quantity("1Gi").unwrap(), 1073741824.0);
        assert_eq!(quantity("1e3").unwrap(), 1000.0);
        for bad in ["", "m", "1x", "1.2.3", "Gi"] {
            assert!(quantity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_service_and_rbac_name_their_objects_by_their_own_rules() {
        assert!(dns1035_label("agentbox").is_ok());
        assert!(
            dns1035_label("1agentbox").is_err(),
            "a Service's name starts with a letter"
        );
        assert!(rbac_name("system:controller:agentbox").is_ok());
        assert_eq!(rbac_name("a/b").unwrap_err(), "may not contain '/'");
        assert_eq!(rbac_name("..").unwrap_err(), "may not be '..'");
        assert!(port_name("https").is_empty());
        assert_eq!(port_name("8443"), ["must contain at least one letter (a-z)"]);
    }
}
