//! What `/readyz` asks of an application beyond the server's own dependencies, and the detail
//! document of the operator's private listener (`/readyz/detail`): the gateway is ready while at
//! least one upstream serves, and details each upstream's state.

use serde_json::Value;

/// An application's readiness, asked at every `/readyz` and by `/readyz/detail`.
pub trait Readiness: Send + Sync {
    /// `Ok` while the application can serve; else why not, in fixed words (the public `/readyz`
    /// answers them to anyone: no name, no address, no secret).
    fn ready(&self) -> Result<(), &'static str>;

    /// The detail for the operator's private listener: a JSON object whose fields join the
    /// server's own (`ready`, `reason`, `store`).
    fn detail(&self) -> Value;
}
