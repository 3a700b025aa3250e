//! OAuth 2.1 resource-server checks (placeholder until the implementation lands).
