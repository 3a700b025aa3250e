//! The request path's audit writer and the checkpoint signer of a running server.

use std::sync::Arc;

use anyhow::Context as _;
use palisade_server::secret::ServerSecret;

use crate::settings::Settings;

/// The request path's audit writer on this instance's segment (recovering and shipping what an
/// earlier run left), and the checkpoint signer, which takes its turn under the writer's chain id.
pub async fn start(
    settings: &Settings,
    store: &Arc<dyn palisade_store::Store>,
    secret: &ServerSecret,
) -> anyhow::Result<(Arc<palisade_store::AuditWriter>, palisade_store::Checkpointer)> {
    let mut segment = palisade_store::segment::SegmentConfig::new(&settings.audit.segment_dir);
    segment.durability = settings.audit.durability;
    let writer = palisade_store::AuditWriter::with_segment(store.clone(), segment, Default::default())
        .await
        .with_context(|| format!("opening the audit segment {}", settings.audit.segment_dir.display()))?;
    let holder = writer.chain().unwrap_or_default().to_owned();
    let checkpointer = palisade_store::Checkpointer::spawn(
        store.clone(),
        secret.audit_checkpoint_key(),
        holder,
        std::time::Duration::from_secs(settings.audit.checkpoint_interval_secs),
    );
    Ok((Arc::new(writer), checkpointer))
}
