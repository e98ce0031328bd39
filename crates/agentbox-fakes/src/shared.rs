//! What every fake's server needs alike: a request's query as the pairs it holds, and the
//! random ids vendors give their objects.

use axum::extract::Request;

/// The query's pairs, keys repeating (`states=a&states=b`, `command=a&command=b`), as the
/// vendors' clients send them.
pub(crate) struct Query(pub(crate) Vec<(String, String)>);

impl Query {
    pub(crate) fn of(req: &Request) -> Query {
        Query(
            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    pub(crate) fn all(&self, k: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// A random RFC 4122 version-4 UUID, as Kubernetes gives every object and Daytona every
/// sandbox. A failing system RNG leaves zeros: ids need only be unique within one fake, which
/// each fake keeps by what it mixes in (a resourceVersion, a name).
pub(crate) fn uuid4() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}
