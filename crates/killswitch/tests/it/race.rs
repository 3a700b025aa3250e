//! DISABLE arriving between `pre_side_effect` and the backend commit: the commit must be rejected,
//! every time, over 1000 randomized interleavings (which target, which admin connection, extra
//! re-enable, a backend transaction opened before the DISABLE, redemption in the shared database
//! or over HTTPS, random pauses).

use std::time::Duration;

use palisade_killswitch::authority::{AuthorityDb, redeem_commit_token};
use palisade_killswitch::{CommitFence, TargetDigest, TargetKind, TargetValues};
use sqlx::SqlitePool;

use crate::fixture::{CHECKOUT, RELEASE, World, now_ms};

const ITERATIONS: u64 = 1000;

/// xorshift64*: a reproducible sequence from a logged seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

async fn pause(rng: &mut Rng) {
    match rng.below(4) {
        0 => {}
        1 => tokio::task::yield_now().await,
        2 => tokio::time::sleep(Duration::from_micros(rng.below(300))).await,
        _ => tokio::time::sleep(Duration::from_millis(1)).await,
    }
}

/// The backend's commit: the order row and every fence redemption in one transaction.
async fn commit(backend: &SqlitePool, fence: &CommitFence, iteration: u64) -> Result<(), String> {
    let mut transaction = backend.begin_with("BEGIN IMMEDIATE").await.map_err(|error| error.to_string())?;
    sqlx::query("INSERT INTO orders (iteration) VALUES (?1)")
        .bind(i64::try_from(iteration).unwrap())
        .execute(&mut *transaction)
        .await
        .map_err(|error| error.to_string())?;
    for request in fence.redeem_requests() {
        redeem_commit_token(&mut transaction, &request, now_ms()).await.map_err(|error| error.to_string())?;
    }
    transaction.commit().await.map_err(|error| error.to_string())
}

/// A backend transaction that began (and read) before the DISABLE, and commits after it.
async fn commit_with_early_snapshot(
    backend: &SqlitePool,
    fence: &CommitFence,
    iteration: u64,
    disable: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let mut transaction = backend.begin().await.map_err(|error| error.to_string())?;
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&mut *transaction).await.unwrap();
    disable.await;
    sqlx::query("INSERT INTO orders (iteration) VALUES (?1)")
        .bind(i64::try_from(iteration).unwrap())
        .execute(&mut *transaction)
        .await
        .map_err(|error| error.to_string())?;
    for request in fence.redeem_requests() {
        redeem_commit_token(&mut transaction, &request, now_ms()).await.map_err(|error| error.to_string())?;
    }
    transaction.commit().await.map_err(|error| error.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_between_pre_side_effect_and_commit_always_rejects_the_commit() {
    let world = World::new().await;
    let database = world.authority.db_path.to_str().unwrap().to_owned();
    // The backend shares the authority's database (its own pool); a second admin process too.
    let backend = AuthorityDb::open(&database).await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, iteration INTEGER NOT NULL)")
        .execute(backend.pool())
        .await
        .unwrap();
    let other_admin = AuthorityDb::open(&database).await.unwrap();
    let client = world.client();
    let key = world.target_key();

    let mut seed_bytes = [0_u8; 8];
    aws_lc_rs::rand::fill(&mut seed_bytes).unwrap();
    let seed = u64::from_le_bytes(seed_bytes) | 1;
    println!("race seed {seed}");
    let mut rng = Rng(seed);
    let mut modes = [0_u32; 4];

    // Control: without a DISABLE the same commit succeeds (the check can tell the difference).
    let targets = TargetValues::new().with(TargetKind::ServerRelease, RELEASE).with(TargetKind::Tool, "control");
    let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    let fence = world.kill_switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap();
    commit(backend.pool(), &fence, u64::MAX >> 2).await.expect("an undisturbed commit succeeds");

    for iteration in 0..ITERATIONS {
        let tool = format!("tool-{iteration}");
        let targets =
            TargetValues::new().with(TargetKind::ServerRelease, RELEASE).with(TargetKind::Tool, tool.as_str());
        let clearance = world.kill_switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
        pause(&mut rng).await;
        let fence = world.kill_switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap();
        assert_eq!(fence.tokens().len(), 2);

        let victim: TargetDigest = if rng.below(2) == 0 {
            key.digest(TargetKind::ServerRelease, RELEASE)
        } else {
            key.digest(TargetKind::Tool, &tool)
        };
        let admin = if rng.below(2) == 0 { &world.authority.db } else { &other_admin };
        let mode = rng.below(4);
        modes[usize::try_from(mode).unwrap()] += 1;
        pause(&mut rng).await;
        let result = match mode {
            // DISABLE, then the commit.
            0 => {
                admin.disable(&victim, "race", now_ms()).await.unwrap();
                pause(&mut rng).await;
                commit(backend.pool(), &fence, iteration).await
            }
            // DISABLE and a newer re-enable, then the commit: the token's generation is gone.
            1 => {
                admin.disable(&victim, "race", now_ms()).await.unwrap();
                pause(&mut rng).await;
                admin.enable(&victim, "race-over", now_ms()).await.unwrap();
                commit(backend.pool(), &fence, iteration).await
            }
            // The backend transaction began before the DISABLE and commits after it.
            2 => {
                let delay = rng.below(300);
                commit_with_early_snapshot(backend.pool(), &fence, iteration, async {
                    tokio::time::sleep(Duration::from_micros(delay)).await;
                    admin.disable(&victim, "race", now_ms()).await.unwrap();
                })
                .await
            }
            // DISABLE, then redemption over HTTPS.
            _ => {
                admin.disable(&victim, "race", now_ms()).await.unwrap();
                pause(&mut rng).await;
                let mut outcome = Ok(());
                for request in fence.redeem_requests() {
                    if let Err(error) = client.redeem(&request).await {
                        outcome = Err(error.to_string());
                        break;
                    }
                }
                outcome
            }
        };
        assert!(result.is_err(), "seed {seed}, iteration {iteration}, mode {mode}: the commit went through");
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE iteration = ?1")
            .bind(i64::try_from(iteration).unwrap())
            .fetch_one(backend.pool())
            .await
            .unwrap();
        assert_eq!(orders, 0, "seed {seed}, iteration {iteration}: an order was written");
        // The server refuses the target until it is enabled again with a newer generation.
        if world.authority.db.target_status(&victim).await.unwrap().state == palisade_killswitch::TargetState::Disable {
            world.authority.db.enable(&victim, "race-over", now_ms()).await.unwrap();
        }
    }
    assert!(modes.iter().all(|count| *count > 100), "every interleaving ran: {modes:?}");
}

const ROUNDS: u64 = 1000;
const CALLERS: usize = 4;

/// Gets a fence through both phases (batched with the other callers of the round).
async fn fenced(switch: palisade_killswitch::KillSwitch, targets: TargetValues) -> CommitFence {
    let clearance = switch.pre_dispatch(CHECKOUT, &targets).await.unwrap();
    switch.pre_side_effect(CHECKOUT, &targets, &clearance).await.unwrap()
}

/// Commits each fence concurrently; returns how many went through.
async fn commit_all(backend: &SqlitePool, fences: Vec<CommitFence>, round: u64) -> (u64, u64) {
    let mut tasks = Vec::new();
    for fence in fences {
        let backend = backend.clone();
        tasks.push(tokio::spawn(async move { commit(&backend, &fence, round).await }));
    }
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    (ok, refused)
}

/// 1000 DISABLE flips, each between `pre_side_effect` and the commit of concurrent callers
/// holding fences on the same targets: every commit before the flip goes through, every commit
/// after it is rejected. The counts are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_flips_with_concurrent_callers_reject_every_commit_after_the_flip_and_none_before() {
    let world = World::new().await;
    let database = world.authority.db_path.to_str().unwrap().to_owned();
    let backend = AuthorityDb::open(&database).await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, iteration INTEGER NOT NULL)")
        .execute(backend.pool())
        .await
        .unwrap();
    let other_admin = AuthorityDb::open(&database).await.unwrap();
    let key = world.target_key();
    let targets = TargetValues::new().with(TargetKind::ServerRelease, RELEASE).with(TargetKind::Tool, "shared");
    let victims = [key.digest(TargetKind::ServerRelease, RELEASE), key.digest(TargetKind::Tool, "shared")];

    let mut seed_bytes = [0_u8; 8];
    aws_lc_rs::rand::fill(&mut seed_bytes).unwrap();
    let seed = u64::from_le_bytes(seed_bytes) | 1;
    let mut rng = Rng(seed);
    let (mut before_ok, mut before_refused, mut after_ok, mut after_refused) = (0_u64, 0_u64, 0_u64, 0_u64);
    let batches_at_start = world.kill_switch.batch_stats().unwrap();
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for _ in 0..CALLERS {
            tasks.push(tokio::spawn(fenced(world.kill_switch.clone(), targets.clone())));
        }
        let mut fences = Vec::new();
        for task in tasks {
            fences.push(task.await.unwrap());
        }
        let split = usize::try_from(rng.below(CALLERS as u64 + 1)).unwrap();
        let after = fences.split_off(split);
        let (ok, refused) = commit_all(backend.pool(), fences, round).await;
        before_ok += ok;
        before_refused += refused;

        let victim = &victims[usize::try_from(rng.below(2)).unwrap()];
        let admin = if rng.below(2) == 0 { &world.authority.db } else { &other_admin };
        admin.disable(victim, "flip", now_ms()).await.unwrap();
        pause(&mut rng).await;
        let (ok, refused) = commit_all(backend.pool(), after, round).await;
        after_ok += ok;
        after_refused += refused;
        admin.enable(victim, "flip-over", now_ms()).await.unwrap();
    }
    let batches_at_end = world.kill_switch.batch_stats().unwrap();
    println!(
        "fence race (seed {seed}): {ROUNDS} flips, {CALLERS} callers per flip; before the flip {before_ok} committed, \
         {before_refused} rejected; after the flip {after_ok} committed, {after_refused} rejected; \
         {} batches carried {} queries",
        batches_at_end.0 - batches_at_start.0,
        batches_at_end.1 - batches_at_start.1
    );
    assert_eq!(after_ok, 0, "seed {seed}: a commit after the flip went through");
    assert_eq!(before_refused, 0, "seed {seed}: a commit before the flip was rejected");
    assert_eq!(before_ok + after_refused, ROUNDS * CALLERS as u64);
    assert!(before_ok > 0 && after_refused > 0);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(backend.pool()).await.unwrap();
    assert_eq!(u64::try_from(orders).unwrap(), before_ok, "exactly the commits before the flips wrote an order");
}
