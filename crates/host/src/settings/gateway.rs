//! The gateway's sections (`[gateway]`, `[pins]`, `[[upstreams]]`, `[web]`): validated by the
//! gateway crate for the gateway, refused for any other application.

use super::error::{ConfigError, bad};
use super::server::AppChoice;

/// The gateway's sections: validated for the gateway, refused for any other application (an
/// upstream configured for an application that ignores it is a mistake the operator must see).
pub fn validate(
    app: AppChoice,
    gateway: palisade_gateway::config::RawGateway,
    pins: palisade_gateway::config::RawPins,
    upstreams: Vec<palisade_gateway::config::RawUpstream>,
    web: Option<palisade_gateway::config::RawWeb>,
) -> Result<Option<palisade_gateway::config::GatewaySettings>, ConfigError> {
    if app != AppChoice::Gateway {
        if !upstreams.is_empty() {
            return Err(bad("upstreams", "only the gateway uses upstreams (app = \"gateway\" or `palisade gateway`)"));
        }
        if web.is_some() {
            return Err(bad("web", "only the gateway serves web pages (app = \"gateway\" or `palisade gateway`)"));
        }
        return Ok(None);
    }
    if upstreams.is_empty() {
        return Err(bad("upstreams", "the gateway needs at least one [[upstreams]] entry"));
    }
    palisade_gateway::config::validate(gateway, pins, upstreams, web)
        .map(Some)
        .map_err(|error| ConfigError { key: error.key, reason: error.reason })
}
