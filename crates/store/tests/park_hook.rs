//! A runtime built with `install_park_hook` and a file-backed SQLite store: the audit writer
//! commits on idle (its thread waits for a runtime thread to park, not for each record), and
//! every append still commits with the chain intact. A process of its own: the hook changes the
//! default writer configuration of the whole process.

use std::sync::Arc;
use std::time::Duration;

use palisade_store::conformance::sample_record;
use palisade_store::{AuditStore, AuditWriter, AuditWriterConfig, KICK_AT, SqliteStore, install_park_hook};

#[test]
fn appends_commit_when_the_runtime_goes_idle() {
    let directory = std::env::temp_dir().join(format!("palisade-park-hook-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("audit.db");
    let runtime =
        install_park_hook(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all()).build().unwrap();
    runtime.block_on(async {
        let config = AuditWriterConfig::default();
        assert_eq!(config.idle_wait, Some(Duration::from_millis(1)), "the hook makes commit on idle the default");
        let store = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
        // Only a park can wake this writer's thread in time: its longest wait is a minute, and
        // fewer than KICK_AT records are ever queued.
        let config = AuditWriterConfig { idle_wait: Some(Duration::from_secs(60)), ..config };
        let writer = Arc::new(AuditWriter::new(store.clone(), config));
        let tasks: Vec<_> = (0..KICK_AT as u64 - 1)
            .map(|n| {
                let writer = writer.clone();
                tokio::spawn(async move { writer.append(sample_record(n)).await })
            })
            .collect();
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("an append was not committed: nothing woke the writer's thread")
                .unwrap()
                .unwrap();
        }
        writer.shutdown().await;
        let report = store.verify_chain().await.unwrap();
        assert!(report.is_intact() && report.records == KICK_AT as u64 - 1, "{report:?}");
        store.close().await;
    });
    let _ = std::fs::remove_dir_all(&directory);
}
