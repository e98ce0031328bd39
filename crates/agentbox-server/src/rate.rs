//! Each key's request rate: a token bucket per key, as many tokens as its requests per minute,
//! filled at that rate. A request with no token left is answered 429 (`rate_limited`) with
//! `Retry-After`, the seconds until the next token. Each server counts on its own: behind a load
//! balancer of N replicas a key may make up to N times its rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use agentbox_core::ErrorCode;

use crate::error::ApiError;
use crate::keys::KeyInfo;

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The buckets of the keys that have a rate.
#[derive(Default)]
pub(crate) struct Rates {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Rates {
    /// Take a token of `key`'s, or say how long until there is one.
    pub(crate) fn take(&self, key: &KeyInfo) -> Result<(), ApiError> {
        self.take_at(key, Instant::now())
    }

    fn take_at(&self, key: &KeyInfo, now: Instant) -> Result<(), ApiError> {
        let Some(per_minute) = key.limits.requests_per_minute else {
            return Ok(());
        };
        let most = f64::from(per_minute.max(1));
        let per_second = most / 60.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets
            .entry(key.id.clone())
            .or_insert(Bucket { tokens: most, at: now });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * per_second).min(most);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - b.tokens) / per_second).ceil().max(1.0) as u64;
        Err(ApiError::new(
            ErrorCode::RateLimited,
            format!("this key may make {per_minute} requests a minute: wait {wait} s"),
        )
        .retry_after(wait))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::keys::Limits;

    #[test]
    fn a_burst_of_the_rate_then_one_a_period() {
        let key = KeyInfo {
            id: "k".into(),
            name: "k".into(),
            admin: false,
            limits: Limits {
                requests_per_minute: Some(6),
                ..Default::default()
            },
            created_ms: 0,
        };
        let rates = Rates::default();
        let t0 = Instant::now();
        for _ in 0..6 {
            assert!(rates.take_at(&key, t0).is_ok());
        }
        let e = rates.take_at(&key, t0).unwrap_err();
        assert_eq!(e.code(), ErrorCode::RateLimited);
        assert!(e.message().contains("wait 10 s"), "{}", e.message());
        assert!(rates.take_at(&key, t0 + Duration::from_secs(9)).is_err());
        assert!(rates.take_at(&key, t0 + Duration::from_secs(10)).is_ok());
        let unlimited = KeyInfo {
            limits: Limits::default(),
            ..key
        };
        for _ in 0..100 {
            assert!(rates.take_at(&unlimited, t0).is_ok());
        }
    }
}
