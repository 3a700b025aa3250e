//! The request path's stages as values: one struct per stage holding exactly the services it
//! uses, built once by [`crate::ServerBuilder::build`] and borrowed by every request.

use super::audit::Audit;
use super::authenticate::Authenticate;

/// Every stage of the request path, each with only its own services.
pub(crate) struct Stages {
    /// 2. authenticate: the authenticator.
    pub(crate) authenticate: Authenticate,
    /// 7. audit: nothing (the request's trail carries the recorder).
    pub(crate) audit: Audit,
}
