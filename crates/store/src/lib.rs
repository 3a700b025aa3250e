//! Durable storage (placeholder until the implementation lands).
