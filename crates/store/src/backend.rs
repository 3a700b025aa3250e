//! What a store implementation written once needs from a backend: its database, its pools, its
//! SQL dialect (a shared `$n` statement as the backend sends it) and its task change notification;
//! and the schema check of a store opened without migrating it.

use std::future::Future;
use std::sync::OnceLock;

/// A statement both backends run, written once with `$n` placeholders; SQLite's `?n` text is
/// made on first use and kept.
pub(crate) struct Statement {
    text: &'static str,
    sqlite: OnceLock<String>,
}

impl Statement {
    pub(crate) const fn new(text: &'static str) -> Self {
        Statement { text, sqlite: OnceLock::new() }
    }

    /// The statement as written (PostgreSQL's own placeholders).
    pub(crate) fn dollar(&'static self) -> &'static str {
        self.text
    }

    /// The statement with every `$` rewritten to `?` (SQLite's `?n`).
    pub(crate) fn question(&'static self) -> &'static str {
        self.sqlite.get_or_init(|| self.text.replace('$', "?")).as_str()
    }
}

/// A store backend as the shared implementations see it.
pub(crate) trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// The sqlx database.
    type Db: sqlx::Database;

    /// The pool writes go through.
    fn writer(&self) -> &sqlx::Pool<Self::Db>;

    /// The pool reads go through (the writer's for a backend with one pool).
    fn reader(&self) -> &sqlx::Pool<Self::Db>;

    /// Opens a write transaction (SQLite's `BEGIN IMMEDIATE`: the write lock first).
    fn begin(&self) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error>> + Send;

    /// `statement` in this backend's placeholders.
    fn sql(statement: &'static Statement) -> &'static str;

    /// A statement built at run time with `$n` placeholders, in this backend's placeholders.
    fn built_sql(statement: String) -> String;

    /// The read of a row this write transaction goes on to change: `plain` on SQLite (the
    /// writer holds the database's write lock from `BEGIN IMMEDIATE`), `for_update` (the same read
    /// with `FOR UPDATE`) on PostgreSQL.
    fn locking_read(plain: &'static Statement, for_update: &'static Statement) -> &'static str;

    /// Announces a task change inside `transaction` (delivered at commit): PostgreSQL's
    /// `pg_notify` to every instance's listener; nothing on SQLite, where the server's own bus
    /// sees every change.
    fn notify_task(
        &self,
        transaction: &mut sqlx::Transaction<'static, Self::Db>,
        digest: &[u8],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The digests of tasks changed on any instance, when the backend can push them
    /// (`TaskStore::task_changes`); `None` for a single-process backend.
    fn watch_tasks(&self) -> Option<tokio::sync::mpsc::Receiver<[u8; 32]>> {
        None
    }

    /// How many rows a statement changed.
    fn rows_affected(done: &<Self::Db as sqlx::Database>::QueryResult) -> u64;
}

/// The applied migrations of a store opened for reading.
static APPLIED: Statement = Statement::new("SELECT max(version) FROM _sqlx_migrations WHERE success");

/// Checks, without changing anything, that the store's schema is the one `migrator` brings it
/// to: a store never migrated, or migrated by an older or newer binary, is
/// [`StoreError::Config`] saying which (a reader must not guess at columns).
pub(crate) async fn check_schema<B: Backend>(
    pool: &sqlx::Pool<B::Db>,
    migrator: &sqlx::migrate::Migrator,
) -> Result<(), crate::StoreError>
where
    for<'c> &'c sqlx::Pool<B::Db>: sqlx::Executor<'c, Database = B::Db>,
    <B::Db as sqlx::Database>::Arguments: sqlx::IntoArguments<B::Db>,
    for<'r> (Option<i64>,): sqlx::FromRow<'r, <B::Db as sqlx::Database>::Row>,
{
    let expected = migrator.iter().map(|migration| migration.version).max().unwrap_or(0);
    let applied: Result<(Option<i64>,), sqlx::Error> = sqlx::query_as(B::sql(&APPLIED)).fetch_one(pool).await;
    let applied = match applied {
        Ok((applied,)) => applied,
        // No migration table (PostgreSQL's undefined_table, SQLite's generic error): a database
        // this software never set up.
        Err(sqlx::Error::Database(error)) if matches!(error.code().as_deref(), Some("42P01" | "1")) => None,
        Err(error) => return Err(crate::StoreError::from_sqlx("schema check", error)),
    };
    let reason = match applied {
        Some(applied) if applied == expected => return Ok(()),
        None => "it holds no palisade schema (a server of this version has never started on it)".to_owned(),
        Some(applied) if applied < expected => format!(
            "its schema is at migration {applied}, older than this binary's {expected}: start this version's server \
             once to migrate it"
        ),
        Some(applied) => {
            format!("its schema is at migration {applied}, newer than this binary's {expected}: use the newer binary")
        }
    };
    Err(crate::StoreError::Config { reason })
}
