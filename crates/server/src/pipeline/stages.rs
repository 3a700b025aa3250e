//! The request path's stages as values: one struct per stage holding exactly the services it
//! uses, built once by [`crate::ServerBuilder::build`] and borrowed by every request.

use super::audit::Audit;
use super::authenticate::Authenticate;
use super::authorize::Authorize;
use super::classify::Classify;
use super::delegation::DelegationStage;
use super::dispatch::Dispatch;
use super::envelope::Envelope;
use super::handles::Handles;
use super::limits::Limits;
use super::policy::PolicyStage;
use super::session::Session;
use crate::killswitch::KillSwitchCheck;

/// Every stage of the request path, each with only its own services.
pub(crate) struct Stages {
    /// 1. envelope: whether tasks are served and the 2025-era versions accepted.
    pub(crate) envelope: Envelope,
    /// 2. authenticate: the authenticator.
    pub(crate) authenticate: Authenticate,
    /// 2b. session: the session service, the accepted versions and the clock.
    pub(crate) session: Session,
    /// 3. classify: nothing (the application snapshot is the request's).
    pub(crate) classify: Classify,
    /// 3b. delegation (and 6b, the budget): the delegation service, when there is one.
    pub(crate) delegation: DelegationStage,
    /// 3c. policy: the operator's policy set in force (none: the scope rules only).
    pub(crate) policy: PolicyStage,
    /// 3d. rate limits: the current limits (swapped whole), their counters and the clock.
    pub(crate) limits: Limits,
    /// 4. kill switch: the server's kill switch, when there is one.
    pub(crate) kill_switch: KillSwitchCheck,
    /// 5. authorize: the authenticator (its mode checks the scopes).
    pub(crate) authorize: Authorize,
    /// 6. handles: the handle service, when there is one.
    pub(crate) handles: Handles,
    /// 7. audit: the recorder every request's trail writes to.
    pub(crate) audit: Audit,
    /// 8. dispatch: what the handlers' requests use (see [`Dispatch`]).
    pub(crate) dispatch: Dispatch,
}
